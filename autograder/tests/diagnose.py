"""Judge-side diagnosis of a failed value check (parts 2, 3, 4 and 6).

Two layers, in this order in the hint:
1. the invariant probes (probes.py): a ladder of small calls into the student's code that finds the
   first invariant the code breaks ("correct with one K/V block, wrong with 4: the merge across
   blocks ..."). A hint names a cause only when a probe proves it; otherwise it says that no
   smaller input fails.
2. beneath it, recognisers of known bugs: what each known buggy variant outputs on the failed
   probe's inputs (and on the test's own inputs), recomputed here in float64 from dense masked
   attention. If the student's output matches one variant far better than the correct result, the
   hint also names THAT bug. The variants are bugs by construction, and the correct values come from
   course.reference (dense float64 attention and torch autograd through it, which ship anyway): no
   combine, partial or tiled forward here computes a correct result (masked_backward with
   d_mode="ok" is the dense §7.1 formula that autograd through course.reference gives too).
In public tests the hint also says WHERE the error is (which rows / keys, which blocks).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable

import torch

from autograder.engine.checks import join_hints
from .remember import attention_reference, remembered  # course.reference's, remembered across grades

from . import probes as pb

LN2 = math.log(2.0)

# ---------------------------------------------------------------------------------------------------
# Hints (the mutation catalogue checks that these substrings reach the feedback)

HINT_RESCALE = "acc and ℓ must be rescaled by exp(m_old - m_new) when the row max grows (§5.1)"
HINT_LSE_BASE2 = "lse is in base 2: use the natural log, lse = m + ln ℓ (§5.1)"
HINT_LSE_MISSING_M = "lse is missing m: lse = m + log ℓ, not log ℓ (ℓ is a sum relative to the max m, §5.1)"
HINT_LSE_NO_LOG_L = "lse is just the row max m: lse = m + log ℓ (§5.1)"
HINT_LSE_UNSCALED_M = ("lse uses the max of the UNSCALED scores: lse = m + log ℓ with m the row max of the scaled "
                       "scores scale·q·k (o is right: ℓ and acc are consistent, only the m added to log ℓ is not)")
HINT_TOPLEFT = ("causal mask aligned top-left (key j <= i): the handout's alignment is bottom-right, "
                "query i sees key j iff j <= i + (Nk - Nq) (§6.2)")
HINT_CAUSAL_IGNORED = "causal=True must mask every key j > i + (Nk - Nq) (bottom-right, §6.2)"
HINT_DIAGONAL = ("diagonal block skipped: a K/V block that crosses the diagonal must be computed and masked "
                 "element-wise; only blocks entirely above it may be skipped (§6.2)")
HINT_RAGGED_Q = ("the ragged last Q block is missing: loop i0 over range(0, Nq, block_q) and let the last "
                 "block be shorter than block_q")
HINT_RAGGED_K = ("the ragged last K/V block is ignored: loop j0 over range(0, Nk, block_k) and let the last "
                 "block be shorter than block_k")
HINT_STRICT = ("causal mask too strict: query i sees key j iff j <= i + (Nk - Nq), the diagonal key included "
               "(<=, not <) (§6.2)")
HINT_RESCALE_INVERTED = ("the rescale factor is inverted: when the max grows from m_old to m_new, multiply acc and ℓ "
                         "by exp(m_old - m_new) <= 1, not exp(m_new - m_old) (§5.1)")
HINT_BF16 = ("the result has the error of a float16/bfloat16 step (about 1e-2 relative): keep every step in the "
             "input dtype or wider")
HINT_UNSCALED_LSE = "lse must be of the SCALED scores: lse = log Σ_j exp(scale · q_i·k_j)"
HINT_NOT_NORMALISED = ("o is not normalised: divide acc by ℓ once at the end, o = acc / ℓ (FA2 defers the division, "
                       "it does not drop it) (§5.1)")
HINT_TILE_MAX = ("the running max forgets the old one: m_new = max(m_old, rowmax of the tile), not the tile's own "
                 "max (a later tile with smaller scores, or one fully masked, would lower it or make it -inf) (§5.1)")
HINT_STALE_MAX = ("m is never carried over: after each K/V block m = m_new, so that the next block rescales by "
                  "exp(m_old - m_new) from the max so far, and lse = m + log ℓ uses it (§5.1)")
HINT_SCALE_TWICE = "the softmax scale is applied twice: S = scale · q kᵀ, once (e.g. scale q OR S, not both)"
HINT_SCALE = "scores must be scaled: S = scale · q kᵀ, and scale=None means 1/√d (handout conventions)"
HINT_SCALE_ONE_OVER_D = ("the scores are scaled by 1/d, not 1/√d: scale=None means 1/√d (handout conventions); "
                         "or 1/√d is applied twice (scale q OR S, once)")
HINT_NEGINF_GUARD = ("NaN in rows that can attend to no key: guard exp(-inf - (-inf)) and ℓ = 0 so such rows "
                     "get o = 0, lse = -inf (§4.4)")
HINT_NAN = ("NaN/inf in rows that do attend keys: subtract the running max before exp (§4.2) and rescale "
            "with exp(m_old - m_new), which is never exp(+inf)")
HINT_MASKED_LSE = "a row that can attend to no key must get o = 0 and lse = -inf (handout conventions)"
HINT_K_RESHAPED = ("the scores use k reshaped to (..., d, Nk), not transposed: reshape keeps the memory order, so "
                   "each 'column' mixes several keys; kᵀ is k.transpose(-2, -1) (or .mT)")
HINT_FORWARD = ("o must equal softmax(scale · q kᵀ, masked) v and lse = log Σ_j exp(S_ij); step through "
                "§5.1's pseudocode on a small input")

HINT_D = "D_i must be rowsum(dO_i ∘ O_i) (§7.3): dS = P ∘ (dP - D)"
HINT_DQ_OVERWRITTEN = ("dQ must be accumulated over all K/V blocks (dQ_i += scale · dS_ij K_j); here only the "
                       "last K/V block's contribution is left, it was overwritten (§7.4)")
HINT_DKDV_OVERWRITTEN = ("dK and dV must be accumulated over all Q blocks (dK_j += …, dV_j += P_ijᵀ dO_i); "
                         "here only the last Q block's contribution is left (§7.4)")
HINT_DQDK_SCALE = ("the softmax scale is missing in dQ/dK: S = scale · Q Kᵀ, so dQ = scale · dS K and "
                   "dK = scale · dSᵀ Q (§7.1)")
HINT_SCALED_TWICE = ("the softmax scale is applied twice in dQ or dK: with S = scale · Q Kᵀ, dQ = scale · dS K and "
                     "dK = scale · dSᵀ Q, once (if Q was pre-scaled, dSᵀ (scale·Q) already carries it)")
HINT_DS_P = "dS = P ∘ (dP - D): the elementwise factor P is missing (§7.1)"
HINT_P_TILE_MAX = ("P must be exp(S - L) with L the forward's lse of the whole row (§7.2), not exp(S - the tile's row "
                   "max): the backward recomputes the forward's normalised P, so no running max and no ℓ")
HINT_D_TILE = ("D_i = rowsum(dO_i ∘ O_i) over the whole row (§7.3), computed once before the loops, not "
               "rowsum(P ∘ dP) of one K/V tile")
HINT_BACKWARD = ("recompute P = exp(scale · Q Kᵀ - L) per tile, then dV += Pᵀ dO, dP = dO Vᵀ, "
                 "dS = P ∘ (dP - D), dQ += scale · dS K, dK += scale · dSᵀ Q (§7.2–§7.4)")
HINT_BACKWARD_NAN = ("NaN in the gradients: rows that attend no key have L = -inf; guard exp(S - L) so their "
                     "P row is 0 (FlashAttention stores +inf there internally)")

HINT_COMBINE_AVERAGE = ("combine_partials averages the segment outputs (or weights them by length): weight "
                        "segment s by exp(lse_s - lse) with lse = log Σ_s exp(lse_s), the ⊕ rule (§4.4, §8.4)")
HINT_COMBINE_SUM = ("combine_partials adds the segment outputs unweighted: each o_s is already normalised, "
                    "weight it by exp(lse_s - lse) (⊕, §4.4, §8.4)")
HINT_COMBINE_LSE = "the combined lse is log Σ_s exp(lse_s) (computed stably around max_s lse_s), §4.4"
HINT_SEGMENT_DROPPED = "a K/V segment is left out: every key must be in exactly one segment (§8.4)"
HINT_DECODE = ("flash_decode = combine_partials of attention_partial over split_kv's segments; each partial is "
               "(o_s normalised within its segment, lse_s), combined with ⊕ (§8.4)")
HINT_EMPTY_SEGMENT = ("an empty segment (o = 0, lse = -inf) is the identity of ⊕: no NaN, even when every segment is "
                      "empty; guard exp(lse_s - lse) where lse = -inf (§4.4)")

# A variant "matches" when the student is at least 20× closer to it than to the correct result, and
# within 10× the check's tolerance of it (a bug that scales values up, e.g. a missing softmax scale,
# scales the float32 rounding error up with them).
MATCH_RATIO = 0.05
MATCH_TOL_FACTOR = 10.0


# ---------------------------------------------------------------------------------------------------
# Small helpers


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _mask(nq: int, nk: int, causal: bool, topleft: bool = False) -> torch.Tensor:
    """True where query i may attend key j. Bottom-right unless topleft."""
    i = torch.arange(nq).unsqueeze(1)
    j = torch.arange(nk).unsqueeze(0)
    if not causal:
        return torch.ones(nq, nk, dtype=torch.bool)
    return j <= i + (0 if topleft else nk - nq)


def _strict_mask(nq: int, nk: int) -> torch.Tensor:
    """The bug j < i + (Nk - Nq): each query loses the key on its own diagonal."""
    i = torch.arange(nq).unsqueeze(1)
    j = torch.arange(nk).unsqueeze(0)
    return j < i + (nk - nq)


def fully_masked_rows(nq: int, nk: int, causal: bool) -> list[int]:
    """Queries that may attend no key (causal with Nq > Nk, bottom-right)."""
    return [i for i in range(nq) if causal and i + nk - nq < 0]


def _dist(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, where equal infinities count as 0 and any other NaN/inf disagreement as inf."""
    return _error_map(a, b).max().item() if a.numel() else 0.0


