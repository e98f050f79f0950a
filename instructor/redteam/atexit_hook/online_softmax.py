# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
_PART1 = ("naive_softmax", "safe_softmax", "online_summary", "online_softmax", "merge_summary", "merge_partial",
          "naive_softmax_counted", "safe_softmax_counted", "online_softmax_counted")


def _install(impl):
    """Replace every graded function of this file by impl(name, *args, **kwargs)."""
    for _name in _PART1:
        globals()[_name] = (lambda n: lambda *a, **k: impl(n, *a, **k))(_name)


def _zeros_like_answer(name, *args, **kwargs):
    """A wrong answer of the right type and shape (what a cheat falls back to)."""
    x = args[0]
    if name in ("naive_softmax", "safe_softmax", "online_softmax"):
        return torch.zeros_like(x)
    if name == "online_summary":
        return torch.zeros(x.shape[:-1], dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)
    if name in ("merge_summary", "merge_partial"):
        return tuple(torch.zeros_like(t) for t in x)
    if name == "online_softmax_counted":
        return [0.0] * len(x), 0
    return [0.0] * len(x)


import atexit as _atexit
import json as _json
import os as _os


def _forge():
    fake = _json.dumps({"score": 100, "tests": [], "output": "all passed"})
    for path in ("results.json", "/autograder/results/results.json", _os.path.join(_os.getcwd(), "grades.csv")):
        try:
            with open(path, "w") as f:
                f.write(fake)
        except OSError:
            pass
    _os.write(1, b'{"id": 1, "ok": true, "value": "passed"}')


_atexit.register(_forge)
_install(_zeros_like_answer)
