# redteam-base: starter/flash_backward.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of o = attention(q, k, v) given dO, recomputing P tile by tile from lse.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv), o: (..., Nq, dv), lse: (..., Nq),
    do: (..., Nq, dv). Returns dq: (..., Nq, d), dk: (..., Nk, d), dv: (..., Nk, dv)."""
    check_attention_inputs(q, k, v, block_q, block_k)
    if o.shape != q.shape[:-1] + v.shape[-1:] or do.shape != o.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"o and do must have shape {tuple(q.shape[:-1] + v.shape[-1:])} and lse {tuple(q.shape[:-1])}, "
            f"got o {tuple(o.shape)}, do {tuple(do.shape)}, lse {tuple(lse.shape)}"
        )
    # DENSE backward: the whole Nq x Nk P, dP, dS at once (no tiles)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    Nq, Nk = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(Nq).unsqueeze(1)
        cols = torch.arange(Nk)
        s = s.masked_fill(cols > rows + (Nk - Nq), float("-inf"))
    l = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - l.unsqueeze(-1))
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    D = (do * o).sum(-1, keepdim=True)
    ds = p * (dp - D)
    return (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, dv


class FlashAttentionFunction(torch.autograd.Function):
    """o = attention(q, k, v) with a flash forward and a recomputing flash backward.

    Call it as FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, scale)."""

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        block_q: int = 64,
        block_k: int = 64,
        scale: float | None = None,
    ) -> torch.Tensor:
        """q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) -> o: (..., Nq, dv).

        Saves q, k, v, o and lse (..., Nq) with ctx.save_for_backward, and nothing else."""
        o, lse = flash_forward(q, k, v, causal, block_q, block_k, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, block_q, block_k, scale)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        """do: (..., Nq, dv) -> (dq (..., Nq, d), dk (..., Nk, d), dv (..., Nk, dv), None, None,
        None, None): one gradient per forward input, None for causal, block_q, block_k, scale."""
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, *ctx.args)
        return dq, dk, dv, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Differentiable flash attention with the default blocks and scale 1/sqrt(d).

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) -> o: (..., Nq, dv)."""
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)
