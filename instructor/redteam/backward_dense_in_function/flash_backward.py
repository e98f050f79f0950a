# Part 4 of the assignment: your implementation. Replace each `raise NotImplementedError`
# below with your code (docs/handout/part4_flash_backward.md). `make grade PART=4` grades this file;
# `make debug PART=4` runs its first failing test where breakpoint() and print work.
"""Part 4: the FlashAttention backward pass with recomputation, and its autograd.Function (§7).

The forward saved only q, k, v, o and lse (one number per query row). The backward recomputes
each tile of P = exp(S - lse) from q, k and lse (§7.2), so no Nq × Nk tensor is ever stored.
With D_i = dO_i · O_i computed once up front (§7.3), every tile's dS = P ∘ (dP - D) is local.
Loop order (§7.4): K/V blocks outer, so dK_j and dV_j accumulate in one place; dQ_i gets one
contribution from every K/V block (on a GPU, an atomic add to HBM).
"""

from __future__ import annotations

import math

import torch

from course.reference import check_attention_inputs

from .flash_forward import flash_forward


# §7.3: D_i = rowsum(dO ∘ O), once, before the loops. Guard the fully masked rows: their lse is
# -inf, and exp(S - lse) = exp(-inf - (-inf)) would be NaN; their P (and every gradient they
# feed) must be 0.
# §7.4 loop order: for each K/V block j (outer; dK_j = dV_j = 0 on chip), for each Q block i
# (inner) that is not entirely above the causal diagonal (skip it as in the forward, §6.2):
#   S = scale·Q_i K_jᵀ (masked where it crosses the diagonal); P = exp(S - lse_i)
#   dV_j += Pᵀ dO_i;  dP = dO_i V_jᵀ;  dS = P ∘ (dP - D_i)
#   dQ_i += scale · dS K_j   (accumulate across K/V blocks: never overwrite)
#   dK_j += scale · dSᵀ Q_i
# That is 5 tile matmuls against the forward's 2: exactly 2.5x the forward's FLOPs.
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


# §7.2, §7.7: forward runs flash_forward and saves ONLY q, k, v, o and lse with
# ctx.save_for_backward (never P); keep causal, the block sizes and scale on ctx. backward calls
# flash_backward and returns one gradient per forward input (None for the non-tensor ones).
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
