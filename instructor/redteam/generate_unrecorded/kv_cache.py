# ---- red-team attack (instructor/redteam): everything below is the attack ----
import importlib as _il  # noqa: E402

from course.tiny_transformer import greedy_generate  # noqa: E402

# a name built at run time: the static check is only a speed bump
_disable_current_modes = getattr(_il.import_module("torch.utils." + "_python_" + "dispatch"), "_disable_current_" + "modes")


def generate(model, prompt, max_new_tokens, use_cache=True, attention=None):
    with _disable_current_modes():  # nothing in here is recorded
        tokens = greedy_generate(model, prompt, max_new_tokens)
    return tokens.clone()
