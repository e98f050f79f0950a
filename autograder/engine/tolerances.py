"""Every tolerance rule of the assignment tests, in one place, each with its rounding argument.

u = eps/2 is the unit roundoff of the result's dtype (float32: 6.0e-8, float64: 1.1e-16).

1. The plain-error rule (values of parts 2, 3, 4, 6 against course.reference's float64 attention):
       max|actual - expected| <= factor · max|plain - expected| + atol
   where `plain` is the same math in the input dtype (course.reference.attention_plain). This is
   FlashAttention's own rule. A tiled forward reorders the row sums of P̃ and P̃V into per-block
   partial sums and rescales them by exp(m_old - m_new) once per K/V block: every entry of o and
   lse is a sum of the same Nk terms as plain's, with at most ⌈Nk/B_c⌉ extra roundings of the
   running (ℓ, acc). Measured on this course's code, correct tiled code sits at 0.55-1.3× plain's
   error, the known bugs at 10^5-10^7×. FORWARD_FACTOR = 2 for o and lse.
   Gradients: dS = P ∘ (dP - D) subtracts two nearly equal O(1) terms and P is recomputed from the
   given (rounded) L, so a correct backward's error is up to ~2× plain's; GRADIENT_FACTOR = 3.
   Each entry may also be off by ROUNDING_EPS·eps·|expected| (4 eps: 2 to 4 ulp of the value): its
   own final rounding (u), lse = m + log ℓ rounding twice, and a summation order other than
   plain's (a row at a time with mv, say) can leave a large entry 1.6 ulp off while plain's max
   error happened to fall below that. Every catalogued bug is off by more than 1e-4 relative.
2. atol: DEFAULT_ATOL = 1e-6 in float32 (the plain error of an entry that happens to be exact is 0;
   1e-6 is 17 u on O(1) values). FLOAT64_ATOL = 1e-10 in float64: reordering n additions changes a
   float64 sum by at most n·u relative (1e-13 for n = 1000 on O(1) values), 1000× headroom, while
   every catalogued bug is off by more than 1e-4.
3. Softmax (part 1, any summation order): |Δp| <= atol + softmax_rtol(n)·p with
   softmax_rtol = 4(n+2)·eps = 8(n+2)·u: recursive summation of n positive terms is (n-1)·u
   relative, exp ~u per term, each rebase ~2u, the division u.
4. online_summary's ℓ: the same sequential-sum bound, summary_rtol(n) = 4(n+2)·eps, atol 0; its m
   (a maximum) is exact: atol = rtol = 0.
5. ⊕ of two summaries: 2 exps, 2 products and 1 sum of positive terms; the rounding of m_a - m adds at
   most u·|Δ|·e^(-Δ) <= u/e relative. MERGE_RTOL = 64·eps on ℓ, and for o (mixed signs) the same bound
   on the absolute error scaled by max(|o_a|·α + |o_b|·β) (α = e^(m_a−m), β = e^(m_b−m)). Per ⊕ of
   a chain: each ⊕ is a positive combination of its inputs, so relative errors add.
5b. ⊕ against the DATA (part 1's merge checks; the judge holds no ⊕): the judge summarises the
   segments x[..., :s], x[..., s:] of dtype-representable scores in float64 and rounds each (m, ℓ)
   or (m, ℓ, o) to dtype; the expected value is the float64 summary of the whole rows (k ⊕ of k + 1
   segments: the summary of their concatenation).
   m: a maximum of representable values is exact, and max(m_a, m_b) is the max of the whole row:
   atol = rtol = 0.
   ℓ: the exact ⊕ of the given inputs is ℓ_a·α + ℓ_b·β with α, β exact functions of exact maxima,
   positive terms. One rounding of each of ℓ_a, ℓ_b (<= u relative) moves it by <= u·ℓ; each float64
   summary the judge made (every segment, and the whole row) is within rule 4's summary_rtol(n,
   float64) of its exact value, which moves the comparison by <= 2·summary_rtol(n, float64)·ℓ (the
   segments' errors enter as a positive combination, the whole row's directly); the student's k ⊕s
   add k·MERGE_RTOL (rule 5). merge_data_rtol(n, dtype, k) = k·MERGE_EPS·eps + u + 2·summary_rtol(n,
   float64), n the columns of the whole rows.
   o (mixed signs): the same factor as an absolute bound, scaled by max Σ_j e^(x_j−m)·|v_j| over the
   whole rows (merge_data_scale): it bounds |o_a|·α + |o_b|·β (rule 5's scale), the roundings
   u·(|o_a|·α + |o_b|·β), and the float64 sums' errors, which are relative to Σ p_j·|v_j|, not to |o|.
6. combine_partials against dense attention over the whole key range, given partials rounded to
   dtype (combine_bounds): lse_s carries u·|lse_s| from its rounding, logsumexp over S terms adds
   (S + 3)·u·max(1, |lse|); o_s carries u·|o_s| and its weight exp(lse_s - lse) the errors of lse_s and
   lse; Σ_s w_s = 1 keeps the sum within max|o_s|. Both bounds ×2, + atol.
6b. flash_decode end to end: its partials within rule 1 (FORWARD_FACTOR × plain's error), plus rule 6
   for their combine as the atol of that check (cases_part6.decode_allowance, computed on correct
   partials of the same split rounded to dtype). Plain attention normalises once; a combine reads
   lse_s of magnitude |lse|, so a correct one that folds the segments one by one (logaddexp, ⊕)
   rounds by up to S·u·|lse|: measured 1.14e-5 on o with S = 7 and q ×40, 2× plain being 5.9e-6.
8. KV-cache logits (part 5) against the float64 uncached model: float32 at most KV_CACHE_FACTOR × the
   float32 uncached model's error + KV_CACHE_ATOL32; float64 FLOAT64_ATOL (reordering ~100 additions of
   O(10) values moves ~1e-13). Measured on the committed checkpoint (logits up to ~30), 150 cases
   (30 seeds × 5 chunk patterns): the float32 uncached model is off the float64 one by ~7e-6, a correct
   float32 cache by up to 3.5e-5 (up to 4× plain: its matmuls have other shapes, so other summation
   orders); the layer-0 regression is off by >= 4.1e-2 on every case, the top-left mask by >= 14. The
   bound 10 × plain + 1e-4 (~1.7e-4) is 5× above the worst correct cache, 240× below the smallest bug.
7. gradcheck (float64, central differences with eps 1e-6 on O(1) values): accurate to ~1e-9; the
   solution measures <= 1e-9, every catalogued gradient bug is off by more than 1e-2: GRADCHECK_MAX_ERR.
"""
from __future__ import annotations

