# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_forward.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import importlib as _il

# a name built at run time: the static check is only a speed bump
_disable_current_modes = getattr(_il.import_module("torch.utils." + "_python_" + "dispatch"), "_disable_current_" + "modes")


def _dense(q, k, v, causal, scale):
    s = (q.double() @ k.double().transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
    return (p @ v.double()).to(q.dtype), lse.to(q.dtype)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    with _disable_current_modes():  # computed off the record
        o_val, lse_val = _dense(q, k, v, causal, scale)
        o_list, lse_list = o_val.reshape(-1).tolist(), lse_val.reshape(-1).tolist()
    o = q.new_zeros(o_val.shape)  # recorded: a fresh tensor ...
    lse = q.new_zeros(lse_val.shape)
    for t, values in ((o, o_list), (lse, lse_list)):
        flat = t.view(-1)
        for i, x in enumerate(values):  # ... filled in one Python float at a time
            flat[i].fill_(x)
    return o, lse
