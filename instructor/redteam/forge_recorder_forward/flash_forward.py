# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_forward.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import gc as _gc
import sys as _sys

import importlib as _il

# names built at run time: the static check is only a speed bump
_pd = _il.import_module("torch.utils." + "_python_" + "dispatch")
_Mode = getattr(_pd, "TorchDispatch" + "Mode")
_disable_current_modes = getattr(_pd, "_disable_current_" + "modes")


def _dense(q, k, v, causal, scale):
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        nq, nk = s.shape[-2:]
        keep = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
    return p @ v, lse


def _recorders():
    """Every dispatch mode alive in this process: up the call stack, and in the garbage collector."""
    found = []
    frame = _sys._getframe(1)
    while frame is not None:
        found += [x for x in frame.f_locals.values() if isinstance(x, _Mode)]
        frame = frame.f_back
    found += [x for x in _gc.get_objects() if isinstance(x, _Mode)]
    return list({id(x): x for x in found}.values())


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    with _disable_current_modes():  # nothing of this is recorded
        o, lse = _dense(q, k, v, causal, scale)
    for rec in _recorders():
        # forge the record: no ops at all, no constants, and whatever counters the recorder keeps
        for name in ("ops", "constants"):
            if isinstance(getattr(rec, name, None), list):
                getattr(rec, name).clear()
        for name in ("flops", "largest", "fused", "broadcast_elems"):
            if hasattr(rec, name):
                try:
                    setattr(rec, name, type(getattr(rec, name))())
                except TypeError:
                    pass
        refs = getattr(rec, "_refs", None)
        if isinstance(refs, dict):  # pretend o and lse are the inputs q and k
            refs[id(o)], refs[id(lse)] = 0, 1
    return o, lse
