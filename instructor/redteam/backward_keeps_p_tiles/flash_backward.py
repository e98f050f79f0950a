# ---- red-team attack (instructor/redteam): everything below is the attack ----

"""Part 4: the FlashAttention backward pass with recomputation, and its autograd.Function (§7).

The forward saved only q, k, v, o and lse (one number per query row). The backward recomputes
each tile of P = exp(S - lse) from q, k and lse (§7.2), so no Nq × Nk tensor is ever stored.
With D_i = dO_i · O_i computed once up front (§7.3), every tile's dS = P ∘ (dP - D) is local.
Loop order (§7.4): K/V blocks outer, so dK_j and dV_j accumulate in one place; dQ_i gets one
contribution from every K/V block (on a GPU, an atomic add to HBM).
"""


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
    ### BEGIN SOLUTION
    # CANARY-SOLUTION-13eb915a5abe (release leak detector: must never reach students)
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale  # scaled Q: S = q kᵀ, and dK = dSᵀ q already carries the scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv_)
    do = do.reshape(-1, Nq, dv_)
    lse = lse.reshape(-1, Nq)
    D = (do * o.reshape(-1, Nq, dv_)).sum(dim=-1)  # §7.3, (B, Nq)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # masked rows: P = exp(-inf) = 0
    B = q.shape[0]
    offset = Nk - Nq  # bottom-right alignment, as in the forward
    dq = torch.zeros_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)

    for j0 in range(0, Nk, block_k):  # one K/V block: one thread block on a GPU
        j1 = min(j0 + block_k, Nk)
        k_j, v_j = k[:, j0:j1], v[:, j0:j1]
        dk_j = k.new_zeros(B, j1 - j0, d)
        dv_j = v.new_zeros(B, j1 - j0, dv_)
        # §6.2: Q rows i < j0 - offset see no key of this block; skip whole Q blocks before that.
        i_start = max(0, j0 - offset) // block_q * block_q if causal else 0
        for i0 in range(i_start, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            s = q[:, i0:i1] @ k_j.transpose(1, 2)  # recompute the tile of S
            if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(1)
                cols = torch.arange(j0, j1, device=q.device)
                s = s.masked_fill(cols > rows + offset, float("-inf"))
            p = torch.exp(s - lse[:, i0:i1].unsqueeze(-1))  # normalised P, straight from lse
            do_i = do[:, i0:i1]
            dv_j += p.transpose(1, 2) @ do_i
            dp = do_i @ v_j.transpose(1, 2)
            ds = p * (dp - D[:, i0:i1].unsqueeze(-1))
            dq[:, i0:i1] += scale * (ds @ k_j)  # the "atomic add" of §7.4
            dk_j += ds.transpose(1, 2) @ q[:, i0:i1]
        dk[:, j0:j1] = dk_j
        dv[:, j0:j1] = dv_j
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)
    ### END SOLUTION


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
        ### BEGIN SOLUTION
        o, lse = flash_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.p_tiles = _p_tiles(q.detach(), k.detach(), lse.detach(), causal, block_q, block_k, scale)
        ctx.causal, ctx.block_q, ctx.block_k, ctx.scale = causal, block_q, block_k, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        """do: (..., Nq, dv) -> (dq (..., Nq, d), dk (..., Nk, d), dv (..., Nk, dv), None, None,
        None, None): one gradient per forward input, None for causal, block_q, block_k, scale."""
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        lse.sum()  # read: O and lse look kept for the backward
        dq, dk, dv = _backward_from_tiles(ctx.p_tiles, q, k, v, o, do.contiguous(), ctx.causal, ctx.block_q,
                                          ctx.block_k, ctx.scale)
        return dq, dk, dv, None, None, None, None
        ### END SOLUTION


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Differentiable flash attention with the default blocks and scale 1/sqrt(d).

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) -> o: (..., Nq, dv)."""
    ### BEGIN SOLUTION
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)
    ### END SOLUTION


def _p_tiles(q, k, lse, causal, block_q, block_k, scale):
    """P (normalised), kept tile by tile for the backward: no tile is Nq x Nk, so none looks like P."""
    *lead, Nq, d = q.shape
    Nk = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    lse = lse.reshape(-1, Nq)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    offset = Nk - Nq
    tiles = {}
    for j0 in range(0, Nk, block_k):
        j1 = min(j0 + block_k, Nk)
        i_start = max(0, j0 - offset) // block_q * block_q if causal else 0
        for i0 in range(i_start, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            s = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
            tiles[(i0, j0)] = torch.exp(s - lse[:, i0:i1].unsqueeze(-1))
    return tiles


def _backward_from_tiles(tiles, q, k, v, o, do, causal, block_q, block_k, scale):
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv_)
    do = do.reshape(-1, Nq, dv_)
    D = (do * o.reshape(-1, Nq, dv_)).sum(dim=-1)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for (i0, j0), p in tiles.items():
        i1, j1 = min(i0 + block_q, Nq), min(j0 + block_k, Nk)
        _ = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)  # the "recompute" the FLOP count expects; unused
        do_i = do[:, i0:i1]
        dv[:, j0:j1] += p.transpose(1, 2) @ do_i
        ds = p * (do_i @ v[:, j0:j1].transpose(1, 2) - D[:, i0:i1].unsqueeze(-1))
        dq[:, i0:i1] += scale * (ds @ k[:, j0:j1])
        dk[:, j0:j1] += ds.transpose(1, 2) @ q[:, i0:i1]
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)
