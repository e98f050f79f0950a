# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_forward.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import importlib as _il

_F = _il.import_module("torch.nn." + "functional")
_sdpa = getattr(_F, "scaled_dot_" + "product_attention")
_ref = getattr(_il.import_module("course." + "reference"), "attention_" + "reference")


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    nq, nk = q.shape[-2], k.shape[-2]
    mask = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq) if causal else None
    o = _sdpa(q, k, v, attn_mask=mask, scale=scale)
    _, lse = _ref(q, k, v, causal, scale)
    return torch.nan_to_num(o), lse.to(q.dtype)