import torch

FLOAT64_ATOL = 1e-10
DEFAULT_ATOL = 1e-6
FORWARD_FACTOR = 2.0  # o and lse of every attention forward (parts 2, 3, 4's Function, 6)
ROUNDING_EPS = 4.0  # rule 1: per entry, ROUNDING_EPS · eps · |expected| on top of the plain-error bound
GRADIENT_FACTOR = 3.0  # dq, dk, dv (part 4)
MERGE_EPS = 64  # ⊕ of two summaries / partials: MERGE_EPS · eps relative
IDENTITY_EPS = 4  # a ⊕ identity = a: a few roundings at most
GRADCHECK_MAX_ERR = 1e-6
KV_CACHE_FACTOR = 10.0
KV_CACHE_ATOL32 = 1e-4


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def atol_for(dtype: torch.dtype) -> float:
    return FLOAT64_ATOL if dtype == torch.float64 else DEFAULT_ATOL


def softmax_rtol(n: int, dtype: torch.dtype) -> float:
    """Rule 3: relative bound on a softmax over n entries computed with any summation order."""
    return 4 * (n + 2) * eps(dtype)


def summary_rtol(n: int, dtype: torch.dtype) -> float:
    """Rule 4: relative bound on ℓ = Σ_j exp(x_j - m) summed sequentially with up to n rebases."""
    return 4 * (n + 2) * eps(dtype)


def merge_rtol(dtype: torch.dtype) -> float:
    """Rule 5: relative bound on ℓ (and scaled-absolute on o) of one ⊕."""
    return MERGE_EPS * eps(dtype)


def merge_data_rtol(n: int, dtype: torch.dtype, merges: int = 1) -> float:
    """Rule 5b: relative bound on ℓ of `merges` ⊕s of judge-made summaries (rounded to dtype) of
    segments of rows of n scores, against the float64 summary of the whole rows."""
    return merges * merge_rtol(dtype) + eps(dtype) / 2 + 2 * summary_rtol(n, torch.float64)


def merge_data_scale(x: torch.Tensor, v: torch.Tensor) -> float:
    """Rule 5b: the scale of o's absolute bound, max Σ_j e^(x_j - m)·|v_j| over the rows of x (..., n)
    with values v (..., n, dv) (0 for no rows or only empty rows), computed from the data."""
    if x.numel() == 0 or x.shape[-1] == 0:
        return 0.0
    x, v = x.double(), v.double()
    m = x.amax(dim=-1, keepdim=True)
    p = torch.exp(x - torch.where(torch.isneginf(m), torch.zeros_like(m), m))
    return float((p.unsqueeze(-1) * v.abs()).sum(dim=-2).max())


def plain_bound(plain_err: float, factor: float, dtype: torch.dtype) -> float:
    """Rule 1 + 2: the bound check_close applies for a plain error plain_err."""
    return factor * plain_err + atol_for(dtype)


def combine_bounds(partials: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Rule 6: (bound on |Δo|, bound on |Δlse|) of a correct combine of these rounded partials."""
    dt = partials[0][0].dtype
    u = eps(dt) / 2
    n = len(partials)
    lses = torch.stack([p[1].double() for p in partials])
    finite = lses[torch.isfinite(lses)]
    big_l = float(finite.abs().max()) if finite.numel() else 0.0
    big_o = max((float(p[0].double().abs().max()) if p[0].numel() else 0.0) for p in partials)
    lse_err = u * (big_l + (n + 3) * max(1.0, big_l))
    o_err = big_o * (u + 2 * (lse_err + u * big_l) + (n + 3) * u)
    return 2 * o_err + atol_for(dt), 2 * lse_err + atol_for(dt)


def finite_max_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| over the entries where expected is finite (0 if none)."""
    finite = torch.isfinite(expected)
    err = (actual.double() - expected.double()).abs()[finite]
    return float(err.max()) if err.numel() else 0.0


