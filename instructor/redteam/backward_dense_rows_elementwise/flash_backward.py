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
        ctx.causal, ctx.block_q, ctx.block_k, ctx.scale = causal, block_q, block_k, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        """do: (..., Nq, dv) -> (dq (..., Nq, d), dk (..., Nk, d), dv (..., Nk, dv), None, None,
        None, None): one gradient per forward input, None for causal, block_q, block_k, scale."""
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(
            q, k, v, o, lse, do.contiguous(), causal=ctx.causal, block_q=ctx.block_q, block_k=ctx.block_k,
            scale=ctx.scale,
        )
        return dq, dk, dv, None, None, None, None
        ### END SOLUTION


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Differentiable flash attention with the default blocks and scale 1/sqrt(d).

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) -> o: (..., Nq, dv)."""
    ### BEGIN SOLUTION
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)
    ### END SOLUTION


# ---- red-team attack (redteam5): everything below is the attack ----
# NOT a tiled backward: dense per-query-row gradients against ALL visible keys. Every product is a
# matrix-vector product in elementwise form (a broadcast vector times a FULL operand of the output's
# size, which the replay does not flag) or an outer product whose broadcast factor was materialised by
# `* 1.0` (no bound on its distinct values is followed through an elementwise op). q, dO, o, lse are
# laundered through a sum over a dim of one, so the tag replay sees no (query, key) element. Dummy tile
# matmuls (5 per visible block pair) times 0 give the FLOPs of a tiled backward.


def flash_backward(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None):  # noqa: F811
    check_attention_inputs(q, k, v, block_q, block_k)
    if o.shape != q.shape[:-1] + v.shape[-1:] or do.shape != o.shape or lse.shape != q.shape[:-1]:
        raise ValueError("o, do, lse shapes")
    *lead, nq, d = q.shape
    nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nb = math.prod(lead)
    q3, k3, v3 = q.reshape(nb, nq, d), k.reshape(nb, nk, d), v.reshape(nb, nk, dv_)
    do3, o3, l2 = do.reshape(nb, nq, dv_), o.reshape(nb, nq, dv_), lse.reshape(nb, nq)
    ql = q3.unsqueeze(0).sum(0) * scale
    dol = do3.unsqueeze(0).sum(0)
    D = (dol * o3.unsqueeze(0).sum(0)).sum(-1)
    ll = l2.unsqueeze(0).sum(0)
    ll = torch.where(torch.isneginf(ll), torch.zeros_like(ll), ll)
    dkT = q.new_zeros(nb, d, nk)
    dvT = q.new_zeros(nb, dv_, nk)
    dq_rows = []
    for b in range(nb):
        kt = k3[b].transpose(0, 1).contiguous()
        vt = v3[b].transpose(0, 1).contiguous()
        for i in range(nq):
            kend = max(0, min(nk, i + nk - nq + 1)) if causal else nk
            if kend == 0:
                dq_rows.append(q.new_zeros(d))
                continue
            g = max(1, min(d, dv_, (block_q * block_k) // kend))
            qi = ql[b, i].unsqueeze(-1)
            doi = dol[b, i].unsqueeze(-1)
            s = None
            for c0 in range(0, d, g):
                part = (qi[c0:c0 + g] * kt[c0:c0 + g, :kend]).sum(0)
                s = part if s is None else s + part
            p = torch.exp(s - ll[b, i])
            dp = None
            for c0 in range(0, dv_, g):
                part = (doi[c0:c0 + g] * vt[c0:c0 + g, :kend]).sum(0)
                dp = part if dp is None else dp + part
            ds = p * (dp - D[b, i])
            dq_rows.append(torch.cat([(ds * kt[c0:c0 + g, :kend]).sum(-1) for c0 in range(0, d, g)]) * scale)
            for c0 in range(0, d, g):
                c1 = min(c0 + g, d)
                dkT[b, c0:c1, :kend] += qi[c0:c1] * (ds.expand(c1 - c0, kend) * 1.0)
            for c0 in range(0, dv_, g):
                c1 = min(c0 + g, dv_)
                dvT[b, c0:c1, :kend] += doi[c0:c1] * (p.expand(c1 - c0, kend) * 1.0)
    dq = torch.stack(dq_rows).reshape(*lead, nq, d)
    dummy = q.new_zeros(())
    for b in range(nb):
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk
            for j0 in range(0, k_end, block_k):
                j1 = min(j0 + block_k, nk)
                qb, kb, vb, db = q3[b, i0:i1], k3[b, j0:j1], v3[b, j0:j1], do3[b, i0:i1]
                t = qb @ kb.transpose(0, 1)
                dummy = dummy + (t.transpose(0, 1) @ db).sum() + (db @ vb.transpose(0, 1)).sum() \
                    + (t @ kb).sum() + (t.transpose(0, 1) @ qb).sum()
    dq = dq + 0.0 * dummy
    dk = dkT.transpose(-1, -2).reshape(*lead, nk, d)
    dv = dvT.transpose(-1, -2).reshape(*lead, nk, dv_)
    return dq, dk, dv
