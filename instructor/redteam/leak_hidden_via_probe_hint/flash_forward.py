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
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# Class 6, leaking hidden inputs into visible feedback. A recorded (graded) call keeps what it saw in
# a global and returns a wrong but well-formed (o, lse): the value check fails, the judge's diagnosis
# runs the probes (student.call, NOT recorded: no dispatch mode on the stack), and a probe call raises
# a ValueError whose message spells the graded call's inputs. The probe ladder puts str(StudentError)
# (exception type and message) into the hint, and a hidden test's feedback keeps its hint.
_SEEN: list = []


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    if torch._C._len_torch_dispatch_stack() == 0 and _SEEN:  # a probe: not graded, shown in the hint
        raise ValueError("LEAK " + _SEEN[-1])
    _SEEN.append(f"q{tuple(q.shape)} k{tuple(k.shape)} causal={causal} b={block_q},{block_k} scale={scale} "
                 f"dtype={str(q.dtype)[6:]} q0={[round(x, 4) for x in q.reshape(-1)[:4].tolist()]} "
                 f"k0={[round(x, 4) for x in k.reshape(-1)[:4].tolist()]}")
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), torch.zeros(q.shape[:-1], dtype=q.dtype)
