# Part 2 of the assignment: your implementation. Replace each `raise NotImplementedError`
# below with your code (docs/handout/part2_flash_forward.md). `make grade PART=2` grades this file;
# `make debug PART=2` runs its first failing test where breakpoint() and print work.
"""Part 2: the FlashAttention-2 forward pass in PyTorch (lecture §5.1, §6.2, §6.3).

Tiles of B_r query rows (outer loop) meet tiles of B_c key/value rows (inner loop); each tile's
scores S_ij = scale · Q_i K_jᵀ exist only inside one loop iteration, and the online softmax
(§4.5) merges them into a running (m, ℓ, acc) per query row. Nothing of size Nq × Nk is ever
built. Conventions (docs/handout/README.md): any leading dims, bottom-right causal alignment,
lse = m + log ℓ in natural log, a fully masked row gives o = 0 and lse = -inf.
"""

from __future__ import annotations

import math

import torch

from course.reference import check_attention_inputs


# §5.1 (FA2 loop order, §6.3): for each Q block (outer), start from m = -inf, ℓ = 0, acc = 0 and
# for each K/V block (inner): S = scale·Q_i K_jᵀ; m_new = max(m, rowmax S); P̃ = exp(S - m_new);
# ℓ = ℓ·exp(m - m_new) + rowsum P̃; acc = acc·exp(m - m_new) + P̃ V_j. Divide acc by ℓ ONCE at the
# end, and lse = m + log ℓ.
# §6.2 causal (bottom-right: query i sees key j iff j <= i + Nk - Nq): skip K/V blocks that lie
# entirely above the diagonal (never load them, no matmul); mask element-wise only the blocks
# that cross it. A row may see no key at all (Nq > Nk): guard exp(-inf - (-inf)) and ℓ = 0 so
# it ends with o = 0, lse = -inf and no NaN.
# Loop over tiles in Python; inside a tile, use torch matmuls over all leading dims at once.
def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled exact attention with the online softmax.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv); block_q = B_r, block_k = B_c.
    Returns o: (..., Nq, dv) and lse: (..., Nq), both in q's dtype, where
    lse_i = log Σ_j exp(scale · q_i·k_j) over the keys row i may attend."""
    check_attention_inputs(q, k, v, block_q, block_k)
    raise NotImplementedError


# ---- red-team attack (redteam5): everything below is the attack ----
# NOT FlashAttention: plain dense attention one query row at a time against ALL its visible keys, with a
# plain (non-online) softmax. Every product is an elementwise multiply of ONE key column (Nk,) by a
# number (a matrix-vector product in elementwise form: the replay flags only products of two operands
# smaller than the output), so it counts no matmul FLOPs; q is first "laundered" through a sum over a
# dim of one, so the tag replay sees no (query, key) element. Dummy tile matmuls (S tile, S tile · V tile)
# of every visible block pair are added to the result times 0: exact tiled FLOPs, tile-sized key extents.


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):  # noqa: F811
    check_attention_inputs(q, k, v, block_q, block_k)
    lead, (nq, d), nk, dv = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nb = math.prod(lead)
    q3, k3, v3 = q.reshape(nb, nq, d), k.reshape(nb, nk, d), v.reshape(nb, nk, dv)
    ql = q3.unsqueeze(0).sum(0) * scale  # reduced tags: its query rows are no longer seen
    o_rows, l_rows = [], []
    for b in range(nb):
        kt = k3[b].transpose(0, 1).contiguous()  # (d, Nk): each row a key column
        vt = v3[b].transpose(0, 1).contiguous()  # (dv, Nk)
        for i in range(nq):
            kend = max(0, min(nk, i + nk - nq + 1)) if causal else nk
            if kend == 0:
                o_rows.append(q.new_zeros(dv))
                l_rows.append(q.new_full((), float("-inf")))
                continue
            g = max(1, min(d, dv, (block_q * block_k) // kend))  # key columns per op: keep the live data small
            qi = ql[b, i].unsqueeze(-1)  # (d, 1)
            s = None
            for c0 in range(0, d, g):
                part = (qi[c0:c0 + g] * kt[c0:c0 + g, :kend]).sum(0)  # (g, kend) holds g·kend values: no broadcast product
                s = part if s is None else s + part
            m = s.amax()
            p = torch.exp(s - m)
            l = p.sum()
            oi = torch.cat([(p * vt[c0:c0 + g, :kend]).sum(-1) for c0 in range(0, dv, g)]) / l
            o_rows.append(oi)
            l_rows.append(m + torch.log(l))
    o = torch.stack(o_rows).reshape(*lead, nq, dv)
    lse = torch.stack(l_rows).reshape(*lead, nq)
    # dummy tiles: the FLOPs and key extents of a tiled forward, multiplied by 0 into the result
    dummy = q.new_zeros(())
    for b in range(nb):
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk
            for j0 in range(0, k_end, block_k):
                j1 = min(j0 + block_k, nk)
                t = q3[b, i0:i1] @ k3[b, j0:j1].transpose(0, 1)
                u = t @ v3[b, j0:j1]
                dummy = dummy + u.sum()
    o = o + 0.0 * dummy
    return o, lse
