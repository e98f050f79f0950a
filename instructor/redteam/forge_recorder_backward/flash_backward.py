# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_backward.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import gc as _gc

import importlib as _il

# names built at run time: the static check is only a speed bump
_pd = _il.import_module("torch.utils." + "_python_" + "dispatch")
_Mode = getattr(_pd, "TorchDispatch" + "Mode")
_disable_current_modes = getattr(_pd, "_disable_current_" + "modes")


def _dense_grads(q, k, v, do, causal, scale):
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if causal:
            nq, nk = s.shape[-2:]
            s = s.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1))
        return torch.autograd.grad(p @ v, (q, k, v), do)


def _forge(*tensors):
    for rec in {id(x): x for x in _gc.get_objects() if isinstance(x, _Mode)}.values():
        if isinstance(getattr(rec, "ops", None), list):
            rec.ops.clear()
        refs = getattr(rec, "_refs", None)
        if isinstance(refs, dict):
            for i, t in enumerate(tensors):
                refs[id(t)] = i


def flash_backward(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None):
    with _disable_current_modes():
        grads = _dense_grads(q, k, v, do, causal, scale)
    _forge(*grads)
    return grads


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=64, block_k=64, scale=None):
        from .flash_forward import flash_forward

        o, lse = flash_forward(q, k, v, causal, block_q, block_k, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*flash_backward(q, k, v, o, lse, do, ctx.causal, 64, 64, ctx.scale), None, None, None, None)


def flash_attention(q, k, v, causal=False):
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)