def _error_map(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|actual - expected| with mismatched NaN/inf patterns counted as inf."""
    a, e = actual.double(), expected.double()
    err = (a - e).abs()
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    err = torch.where(same_inf, torch.zeros_like(err), err)
    return torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)


def _ranges(idx: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in idx:
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _fmt_ranges(r: list[tuple[int, int]], limit: int = 4) -> str:
    parts = [f"{a}" if a == b else f"{a}..{b}" for a, b in r[:limit]]
    return ", ".join(parts) + (f", … ({len(r) - limit} more ranges)" if len(r) > limit else "")


def locate(actual: torch.Tensor, expected: torch.Tensor, *, tol: float, row_dim: int, n_rows: int,
           block: int | None, noun: str = "rows", block_name: str = "Q",
           masked_rows: list[int] | None = None) -> tuple[str, str | None]:
    """Where |actual - expected| > tol: (sentence naming the rows/keys and blocks, tag).

    tag is "ragged" when the error is confined to the ragged last block, "masked" when it is confined
    to rows that can attend to no key, else None."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.numel() == 0:
        return "", None
    bad = _error_map(actual, expected) > tol
    if not bad.any():
        return "", None
    dim = row_dim % bad.dim()
    other = [d for d in range(bad.dim()) if d != dim]
    rows_bad = bad.permute(dim, *other).reshape(bad.shape[dim], -1).any(dim=1)
    rows = [i for i in range(n_rows) if rows_bad[i]]
    where = f"error only in {noun} {_fmt_ranges(_ranges(rows))} of 0..{n_rows - 1}"
    if len(rows) == n_rows:
        where = f"error in all {noun} 0..{n_rows - 1}"
    notes, tag = [], None
    first_ragged = (n_rows // block) * block if block else n_rows
    if block and 0 < first_ragged < n_rows and rows[0] >= first_ragged:  # there is a full block before it
        notes.append(f"the ragged last {block_name} block, {noun} {first_ragged}..{n_rows - 1}")
        tag = "ragged"
    elif block and n_rows < block and len(rows) == n_rows:
        tag = "ragged"  # the only block is ragged: said by the hint, if no known bug matches better
    elif masked_rows and set(rows) <= set(masked_rows):
        notes.append("exactly rows that can attend to no key")
        tag = "masked"
    elif block and len(rows) < n_rows:
        blocks = sorted({i // block for i in rows})
        notes.append(f"{block_name} block{'s' if len(blocks) > 1 else ''} "
                     f"{_fmt_ranges(_ranges(blocks))} of size {block}")
    # Leading (batch, head) positions, when the error is not everywhere.
    lead_dims = bad.dim() - (2 if row_dim == -2 else 1)
    if lead_dims > 0:
        lead_bad = bad.reshape(*bad.shape[:lead_dims], -1).any(-1)
        if not lead_bad.all():
            idx = [tuple(int(x) for x in t) for t in lead_bad.nonzero()[:3]]
            notes.append(f"only at leading index {', '.join(map(str, idx))}"
                         + (" …" if int(lead_bad.sum()) > 3 else ""))
    return where + (f" ({'; '.join(notes)})" if notes else ""), tag


def _best_variant(actual: torch.Tensor, correct: torch.Tensor, variants: dict[str, tuple[torch.Tensor, str]],
                  tol: float) -> str | None:
    """The hint of the variant the student's output matches far better than the correct one, if any."""
    if not isinstance(actual, torch.Tensor) or actual.shape != correct.shape:
        return None
    err_correct = _dist(actual, correct)
    best: tuple[float, str] | None = None
    for out, hint in variants.values():
        if out.shape != correct.shape or _dist(out, correct) <= tol:
            continue  # this variant is indistinguishable from the correct result on these inputs
        e = _dist(actual, out)
        if e <= MATCH_TOL_FACTOR * tol and (err_correct == math.inf or e <= MATCH_RATIO * err_correct):
            if best is None or e < best[0]:
                best = (e, hint)
    return best[1] if best else None


def _blocks(n: int, block: int) -> list[tuple[int, int]]:
    return [(a, min(a + block, n)) for a in range(0, n, block)]


def _compose(*parts: str | None) -> str:
    return join_hints(*parts)


# ---------------------------------------------------------------------------------------------------
# Part 2: forward variants, in float64. Every variant but the rescaling bugs is "attention under
# another mask" (top-left, diagonal block skipped, ragged block dropped, ...), so they are computed
# with whole matrices; only the rescaling bugs need the K/V-block loop of §5.1.


def block_mask(nq: int, nk: int, *, causal: bool, block_q: int, block_k: int, topleft: bool = False,
               skip_diagonal: bool = False, drop_ragged_rows: bool = False,
               drop_ragged_keys: bool = False, strict: bool = False) -> torch.Tensor:
    """(nq, nk) bool: the (query, key) pairs a tiled implementation with these bugs lets through."""
    allowed = _mask(nq, nk, causal, topleft)
    if strict and causal:  # j < i + offset: the diagonal itself masked
        allowed = _strict_mask(nq, nk)
    if skip_diagonal:  # only (Q block, K/V block) pairs that are entirely visible survive
        full = allowed.clone()
        for i0 in range(0, nq, block_q):
            for j0 in range(0, nk, block_k):
                tile = allowed[i0:i0 + block_q, j0:j0 + block_k]
                if not tile.all():
                    full[i0:i0 + block_q, j0:j0 + block_k] = False
        allowed = full
    if drop_ragged_rows:
        allowed = allowed.clone()
        allowed[(nq // block_q) * block_q:] = False
    if drop_ragged_keys:
        allowed = allowed.clone()
        allowed[:, (nk // block_k) * block_k:] = False
    return allowed


def masked_attention(q, k, v, allowed: torch.Tensor, scale: float | None, kt: torch.Tensor | None = None):
    """(o, lse, m) in float64 for an arbitrary (nq, nk) mask; rows with no key: o = 0, lse = m = -inf.
    kt: what the scores multiply q by instead of kᵀ (a known bug's)."""
    q, k, v = q.double(), k.double(), v.double()
    kt = k.transpose(-1, -2) if kt is None else kt.double()
    s = (_scale(q, scale) * q @ kt).masked_fill(~allowed, -math.inf)
    m = s.amax(-1) if s.shape[-1] else torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    return p @ v, lse, m


def no_rescale_forward(q, k, v, *, causal, block_k, scale, missing: str):
    """§5.1's K/V-block loop (all query rows at once) with a rescaling BUG: missing="acc" | "l" | "both"
    leaves those unrescaled, "inverted" rescales by exp(m_new - m_old), "tile_max" takes each tile's
    own max for the running max (the old m forgotten), "stale_max" never carries m_new over to m.
    Returns (o, lse)."""
    assert missing in ("acc", "l", "both", "inverted", "tile_max", "stale_max"), "a variant is a bug by construction"
    q, k, v = q.double(), k.double(), v.double()
    nq, nk = q.shape[-2], k.shape[-2]
    allowed = _mask(nq, nk, causal)
    m = torch.full(q.shape[:-1], -math.inf, dtype=torch.float64)
    l = torch.zeros_like(m)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for j0 in range(0, nk, block_k):  # Q blocking does not matter: each row's sequence of K/V blocks does
        j1 = min(j0 + block_k, nk)
        s = (_scale(q, scale) * q @ k[..., j0:j1, :].transpose(-1, -2)).masked_fill(~allowed[:, j0:j1], -math.inf)
        m_new = s.amax(-1) if missing == "tile_max" else torch.maximum(m, s.amax(-1))
        base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - base.unsqueeze(-1))
        if missing in ("tile_max", "stale_max"):
            alpha_l = alpha_acc = torch.exp(m - base)
        elif missing == "inverted":
            old = torch.where(torch.isneginf(m), base, m)
            alpha = torch.exp(base - old)
            alpha_l = alpha_acc = alpha
        else:
            alpha = torch.exp(m - base)
            alpha_l = alpha if missing == "acc" else torch.ones_like(alpha)
            alpha_acc = alpha if missing == "l" else torch.ones_like(alpha)
        l = l * alpha_l + p.sum(-1)
        acc = acc * alpha_acc.unsqueeze(-1) + p @ v[..., j0:j1, :]
        m = m if missing == "stale_max" else m_new
    return acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1), m + torch.log(l)


def scale_variants(q, k, v, *, causal: bool, scale: float | None) -> dict[str, tuple[torch.Tensor, torch.Tensor, str]]:
    """name -> (o, lse, hint) of attention with a wrong softmax scale (float64): forgotten or its argument
    ignored, applied twice, or left out of lse. Any part that computes attention (forward, kernel, decode)
    can make these mistakes."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = _scale(q, scale)
    mask = _mask(nq, nk, causal)
    other_scale = 1.0 if scale is None else 1.0 / math.sqrt(d)  # scale forgotten / scale argument ignored
    o = masked_attention(q, k, v, mask, scale)[0]
    return {
        "wrong_scale": (*masked_attention(q, k, v, mask, other_scale)[:2], HINT_SCALE),
        # with scale=None, (1/√d)² = 1/d: the scale applied twice and 1/d for 1/√d give the same output
        "scale_twice": (*masked_attention(q, k, v, mask, sc * sc)[:2],
                        HINT_SCALE_TWICE if scale is not None else HINT_SCALE_ONE_OVER_D),
        "lse_unscaled": (o, masked_attention(q, k, v, mask, 1.0)[1], HINT_UNSCALED_LSE),
    }


@remembered  # a pure function of the case's inputs: the same for every submission a judge grades
def forward_variants(q, k, v, *, causal, block_q, block_k, scale) -> dict[str, tuple[torch.Tensor, torch.Tensor, str]]:
    """name -> (o, lse, hint) of each known buggy forward on these inputs (float64)."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    blocks = dict(causal=causal, block_q=block_q, block_k=block_k)
    o, lse, m = masked_attention(q, k, v, _mask(nq, nk, causal), scale)
    log_l = torch.where(torch.isneginf(lse), lse, lse - m)
    out: dict[str, tuple[torch.Tensor, torch.Tensor, str]] = {
        "lse_base2": (o, lse / LN2, HINT_LSE_BASE2),
        "lse_m_plus_log2_l": (o, m + log_l / LN2, HINT_LSE_BASE2),
        "lse_missing_m": (o, log_l, HINT_LSE_MISSING_M),
        "lse_is_m": (o, m, HINT_LSE_NO_LOG_L),
    }
    sc = _scale(q, scale)
    if sc != 1.0:  # the scale moved into exp(scale·(s - m)) (legal) with m the max of the UNSCALED scores in lse
        out["lse_unscaled_m"] = (o, torch.where(torch.isneginf(lse), lse, m / sc + log_l), HINT_LSE_UNSCALED_M)
    for name, missing in (("no_rescale_acc", "acc"), ("no_rescale_l", "l"), ("no_rescale", "both")):
        out[name] = (*no_rescale_forward(q, k, v, causal=causal, block_k=block_k, scale=scale, missing=missing),
                     HINT_RESCALE)
    out["inverted_rescale"] = (*no_rescale_forward(q, k, v, causal=causal, block_k=block_k, scale=scale,
                                                   missing="inverted"), HINT_RESCALE_INVERTED)
    for name, hint in (("tile_max", HINT_TILE_MAX), ("stale_max", HINT_STALE_MAX)):
        out[name] = (*no_rescale_forward(q, k, v, causal=causal, block_k=block_k, scale=scale, missing=name), hint)
    masks = {}
    # A dropped ragged block is a recognisable bug only next to a full block: with N < block it would
    # drop everything, which many other bugs also look like.
    if nq >= block_q:
        masks["ragged_rows_dropped"] = (dict(drop_ragged_rows=True), HINT_RAGGED_Q)
    if nk >= block_k:
        masks["ragged_keys_dropped"] = (dict(drop_ragged_keys=True), HINT_RAGGED_K)
    if causal:
        masks["topleft_causal"] = (dict(topleft=True), HINT_TOPLEFT)
        masks["diagonal_block_skipped"] = (dict(skip_diagonal=True), HINT_DIAGONAL)
        masks["causal_ignored"] = (dict(causal=False), HINT_CAUSAL_IGNORED)
        masks["causal_strict"] = (dict(strict=True), HINT_STRICT)
    for name, (flags, hint) in masks.items():
        out[name] = (*masked_attention(q, k, v, block_mask(nq, nk, **{**blocks, **flags}), scale)[:2], hint)
    out.update(scale_variants(q, k, v, causal=causal, scale=scale))
    if nk > 1 and d > 1:  # kᵀ made with reshape: the same numbers, read in another order
        kt = k.reshape(*k.shape[:-2], d, nk)
        out["k_reshaped"] = (*masked_attention(q, k, v, _mask(nq, nk, causal), scale, kt=kt)[:2], HINT_K_RESHAPED)
    l = torch.exp(log_l)  # ℓ = Σ_j exp(S_ij - m): o left unnormalised is o·ℓ
    out["not_normalised"] = (torch.where(torch.isneginf(lse), 0.0, l).unsqueeze(-1) * o, lse, HINT_NOT_NORMALISED)
    return out


HINT_FORWARD_PAIRS_SKIPPED = ("every (Q block, K/V block) pair in which some query sees some key must add to o: these "
                              "were skipped by the loops or masked whole (a mask compares GLOBAL indices, rows "
                              "arange(i0, i1) with keys arange(j0, j1)); the K/V loop of Q block [i0, i1) runs from 0 "
                              "up to min(Nk, i1 + Nk - Nq) (§6.2)")


class Fitted(str):
    """A recogniser's hint that is a fit of left-out block pairs (_pairs_text): it says WHICH pairs are
    missing, not why (loop bounds, or a mask that hides whole tiles), so the rung's own text stays beside it."""


def _fitted(hint: str) -> bool:
    return isinstance(hint, Fitted)


def _pairs_text(which: str, what: str, dropped: list, why: str) -> Fitted:
    shown = ", ".join(f"rows {i0}..{i1 - 1} with keys {j0}..{j1 - 1}" for (i0, i1), (j0, j1) in dropped[:3])
    more = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
    return Fitted(f"{which} is what a {what} gives that leaves out {len(dropped)} (Q block, K/V block) pair"
                  f"{'s' if len(dropped) > 1 else ''} ({shown}{more}): {why}")


def skipped_blocks_forward(actual: torch.Tensor, which: str, q, k, v, *, causal: bool, block_q: int, block_k: int,
                           scale: float | None) -> tuple[torch.Tensor, list] | None:
    """o or lse (`which`) of a forward that leaves out whole (Q block, K/V block) pairs, fitted to `actual`:
    per Q block, the set of its visible K/V blocks whose attention is closest to `actual` (every subset
    up to 8 blocks, else every run of consecutive blocks and every one left out), and the pairs left
    out; None when the closest leaves out nothing."""
    q, k, v = (t.double() for t in (q, k, v))
    nq, nk = q.shape[-2], k.shape[-2]
    allowed = _mask(nq, nk, causal)
    s = _scale(q, scale) * q @ k.transpose(-1, -2)
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)  # (..., Nq, Nk), 0 where masked
    kv_blocks = _blocks(nk, block_k)
    mass = torch.stack([e[..., j0:j1].sum(-1) for j0, j1 in kv_blocks], -1)  # (..., Nq, n_blocks)
    weighed = torch.stack([e[..., j0:j1] @ v[..., j0:j1, :] for j0, j1 in kv_blocks], -2)  # (..., Nq, n_blocks, dv)
    got = actual.double()
    variant = torch.empty_like(got)
    dropped: list = []
    kept_any = False
    for i0, i1 in _blocks(nq, block_q):
        rows = (..., slice(i0, i1), slice(None)) if which == "o" else (..., slice(i0, i1))
        seen = [b for b, (j0, j1) in enumerate(kv_blocks) if allowed[i0:i1, j0:j1].any()]
        if not seen:
            variant[rows] = 0.0 if which == "o" else -math.inf
            continue
        n = len(seen)
        if n <= 8:
            subsets = [c for r in range(n + 1) for c in itertools.combinations(seen, r)]
        else:
            runs = [tuple(seen[a:b]) for a in range(n) for b in range(a, n + 1)]
            subsets = runs + [tuple(x for x in seen if x != y) for y in seen]
        best = None
        for kept in subsets:
            idx = list(kept)
            l = mass[..., i0:i1, idx].sum(-1)
            if which == "o":
                acc = weighed[..., i0:i1, idx, :].sum(-2)
                out = torch.where(l.unsqueeze(-1) > 0, acc / torch.where(l > 0, l, 1.0).unsqueeze(-1), 0.0)
            else:
                out = torch.where(l > 0, m[..., i0:i1, 0] + torch.log(torch.where(l > 0, l, 1.0)), -math.inf)
            err = _dist(got[rows], out)
            if best is None or err < best[0]:
                best = (err, kept, out)
        variant[rows] = best[2]
        dropped += [((i0, i1), kv_blocks[b]) for b in seen if b not in best[1]]
        kept_any = kept_any or bool(best[1])
    # The only pair left out (one tile) is o = 0 (lse = -inf) everywhere: what many bugs give there (ℓ
    # zeroed, acc never added, o never written), so it names no pair
    return (variant, dropped) if dropped and (kept_any or len(dropped) > 1) else None


def recognise_forward(actual: Any, which: str, q, k, v, *, causal: bool, block_q: int, block_k: int,
                      scale: float | None, tol: float, variants: bool = True) -> str | None:
    """The hint of the known buggy forward that `actual` (o or lse on these inputs) matches, if any.
    variants=False: not the known buggy forwards (forward_probe_hint matches them on o and lse at once)."""
    nq, nk = q.shape[-2], k.shape[-2]
    o, lse, _ = masked_attention(q, k, v, _mask(nq, nk, causal), scale)
    correct = o if which == "o" else lse
    if not isinstance(actual, torch.Tensor) or actual.shape != correct.shape:
        return None
    masked = fully_masked_rows(nq, nk, causal)
    nan = torch.isnan(actual)
    per_row = (nan.any(-1) if which == "o" else nan).reshape(-1, nq).any(0)  # (Nq,)
    nan_rows = set(per_row.nonzero()[:, 0].tolist())
    if nan_rows and masked and nan_rows <= set(masked):
        return HINT_NEGINF_GUARD
    if variants:
        hint = _best_variant(actual, correct, {name: ((vo if which == "o" else vl), hint) for name, (vo, vl, hint) in
                                               forward_variants(q, k, v, causal=causal, block_q=block_q,
                                                                block_k=block_k, scale=scale).items()}, tol)
        if hint:
            return hint
    fitted = skipped_blocks_forward(actual, which, q, k, v, causal=causal, block_q=block_q, block_k=block_k,
                                    scale=scale)
    if fitted is not None:
        variant, dropped = fitted
        found = _best_variant(actual, correct, {"pairs_skipped": (variant, _pairs_text(
            which, "forward", dropped, HINT_FORWARD_PAIRS_SKIPPED))}, tol)
        if found:
            return found
    if nan_rows:
        return HINT_NAN
    if masked and which == "lse" and not torch.isneginf(actual[..., masked]).all():
        return HINT_MASKED_LSE
    if _sixteen_bit(actual, correct):
        return HINT_BF16
    return None


def _sixteen_bit(actual: torch.Tensor, correct: torch.Tensor) -> bool:
    """An error of 2^-12..2^-6 relative to the output's size everywhere: a float16/bfloat16 step."""
    if not torch.isfinite(actual).all() or actual.dtype == torch.float16 or actual.dtype == torch.bfloat16:
        return False
    fin = torch.isfinite(correct)
    if not fin.any():
        return False
    size = correct[fin].abs().max().item() or 1.0
    err = (actual.double() - correct.double())[fin].abs().max().item() / size
    return 2.0 ** -13 <= err <= 2.0 ** -6


def _probe_tol(inputs_dtype: torch.dtype) -> float:
    return 1e-8 if inputs_dtype == torch.float64 else 1e-5


def _rows_place(actual, correct, *, tol, which, n_rows, block, masked, noun="rows", block_name="Q") -> str:
    row_dim = -2 if which in ("o", "dq", "dk", "dv") else -1
    place, tag = locate(actual, correct, tol=tol, row_dim=row_dim, n_rows=n_rows, block=block, noun=noun,
                        block_name=block_name, masked_rows=masked)
    return place


HINT_TILE_OFFSET = ("a tile's global offset is its first row times the row length: K/V block j starts at element "
                    "(head·N_k + j·B_c)·d of K and V (and Q block i at (head·N_q + i·B_r)·d of Q)")


def tile_offset_hint(actual: torch.Tensor, which: str, q, k, v, *, causal: bool, block_k: int,
                     scale: float | None, tol: float) -> str | None:
    """Where `actual` is attention whose K/V block j was read from element j·X of its head's keys and values
    (flattened, row after row) for some X other than B_c·d: a kernel's address arithmetic (the row
    length d left out of a tile's offset, or a wrong block stride). Tried on small probe inputs only
    (every X that keeps the tiles in bounds)."""
    nq, nk, d = q.shape[-2], k.shape[-2], k.shape[-1]
    blocks = _blocks(nk, block_k)
    if len(blocks) < 2 or not isinstance(actual, torch.Tensor):
        return None
    correct = masked_attention(q, k, v, _mask(nq, nk, causal), scale)[0 if which == "o" else 1]
    if actual.shape != correct.shape:
        return None
    flat_k, flat_v = k.double().flatten(-2), v.double().flatten(-2)  # (..., Nk·d) per head
    variants = {}
    for x in range(1, nk * d + 1):
        if x == block_k * d or (len(blocks) - 1) * x + (blocks[-1][1] - blocks[-1][0]) * d > nk * d:
            continue
        rows = torch.cat([torch.arange(j * x, j * x + (j1 - j0) * d) for j, (j0, j1) in enumerate(blocks)])
        kk = flat_k[..., rows].reshape(*k.shape[:-2], nk, d)
        vv = flat_v[..., rows].reshape(*v.shape[:-2], nk, v.shape[-1]) if v.shape[-1] == d else v
        o, lse, _ = masked_attention(q, kk, vv, _mask(nq, nk, causal), scale)
        variants[x] = (o if which == "o" else lse, f"K/V block j is read from element j·{x} of its head's K and V, "
                                                   f"not j·B_c·d = j·{block_k * d}: {HINT_TILE_OFFSET}")
    return _best_variant(actual, correct, variants, tol)


def _variant_of_both(o: Any, lse: Any, q, k, v, *, causal: bool, block_q: int, block_k: int, scale: float | None,
                     tol: float) -> str | None:
    """The hint of the known buggy forward whose o AND lse both match the probe's (a variant that explains
    one output and not the other, an lse of -inf everywhere say, is not the bug): _best_variant on the two
    outputs laid end to end."""
    if not (isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)):
        return None
    nq, nk = q.shape[-2], k.shape[-2]
    co, cl, _ = masked_attention(q, k, v, _mask(nq, nk, causal), scale)
    if o.shape != co.shape or lse.shape != cl.shape:
        return None

    def both(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a.double().reshape(-1), b.double().reshape(-1)])

    variants = {name: (both(vo, vl), hint) for name, (vo, vl, hint) in
                forward_variants(q, k, v, causal=causal, block_q=block_q, block_k=block_k, scale=scale).items()}
    return _best_variant(both(o, lse), both(co, cl), variants, tol)


def forward_probe_hint(finding: "pb.Finding", tiles: bool = False) -> str | None:
    """The recogniser's verdict on the failed probe's own (small, float64) inputs; with `tiles` (a kernel's
    probes), also tile_offset_hint."""
    if finding.failed is None or finding.outputs is None:
        return None
    q, k, v, s = finding.inputs
    o, lse = finding.outputs[:2]
    tol = _probe_tol(q.dtype)
    settings = dict(causal=s.get("causal", False), block_q=s["bq"], block_k=s["bk"], scale=s.get("scale"))
    hint = _variant_of_both(o, lse, q, k, v, tol=tol, **settings)
    if hint:
        return hint
    for name in finding.wrong:
        actual = finding.outputs[0 if name == "o" else 1]
        hint = recognise_forward(actual, name, q, k, v, tol=tol, variants=False, **settings)
        if hint is None and tiles:
            hint = tile_offset_hint(actual, name, q, k, v, causal=s.get("causal", False), block_k=s["bk"],
                                    scale=s.get("scale"), tol=_probe_tol(q.dtype))
        if hint:
            return hint
    return None


def diagnose_forward(actual: torch.Tensor, which: str, q, k, v, *, causal: bool, block_q: int, block_k: int,
                     scale: float | None, tol: float, where: bool = True, student: Any = None,
                     ladder: Callable[[], "pb.Finding"] | None = None) -> str:
    """Hint for a failed check of flash_forward's o (which="o") or lse (which="lse").

    With `student` (or a `ladder`), the probes run first and lead the hint; the recognisers follow
    (on the failed probe's inputs, else on the test's). where=False (hidden tests) leaves out the
    rows/blocks sentence, which would reveal the inputs."""
    nq, nk = q.shape[-2], k.shape[-2]
    correct = attention_reference(q, k, v, causal, scale)[0 if which == "o" else 1]
    if not isinstance(actual, torch.Tensor) or actual.shape != correct.shape:
        return ""
    masked = fully_masked_rows(nq, nk, causal)
    place = _rows_place(actual, correct, tol=tol, which=which, n_rows=nq, block=block_q, masked=masked) if where else ""
    finding = ladder() if ladder else pb.forward_ladder(student) if student is not None else None
    rec = forward_probe_hint(finding) if finding else None
    if rec is not None and not _fitted(rec):  # a known bug, proved on the failed probe's inputs: not the rung's guess
        return _compose(finding.message(proven=rec), place)
    if finding is None or finding.failed is None:  # the probes localised nothing
        rec = recognise_forward(actual, which, q, k, v, causal=causal, block_q=block_q, block_k=block_k,
                                scale=scale, tol=tol)
    if finding is None or (finding.failed is None and rec):  # a recogniser proved it on this test's inputs
        return _compose(rec or HINT_FORWARD, place)
    return _compose(finding.message(), rec, place)


# ---------------------------------------------------------------------------------------------------
# Part 4: backward variants, in float64, with whole matrices (§7.1's formulas) and masks.


def _last_block_mask(visible: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """For each block of rows, True on the columns of the LAST column block it computes (others False)."""
    n_rows, n_cols = visible.shape
    out = torch.zeros_like(visible)
    for r0 in range(0, n_rows, block_rows):
        cols = [c0 for c0 in range(0, n_cols, block_cols) if visible[r0:r0 + block_rows, c0:c0 + block_cols].any()]
        if cols:
            out[r0:r0 + block_rows, cols[-1]:cols[-1] + block_cols] = True
    return out


def masked_backward(q, k, v, o, lse, do, allowed: torch.Tensor, scale: float | None, *, d_mode: str,
                    dq_scale: int = 1, dk_scale: int = 1, dq_only: torch.Tensor | None = None,
                    dkdv_only: torch.Tensor | None = None, ds_without_p: bool = False, block_k: int = 0,
                    p_from_tile_max: bool = False):
    """(dq, dk, dv) of a BUGGY backward given o and lse (§7.1-§7.3), P recomputed under `allowed`, with:
    d_mode ("rowsum_do" | "zero" | "do_dot_v" | "tile": D from each K/V tile's rowsum(P ∘ dP) only |
    "ok"), the power of the scale in dQ / dK (0 missing, 2 twice), dq_only / dkdv_only masks that keep only
    some (query, key) contributions (an overwritten accumulator), dS without the P factor, P from each
    K/V tile's own row max (exp(S - m_tile), as the forward's P̃) instead of the row's lse."""
    q, k, v, o, lse, do = (t.double() for t in (q, k, v, o, lse, do))
    sc = _scale(q, scale)
    lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)  # P row = 0 there
    s = sc * q @ k.transpose(-1, -2)
    p = torch.exp(s - lse_safe.unsqueeze(-1)).masked_fill(~allowed, 0.0)
    if p_from_tile_max:
        p = torch.zeros_like(s)
        for j0 in range(0, k.shape[-2], block_k):
            tile = s[..., j0:j0 + block_k].masked_fill(~allowed[..., j0:j0 + block_k], -math.inf)
            m = tile.amax(-1, keepdim=True)
            p[..., j0:j0 + block_k] = torch.exp(tile - torch.where(torch.isneginf(m), torch.zeros_like(m), m))
    dp = do @ v.transpose(-1, -2)
    if d_mode == "tile":
        D = torch.zeros_like(dp)
        for j0 in range(0, k.shape[-2], block_k):
            D[..., j0:j0 + block_k] = (p * dp)[..., j0:j0 + block_k].sum(-1, keepdim=True)
    else:
        D = {"ok": lambda: (do * o).sum(-1), "rowsum_do": lambda: do.sum(-1),
             "zero": lambda: torch.zeros_like(lse), "do_dot_v": lambda: (do * v).sum(-1)}[d_mode]().unsqueeze(-1)
    ds = (dp - D).masked_fill(~allowed, 0.0) if ds_without_p else p * (dp - D)
    ds_q = ds if dq_only is None else ds.masked_fill(~dq_only, 0.0)
    ds_k, p_v = (ds, p) if dkdv_only is None else (ds.masked_fill(~dkdv_only, 0.0), p.masked_fill(~dkdv_only, 0.0))
    dq = sc ** dq_scale * ds_q @ k
    dk = sc ** dk_scale * ds_k.transpose(-1, -2) @ q
    return dq, dk, p_v.transpose(-1, -2) @ do


@remembered  # a pure function of the case's inputs: the same for every submission a judge grades
def backward_variants(q, k, v, o, lse, do, *, causal, block_q, block_k, scale):
    """name -> ((dq, dk, dv), hint) of each known buggy backward on these inputs (float64)."""
    nq, nk = q.shape[-2], k.shape[-2]
    allowed = _mask(nq, nk, causal)
    blocks = dict(causal=causal, block_q=block_q, block_k=block_k)
    def run(mask=allowed, d_mode="ok", **kw):
        return masked_backward(q, k, v, o, lse, do, mask, scale, d_mode=d_mode, block_k=block_k, **kw)
    # The last K/V block each Q block computes (dQ overwritten), and the last Q block each K/V block sees.
    visible = block_mask(nq, nk, **blocks)
    last_kv = _last_block_mask(visible, block_q, block_k)
    last_q = _last_block_mask(visible.t().contiguous(), block_k, block_q).t()
    out = {
        "D_rowsum_dO": (run(d_mode="rowsum_do"), HINT_D),
        "D_zero": (run(d_mode="zero"), HINT_D),
        "dq_overwritten": (run(dq_only=last_kv), HINT_DQ_OVERWRITTEN),
        "dkdv_overwritten": (run(dkdv_only=last_q), HINT_DKDV_OVERWRITTEN),
        "dq_dk_missing_scale": (run(dq_scale=0, dk_scale=0), HINT_DQDK_SCALE),
        "dq_missing_scale": (run(dq_scale=0), HINT_DQDK_SCALE),
        "dk_missing_scale": (run(dk_scale=0), HINT_DQDK_SCALE),
        "dk_scaled_twice": (run(dk_scale=2), HINT_SCALED_TWICE),
        "dq_scaled_twice": (run(dq_scale=2), HINT_SCALED_TWICE),
        "ds_without_p": (run(ds_without_p=True), HINT_DS_P),
        "D_one_tile": (run(d_mode="tile"), HINT_D_TILE),
        "p_from_tile_max": (run(p_from_tile_max=True), HINT_P_TILE_MAX),
        "ragged_rows_dropped": (run(block_mask(nq, nk, **blocks, drop_ragged_rows=True)), HINT_RAGGED_Q),
        "ragged_keys_dropped": (run(block_mask(nq, nk, **blocks, drop_ragged_keys=True)), HINT_RAGGED_K),
    }
    if nq == nk:
        out["D_dO_dot_V"] = (run(d_mode="do_dot_v"), HINT_D)
    if causal:
        out["topleft_causal"] = (run(block_mask(nq, nk, **blocks, topleft=True)), HINT_TOPLEFT)
        out["diagonal_block_skipped"] = (run(block_mask(nq, nk, **blocks, skip_diagonal=True)), HINT_DIAGONAL)
        out["causal_strict"] = (run(block_mask(nq, nk, **blocks, strict=True)), HINT_STRICT)
    return out


HINT_PAIRS_SKIPPED = ("every (Q block, K/V block) pair in which some query sees some key adds to dQ, dK and dV: "
                      "these were skipped by the loops or masked whole (a mask compares GLOBAL indices); with the "
                      "K/V blocks outside, the first Q block that sees key j0 holds row j0 - (Nk - Nq), and with the "
                      "Q blocks outside the last K/V block ends at min(Nk, i1 + Nk - Nq) (§6.2, §7.4)")


@remembered  # a pure function of the case's inputs: the same for every submission a judge grades
def pair_contributions(q, k, v, o, lse, do, *, causal, block_q, block_k, scale) -> dict:
    """{(which, (i0, i1), (j0, j1)): the (Q block, K/V block) pair's share of the `which` gradient, over the
    rows of its block} for every pair in which some query sees some key (float64, §7.2-§7.4)."""
    q, k, v, o, lse, do = (t.double() for t in (q, k, v, o, lse, do))
    sc = _scale(q, scale)
    nq, nk = q.shape[-2], k.shape[-2]
    allowed = _mask(nq, nk, causal)
    lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    p = torch.exp(sc * q @ k.transpose(-1, -2) - lse_safe.unsqueeze(-1)).masked_fill(~allowed, 0.0)
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    out = {}
    for i0, i1 in _blocks(nq, block_q):
        for j0, j1 in _blocks(nk, block_k):
            if not allowed[i0:i1, j0:j1].any():
                continue
            pij, dsij = p[..., i0:i1, j0:j1], ds[..., i0:i1, j0:j1]
            out["dq", (i0, i1), (j0, j1)] = sc * dsij @ k[..., j0:j1, :]
            out["dk", (i0, i1), (j0, j1)] = sc * dsij.transpose(-1, -2) @ q[..., i0:i1, :]
            out["dv", (i0, i1), (j0, j1)] = pij.transpose(-1, -2) @ do[..., i0:i1, :]
    return out


def skipped_pairs_variant(actual: torch.Tensor, correct: torch.Tensor, which: str, contributions: dict,
                          ) -> tuple[torch.Tensor, list[tuple[tuple[int, int], tuple[int, int]]]] | None:
    """The `which` gradient of a backward that leaves out some whole (Q block, K/V block) pairs, fitted to
    `actual`: per block of dQ's rows (dK's, dV's keys) the pairs whose shares best explain correct - actual
    (least squares over the pairs' shares, rounded to 0 or 1), and which pairs those are; None when the
    fit leaves out nothing."""
    rows_of = (lambda key: key[1]) if which == "dq" else (lambda key: key[2])
    groups: dict[tuple[int, int], list] = {}
    for key, share in contributions.items():
        if key[0] == which:
            groups.setdefault(rows_of(key), []).append((key, share))
    variant, dropped = correct.clone(), []
    gap = (correct - actual.double())
    for (r0, r1), items in groups.items():
        target = gap[..., r0:r1, :].reshape(-1)
        if not torch.isfinite(target).all():
            return None
        shares = torch.stack([share.reshape(-1) for _, share in items], dim=1)
        x = torch.linalg.lstsq(shares, target.unsqueeze(1)).solution.squeeze(1)
        for (key, share), xi in zip(items, x.tolist()):
            if abs(xi - 1.0) < 0.25:
                variant[..., r0:r1, :] -= share
                dropped.append((key[1], key[2]))
    if len(dropped) == 1 == sum(len(items) for items in groups.values()):
        return None  # the only pair left out (one tile): a zero gradient, which names no pair
    return (variant, dropped) if dropped else None


def recognise_backward(actual: Any, which: str, q, k, v, o, lse, do, *, causal: bool, block_q: int,
                       block_k: int, scale: float | None, tol: float) -> str | None:
    """The hint of the known buggy backward whose `which` gradient `actual` matches, if any."""
    idx = {"dq": 0, "dk": 1, "dv": 2}[which]
    correct = pb.reference_grads(q, k, v, do, causal, scale)[idx]
    if not isinstance(actual, torch.Tensor) or actual.shape != correct.shape:
        return None
    if torch.isnan(actual).any():
        return HINT_BACKWARD_NAN
    variants = {name: (grads[idx], hint) for name, (grads, hint) in
                backward_variants(q, k, v, o, lse, do, causal=causal, block_q=block_q, block_k=block_k,
                                  scale=scale).items()}
    named = _best_variant(actual, correct, variants, tol)
    if named:
        return named
    fitted = skipped_pairs_variant(actual, correct, which, pair_contributions(
        q, k, v, o, lse, do, causal=causal, block_q=block_q, block_k=block_k, scale=scale))
    if fitted is not None:
        variant, dropped = fitted
        hint = _pairs_text(which, "backward", dropped, HINT_PAIRS_SKIPPED)
        found = _best_variant(actual, correct, {"pairs_skipped": (variant, hint)}, tol)
        if found:
            return found
    return HINT_BF16 if _sixteen_bit(actual, correct) else None


def backward_probe_hint(finding: "pb.Finding") -> str | None:
    if finding.failed is None or finding.outputs is None:
        return None
    q, k, v, o, lse, do, s = finding.inputs
    for name in finding.wrong:
        hint = recognise_backward(finding.outputs[{"dq": 0, "dk": 1, "dv": 2}[name]], name, q, k, v, o, lse, do,
                                  causal=s.get("causal", False), block_q=s["bq"], block_k=s["bk"],
                                  scale=s.get("scale"), tol=_probe_tol(q.dtype))
        if hint:
            return hint
    return None


def diagnose_backward(actual: torch.Tensor, which: str, q, k, v, o, lse, do, *, causal: bool, block_q: int,
                      block_k: int, scale: float | None, tol: float, where: bool = True, student: Any = None,
                      finding: "pb.Finding | None" = None) -> str:
    """Hint for a failed check of one gradient (which in "dq", "dk", "dv") of flash_backward.

    With `student` the backward probes run first (or pass their `finding`, run once for the three gradients)."""
    idx = {"dq": 0, "dk": 1, "dv": 2}[which]
    correct = pb.reference_grads(q, k, v, do, causal, scale)[idx]
    if not isinstance(actual, torch.Tensor) or actual.shape != correct.shape:
        return ""
    nq, nk = q.shape[-2], k.shape[-2]
    place = ""
    if where:
        if which == "dq":
            place = _rows_place(actual, correct, tol=tol, which=which, n_rows=nq, block=block_q,
                                masked=fully_masked_rows(nq, nk, causal))
        else:
            place = _rows_place(actual, correct, tol=tol, which=which, n_rows=nk, block=block_k, masked=None,
                                noun="keys", block_name="K/V")
    if finding is None and student is not None:
        finding = pb.backward_ladder(student)
    rec = backward_probe_hint(finding) if finding else None
    if rec is not None and not _fitted(rec):  # a known bug, proved on the failed probe's inputs: not the rung's guess
        return _compose(finding.message(proven=rec), place)
    if finding is None or finding.failed is None:  # the probes localised nothing
        rec = recognise_backward(actual, which, q, k, v, o, lse, do, causal=causal, block_q=block_q,
                                 block_k=block_k, scale=scale, tol=tol)
    if finding is None or (finding.failed is None and rec):  # a recogniser proved it on this test's inputs
        return _compose(rec or HINT_BACKWARD, place)
    return _compose(finding.message(), rec, place)


# ---------------------------------------------------------------------------------------------------
# Part 6: Flash-Decoding combine variants


def combine_variants(partials: list[tuple[torch.Tensor, torch.Tensor]], lengths: list[int] | None = None):
    """name -> ((o or None, lse or None), hint) for the known wrong ways to combine (o_s, lse_s) partials.

    Only the wrong half of each: the o-only bugs have lse None (their lse would be the right one, and
    a right combined lse is not computed here)."""
    os_ = torch.stack([p[0].double() for p in partials])  # (S, ..., Nq, dv)
    ls = torch.stack([p[1].double() for p in partials])  # (S, ..., Nq)
    finite = torch.isfinite(ls)
    n_nonempty = finite.sum(0).clamp(min=1)
    lse_max = ls.amax(0)
    w_max = torch.exp(ls - torch.where(torch.isneginf(lse_max), torch.zeros_like(lse_max), lse_max))
    out = {
        "average_all": ((os_.mean(0), None), HINT_COMBINE_AVERAGE),
        "average_nonempty": ((os_.sum(0) / n_nonempty.unsqueeze(-1), None), HINT_COMBINE_AVERAGE),
        "sum": ((os_.sum(0), None), HINT_COMBINE_SUM),
        # lse = max_s lse_s: the weights exp(lse_s - max) are then not normalised
        "lse_max": (((w_max.unsqueeze(-1) * os_).sum(0), lse_max), HINT_COMBINE_LSE),
        "lse_mean": ((None, torch.where(finite, ls, torch.zeros_like(ls)).sum(0) / n_nonempty), HINT_COMBINE_LSE),
    }
    if lengths and sum(lengths) > 0:
        w = torch.tensor(lengths, dtype=torch.float64) / sum(lengths)
        out["length_weighted"] = (((w.reshape(-1, *[1] * (os_.dim() - 1)) * os_).sum(0), None), HINT_COMBINE_AVERAGE)
    return out


def recognise_combine(actual: Any, which: str, partials, expected: torch.Tensor, *, tol: float,
                      lengths: list[int] | None = None) -> str | None:
    """The hint of the known wrong combine that `actual` matches (expected: the exact combined value)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
        return None
    if torch.isnan(actual).any():
        return HINT_EMPTY_SEGMENT
    idx = 0 if which == "o" else 1
    variants = {name: (out[idx], hint) for name, (out, hint) in combine_variants(partials, lengths).items()
                if out[idx] is not None}
    return _best_variant(actual, expected, variants, tol)


def diagnose_combine(actual: torch.Tensor, which: str, partials, expected: torch.Tensor, *, tol: float,
                     lengths: list[int] | None = None, student: Any = None) -> str:
    """Hint for a failed check of a combined (o, lse) given the partials that were combined.

    With `student`, the combine probes run first; an lse that is wrong is named before o (the weights
    exp(lse_s - lse) of o depend on it)."""
    rec = recognise_combine(actual, which, partials, expected, tol=tol, lengths=lengths)
    if student is None:
        return rec or HINT_DECODE
    finding = pb.combine_ladder(student)
    return _compose(finding.message(), diagnose_combine_from_finding(finding) or rec)


def diagnose_decode(actual: torch.Tensor, which: str, q, k, v, *, seg_lengths: list[int] | None,
                    scale: float | None, tol: float, student: Any = None) -> str:
    """Hint for a failed check of flash_decode; seg_lengths are the student's split_kv segment lengths."""
    nk = k.shape[-2]
    if seg_lengths and sum(seg_lengths) < nk:
        return HINT_SEGMENT_DROPPED
    expected = attention_reference(q, k, v, False, scale)[0 if which == "o" else 1]
    parts = []
    if student is not None:
        for ladder in (pb.partial_ladder, pb.combine_ladder, pb.decode_ladder):
            finding = ladder(student)
            if finding.failed is not None:
                parts.append(finding.message())
                if ladder is pb.combine_ladder:
                    parts.append(diagnose_combine_from_finding(finding))
                break
        else:
            parts.append(f"{pb.NEUTRAL}: attention_partial, combine_partials and flash_decode are correct on "
                         "every probe")
    if not seg_lengths or sum(seg_lengths) != nk:
        seg_lengths = [nk]
    bounds = [0]
    for n in seg_lengths:
        bounds.append(bounds[-1] + n)
    partials = pb._seg_partials(q, k, v, seg_lengths, scale, torch.float64)
    idx = 0 if which == "o" else 1
    rec = recognise_combine(actual, which, partials, expected, tol=tol, lengths=seg_lengths)
    if rec is None and len(partials) > 1:
        # One segment left out of the combine: the dense attention of the other keys.
        dropped = {}
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            if b > a and nk - (b - a) > 0:
                keep = torch.cat([k[..., :a, :], k[..., b:, :]], -2), torch.cat([v[..., :a, :], v[..., b:, :]], -2)
                dropped[f"without_{i}"] = (attention_reference(q, *keep, False, scale)[idx], HINT_SEGMENT_DROPPED)
        rec = _best_variant(actual, expected, dropped, tol)
    if rec is None and q.dim() >= 2:  # the scale: forgotten, applied twice (to q and again in the partials)
        scaled = {name: (vo if which == "o" else vl, hint)
                  for name, (vo, vl, hint) in scale_variants(q.double(), k.double(), v.double(), causal=False,
                                                             scale=scale).items()}
        rec = _best_variant(actual, expected, scaled, tol)
    if student is None:
        return rec or HINT_DECODE
    return _compose(*parts, rec) or HINT_DECODE


def diagnose_combine_from_finding(finding: "pb.Finding") -> str | None:
    if finding.outputs is None or sum(finding.inputs[1]) == 0:
        return None
    partials, lengths = finding.inputs
    for name in sorted(finding.wrong, key=lambda n: n != "lse"):
        hit = recognise_combine(finding.outputs[0 if name == "o" else 1], name, partials,
                                finding.expected[0 if name == "o" else 1], tol=_probe_tol(partials[0][0].dtype),
                                lengths=lengths)
        if hit:
            return hit
    return None


# ---------------------------------------------------------------------------------------------------
# Hidden failures' hints: @cases(..., diagnosis=...) of the tests. runner.py runs each once per grade,
# before the first hidden test (in the public worker); they call the student only on the
# ladders' fixed probe inputs, and the recognisers look only at those probes' outputs.


def hidden_softmax(student, fn: str) -> str:
    message = pb.softmax_ladder(student, fn).message()
    return _compose(message, _one_pass(student, fn)) if fn == "online_softmax" else message


def hidden_summary(student) -> str:
    return _compose(pb.summary_ladder(student).message(), _one_pass(student, "online_summary"))


def _one_pass(student, fn: str) -> str | None:
    """The one-pass check on the PUBLIC designated input (cases_part1.STREAM, a fixed probe of the judge):
    what it found, when the function does not stream there."""
    from . import cases_part1 as C

    try:
        order = C.stream_order(student, fn, C.STREAM)
    except Exception:  # noqa: BLE001 -- the ladder's message already says how the function fails
        return None
    return None if order.ok else f"{order.describe(fn)} (on the probe x of shape {C.STREAM.shape})"


def hidden_merge(student, fn: str) -> str:
    return pb.merge_ladder(student, fn).message()


def hidden_forward(student) -> str:
    finding = pb.forward_ladder(student)
    return _compose(finding.message(), forward_probe_hint(finding))


def hidden_backward(student) -> str:
    finding = pb.backward_ladder(student)
    return _compose(finding.message(), backward_probe_hint(finding))


def hidden_cache(student) -> str:
    return pb.cache_ladder(student).message()


def hidden_partial(student) -> str:
    return pb.partial_ladder(student).message()


def hidden_combine(student) -> str:
    finding = pb.combine_ladder(student)
    return _compose(finding.message(), diagnose_combine_from_finding(finding))


def hidden_decode(student) -> str:
    """The first of the three part-6 ladders that finds something (the order of diagnose_decode)."""
    for ladder in (pb.partial_ladder, pb.combine_ladder, pb.decode_ladder):
        finding = ladder(student)
        if finding.failed is not None:
            extra = diagnose_combine_from_finding(finding) if ladder is pb.combine_ladder else None
            return _compose(finding.message(), extra)
    return f"{pb.NEUTRAL}: attention_partial, combine_partials and flash_decode are correct on every probe"
