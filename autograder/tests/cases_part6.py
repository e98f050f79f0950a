"""Part 6 (Flash-Decoding: split_kv, attention_partial, combine_partials, flash_decode): shared checks.

(a) references: o and lse against course.reference.attention_reference (float64), plain float32 rule
    (2×); combine_partials of rounded partials against dense float64 attention over all their keys
    (tolerances rule 6; the judge holds no combine formula).
(b) conventions: no mask (a decode query sees every key); an empty segment is (o = 0, lse = -inf) and
    no NaN appears, even with more splits than keys or every segment empty; split_kv returns views.
(c) what the JUDGE measures in its own replay of each call (autograder/engine/replay.py): no fused
    attention op (refused by the allow-list under any name); no float64 copy of float32 data;
    matmul FLOPs between 2·Nq·Nk·(d + dv) per (batch, head) (every key's score once, in exactly one segment)
    and that plus 2·S·dv per query row (a combine written as a matmul/einsum over the S segments);
    with several segments no new tensor spans all Nk keys (each segment is attended on its own);
    split_kv's segments share the storage of the judge's own k and v.

Every test grades the replay's output, so values and structure judge the same computation; a second
replay on judge-drawn inputs must compute the reference of those inputs (replay.check_twin).

Inputs are peaked (q × 40, so scores × 40): with unit-scale inputs attention is nearly uniform and a
combine that averages the segment outputs is off by only ~1.5e-2, which a loose test can miss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import CheckFailure, check, check_close, check_tensor, unpack
from .remember import attention_plain, attention_reference  # course.reference's, remembered across grades

from . import diagnose as dg
from . import liveness
from . import probes as pb
from .cases_part2 import (DTYPES, check_no_hand_made_products, check_no_hidden_matmul, check_tiles_live, close_or_diagnose, dead_flops,
                          scores_like_shapes)

HINT_VIEWS = ("split_kv must return views of k and v (slicing or torch.tensor_split), not copies: Flash-Decoding "
              "splits the cache without moving it (§8.4)")
HINT_SPLITS = ("split_kv returns exactly num_splits (k_seg, v_seg) pairs in key order, empty segments included "
               "(with more splits than keys some segments have 0 keys)")
HINT_PARTIAL_LSE = "lse_s = m + log ℓ over the segment's scaled scores, in natural log (§4.4, §5.1)"
HINT_DECODE_FUSED = ("flash_decode must compute each segment's attention itself with torch matmuls, no fused "
                     "attention kernel (§8.4)")
HINT_DECODE_FLOPS = ("every key's score is computed once, in exactly one segment: Σ_s 2·Nq·n_s·(d + dv) = "
                     "2·Nq·Nk·(d + dv) matmul FLOPs per (batch, head); no second pass over all keys, no segment "
                     "dropped")


@dataclass(frozen=True)
class DecodeCase:
    """q (*lead, nq, d) × q_mult, k/v (*lead, nk, d), split into num_splits segments."""

    lead: tuple[int, ...] = (2, 3)
    nq: int = 1
    nk: int = 203
    d: int = 16
    num_splits: int = 2
    q_mult: float = 40.0
    scale: float | None = None
    dtype: str = "float32"
    seed: int = 0
    dv: int | None = None  # v's head dim (default d): the default scale is 1/sqrt(d) of q and k, never of v

    @property
    def d_v(self) -> int:
        return self.d if self.dv is None else self.dv

    @property
    def id(self) -> str:
        lead = "x".join(map(str, self.lead)) or "()"
        extra = f"-scale{self.scale:g}" if self.scale is not None else ""
        extra += f"-dv{self.dv}" if self.dv is not None else ""
        return (f"{lead}-{self.nq}x{self.nk}x{self.d}-splits{self.num_splits}-qmul{self.q_mult:g}-{self.dtype}"
                f"{extra}-s{self.seed}")

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        q, k, v = (torch.randn(*self.lead, n, dim, generator=g, dtype=torch.float64)
                   for n, dim in ((self.nq, self.d), (self.nk, self.d), (self.nk, self.d_v)))
        dt = DTYPES[self.dtype]
        return (q * self.q_mult).to(dt), k.to(dt), v.to(dt)

    def shown(self, q, k, v, **extra: Any) -> dict[str, Any]:
        return {"q": q, "k": k, "v": v, "num_splits": self.num_splits, "scale": self.scale, **extra}


def segment_bounds(lengths: list[int]) -> list[tuple[int, int]]:
    """[(start, end)] of consecutive segments with these lengths."""
    out, a = [], 0
    for n in lengths:
        out.append((a, a + n))
        a += n
    return out


HINT_SPLIT_DIM = ("every segment holds all Nk keys: the split cut another dim; split the keys, dim -2 of (..., Nk, d), "
                  "and keep d whole in every segment (§8.4)")


def check_split(student, case: DecodeCase) -> None:
    """split_kv(k, v, num_splits): num_splits pairs, in key order, covering every key once, views of k and v."""
    _, k0, v0 = case.qkv()
    rp, (k, v, _), _ = replay.call(student, "flash_decoding.split_kv", (k0, v0, case.num_splits), seed=None)
    segs = rp.result
    segs = [tuple(s) if type(s) in (list, tuple) else s for s in segs] if type(segs) in (list, tuple) else segs
    segs = list(segs) if type(segs) is tuple else segs
    inputs = {"k": k, "v": v, "num_splits": case.num_splits}
    ok = type(segs) is list and all(type(s) is tuple and len(s) == 2 for s in segs)
    check(ok and len(segs) == case.num_splits,
          what=f"split_kv returns a list of num_splits = {case.num_splits} (k_seg, v_seg) pairs",
          detail=f"got {type(segs).__name__}" + (f" of length {len(segs)}" if isinstance(segs, list) else ""),
          hint=HINT_SPLITS, inputs=inputs)
    ks, vs = [s[0] for s in segs], [s[1] for s in segs]
    for name, parts, whole in (("k", ks, k), ("v", vs, v)):
        # a segment's dims before its shape is indexed (a 0-d or 1-d "segment" has no key dim), and its dtype
        # before the segments are joined (a view of k or v has their dtype)
        fits = all(type(t) is torch.Tensor and t.dim() == whole.dim() and t.dtype == whole.dtype
                   and t.shape[:-2] == whole.shape[:-2] and t.shape[-1] == whole.shape[-1] for t in parts)
        # cut along another dim: every segment keeps all Nk keys and a slice of d (or of a leading dim)
        other_dim = not fits and all(type(t) is torch.Tensor and t.dim() == whole.dim() and t.shape[-2] == whole.shape[-2]
                                     for t in parts)
        check(fits, what=f"each {name}_seg is a tensor (..., n_s, d) with {name}'s leading dims, d and dtype",
              detail=f"{name} is {_shape_dtype(whole)}; segments: {', '.join(_shape_dtype(t) for t in parts)}",
              hint=HINT_SPLIT_DIM if other_dim else HINT_SPLITS, inputs=inputs)
        joined = torch.cat(parts, dim=-2)
        covered, nk = joined.shape[-2], whole.shape[-2]
        hint = HINT_SPLITS
        if covered < nk:
            gone = f"{nk - covered} key was" if nk - covered == 1 else f"{nk - covered} keys were"
            hint = (f"the segments hold {covered} of the {nk} keys: the last {gone} dropped (Nk = "
                    f"{nk} is not a multiple of num_splits = {len(parts)}); give the first Nk mod num_splits segments "
                    "one key more, as torch.tensor_split does (§8.4)")
        elif covered > nk:
            hint = f"the segments hold {covered} keys for Nk = {nk}: some keys are in two segments; {HINT_SPLITS}"
        check(joined.shape == whole.shape and bool(torch.equal(joined, whole)),
              what=f"the {name} segments, concatenated in order, are exactly {name} (every key once, in order)",
              detail=f"lengths {[t.shape[-2] for t in parts]} for Nk = {nk}", hint=hint, inputs=inputs)
    lengths = [t.shape[-2] for t in ks]
    check([t.shape[-2] for t in vs] == lengths, what="k and v are split at the same places",
          detail=f"k lengths {lengths}, v lengths {[t.shape[-2] for t in vs]}", hint=HINT_SPLITS, inputs=inputs)
    kp, vp = (rp.inputs[i].untyped_storage().data_ptr() for i in (0, 1))  # the replay's own k and v
    copies = [i for i, n in enumerate(lengths) if n > 0 and not (ks[i].untyped_storage().data_ptr() == kp
                                                                 and vs[i].untyped_storage().data_ptr() == vp)]
    check(not copies, what="split_kv returns views sharing storage with k and v (no copies)",
          detail=f"segments {copies} do not share k's / v's storage", hint=HINT_VIEWS, inputs=inputs)


def _shape_dtype(t: Any) -> str:
    if type(t) is torch.Tensor:
        return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
    return type(t).__name__


def check_partial(student, case: DecodeCase) -> None:
    """attention_partial(q, k_seg, v_seg, scale) on the middle third of the keys, and on an empty segment."""
    q0, k0, v0 = case.qkv()
    a, b = case.nk // 3, 2 * case.nk // 3
    rp, (q, k_seg, v_seg, _), _ = replay.call(
        student, "flash_decoding.attention_partial",
        (q0, k0[..., a:b, :].contiguous(), v0[..., a:b, :].contiguous(), case.scale), seed=case.seed + 1,
        reference=lambda q, k, v, scale: attention_reference(q, k, v, False, scale))
    k, v = k0, v0
    check_no_upcast(rp, q, "attention_partial", case.shown(q, k_seg, v_seg))
    o, lse = unpack(rp.result, 2, what="attention_partial returns (o, lse)")
    ref_o, ref_lse = attention_reference(q, k_seg, v_seg, False, case.scale)
    plain_o, plain_lse = attention_plain(q, k_seg, v_seg, False, case.scale)
    inputs = case.shown(q, k_seg, v_seg)
    probe = lambda _tol, fallback: dg._compose(pb.partial_ladder(student).message(), fallback)  # noqa: E731
    close_or_diagnose(o, ref_o, what="o of attention_partial (softmax over the segment's keys only, no mask)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR,
                      diagnose=lambda t: probe(t, dg.HINT_DECODE))
    close_or_diagnose(lse, ref_lse,
                      what="lse of attention_partial (natural-log logsumexp of the segment's scaled scores)",
                      inputs=inputs, plain=plain_lse, factor=tol.FORWARD_FACTOR,
                      diagnose=lambda t: probe(t, HINT_PARTIAL_LSE))
    empty_k, empty_v = k[..., :0, :].contiguous(), v[..., :0, :].contiguous()
    rp, (q, empty_k, empty_v, _), _ = replay.call(student, "flash_decoding.attention_partial",
                                                  (q0, empty_k, empty_v, case.scale), seed=None)
    o, lse = unpack(rp.result, 2, what="attention_partial returns (o, lse)")
    inputs = case.shown(q, empty_k, empty_v)
    for name, t, shape in (("o", o, (*case.lead, case.nq, case.d_v)), ("lse", lse, (*case.lead, case.nq))):
        check(type(t) is torch.Tensor and tuple(t.shape) == shape and t.dtype == q.dtype,
              what=f"{name} of attention_partial on an empty segment has shape {shape} and q's dtype",
              detail=f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}",
              hint=dg.HINT_EMPTY_SEGMENT, inputs=inputs)
    check(bool((o == 0).all()) and bool(torch.isneginf(lse).all()),
          what="an empty segment gives o = 0 and lse = -inf (the identity of ⊕), no NaN",
          detail=f"o: {int(torch.isnan(o).sum())} NaN, max |o| {o.abs().nan_to_num(0).max().item():.3g}; "
                 f"lse e.g. {lse.reshape(-1)[0].item()}", hint=dg.HINT_EMPTY_SEGMENT, inputs=inputs)


def _partials(q, k, v, case: DecodeCase, lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Correct partials (float64 dense attention per segment, cast to q's dtype); an empty segment is (0, -inf)."""
    return pb._seg_partials(q, k, v, lengths, case.scale, q.dtype)


def check_combine(student, case: DecodeCase, lengths: list[int]) -> None:
    """combine_partials of given partials (one segment per entry of lengths, 0 = empty) against dense float64
    attention over all the keys (the exact ⊕ of the exact partials), within the rounding bound of the given
    rounded partials (tolerances.combine_bounds). lse is checked first: o's weights exp(lse_s - lse) depend on it."""
    assert sum(lengths) == case.nk, "test bug: the segment lengths must cover the keys"
    q, k, v = case.qkv()
    partials = _partials(q, k, v, case, lengths)
    # the twin: the same program on the partials of judge-drawn q, k, v; its reference is dense attention
    # over all their keys (no combine formula on the judge side either)
    tq, tk, tv = (replay.perturbed(t, case.seed * 10 + i) for i, t in enumerate((q, k, v)))
    rp, (partials,), _ = replay.call(
        student, "flash_decoding.combine_partials", (partials,), reference=lambda *_: attention_reference(
            tq, tk, tv, False, case.scale), main_reference=lambda *_: attention_reference(q, k, v, False, case.scale),
        twin_inputs=((_partials(tq, tk, tv, case, lengths),), {}))
    check_no_upcast(rp, q, "combine_partials", {"segment lengths": lengths})
    o, lse = unpack(rp.result, 2, what="combine_partials returns (o, lse)")
    exp_o, exp_lse = attention_reference(q, k, v, False, case.scale)
    bound_o, bound_lse = tol.combine_bounds(partials)
    inputs = {"segment lengths": lengths, "each o_s": partials[0][0], "each lse_s": partials[0][1]}
    for name, actual, exp, bound, what in (
            ("lse", lse, exp_lse, bound_lse, "lse of combine_partials: log Σ_s exp(lse_s)"),
            ("o", o, exp_o, bound_o, "o of combine_partials: Σ_s exp(lse_s - lse) o_s")):
        try:
            check_close(actual, exp, what=what, inputs=inputs, atol=bound, rtol=0.0, dtype=q.dtype)
        except CheckFailure as failure:
            if failure.kind in ("type", "dtype", "shape"):
                raise
            try:
                failure.hint = dg.diagnose_combine(actual, name, partials, exp, tol=bound, lengths=lengths,
                                                   student=student)
            except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
                failure.hint = f"(diagnosis unavailable: {type(exc).__name__})"
            failure.args = (failure.message(),)
            raise failure


def check_combine_all_empty(student, case: DecodeCase, n: int = 3) -> None:
    """Every segment empty: ⊕ of identities is the identity, (o = 0, lse = -inf), with no NaN."""
    q, k, v = case.qkv()
    partials = [(torch.zeros(*case.lead, case.nq, case.d_v, dtype=q.dtype),
                 torch.full((*case.lead, case.nq), -math.inf, dtype=q.dtype)) for _ in range(n)]
    rp, _, _ = replay.call(student, "flash_decoding.combine_partials", (partials,), seed=None)
    o, lse = unpack(rp.result, 2, what="combine_partials returns (o, lse)")
    inputs = {"segment lengths": [0] * n, "each o_s": partials[0][0], "each lse_s": partials[0][1]}
    # o and lse as combine_partials returns them (the partials' shapes and dtype) before any arithmetic on them
    check_tensor(o, what="o of combine_partials: (..., Nq, dv) in the partials' dtype", shape=partials[0][0].shape,
                 dtype=q.dtype, inputs=inputs)
    check_tensor(lse, what="lse of combine_partials: (..., Nq) in the partials' dtype", shape=partials[0][1].shape,
                 dtype=q.dtype, inputs=inputs)
    check(not bool(torch.isnan(o).any()) and not bool(torch.isnan(lse).any()),
          what="no NaN when every segment is empty", detail=f"o: {int(torch.isnan(o).sum())} NaN, "
          f"lse: {int(torch.isnan(lse).sum())} NaN", hint=dg.HINT_EMPTY_SEGMENT, inputs=inputs)
    check(bool((o == 0).all()) and bool(torch.isneginf(lse).all()),
          what="every segment empty gives o = 0 and lse = -inf", hint=dg.HINT_EMPTY_SEGMENT, inputs=inputs)


HINT_DECODE_SPLIT = ("with several segments, attend to each segment on its own (attention_partial per segment, then "
                     "combine_partials): a tensor spanning all Nk keys means the keys were not split (§8.4)")


def split_lengths(nk: int, num_splits: int) -> list[int]:
    """Segment lengths of torch.tensor_split (the handout's split), for the hints only."""
    return [t.shape[0] for t in torch.tensor_split(torch.empty(nk), num_splits)] if num_splits > 0 else []


def check_no_upcast(rp: replay.Replayed, q: torch.Tensor, fn: str, inputs: dict) -> None:
    """Nothing to check: a float64 copy of float32 data is legal (accumulating in float64 is a correct
    variant). Kept as the one place to change should a dtype rule come back."""


def decode_flops_bounds(case: DecodeCase) -> tuple[int, int]:
    """(fewest, most) matmul FLOPs of a correct flash_decode: 2·Nq·Nk·(d + dv) per (batch, head) for
    the scores and P·V of every key once, plus up to 2·S·dv per query row when the combine's weighted
    sum Σ_s w_s·o_s is written as a matmul / einsum (S = num_splits).
    With one query row (or d = 1), a segment of one key makes P·V a (1 × 1)·(1 × dv) product, which einsum
    lowers to a plain `mul` (no matmul to count, as matmul_flops_defined says for parts 2 and 4); a legal
    split may make up to min(S, Nk) such segments, so the fewest leaves out their 2·dv per row."""
    rows = math.prod(case.lead) * case.nq
    exact = 2 * rows * case.nk * (case.d + case.d_v)
    fewest = exact - (2 * rows * case.d_v * min(case.num_splits, case.nk) if case.nq == 1 or case.d == 1 else 0)
    return fewest, exact + 2 * rows * case.num_splits * case.d_v


def check_decode_structure(rp: replay.Replayed, case: DecodeCase, q: torch.Tensor, inputs: dict) -> None:
    """The replayed flash_decode: input dtype, FLOPs within decode_flops_bounds, split attention."""
    check_no_upcast(rp, q, "flash_decode", inputs)
    check_no_hidden_matmul(rp.broadcast_product_elems, "flash_decode", inputs)
    check_no_hand_made_products(rp, "flash_decode", inputs)
    low, high = decode_flops_bounds(case)
    got = liveness.live_matmul_flops(rp)
    hint = HINT_DECODE_FLOPS
    if got < low and rp.broadcast_product_elems:
        hint = f"a matmul is written as a broadcast multiply + sum ({rp.broadcast_product_elems:,} products); " \
               "use @ / torch.matmul"
    exact = 2 * math.prod(case.lead) * case.nq * case.nk * (case.d + case.d_v)
    extra = f" (+ up to {high - exact:,} for a combine written as a matmul)" if high > exact else ""
    fewer = f" (- up to {exact - low:,} for P·V of one-key segments that einsum makes a mul)" if low < exact else ""
    check(low <= got <= high, what="matmul FLOPs of flash_decode = 2·Nq·Nk·(d + dv) per (batch, head)",
          detail=f"counted {got:,}{dead_flops(rp, got)}, expected {exact:,}{extra}{fewer}", hint=hint, inputs=inputs)
    longest = max(split_lengths(case.nk, case.num_splits) or [0])
    rows = math.prod(case.lead)
    others = (case.d, case.d_v, case.nq, case.num_splits, *nonempty_segments(case), *case.lead, rows, rows * case.nq)
    if case.num_splits > 1 and longest < case.nk and case.nk not in others:
        # scores (or anything else made from q and k) along Nk keys or more: all of them at once,
        # padded or not; a float64 copy of k alone is legal
        spanning = [s for s in scores_like_shapes(rp) if any(n >= case.nk and n not in others for n in s)]
        check(not spanning, what="flash_decode attends to each segment on its own (no tensor spans all Nk keys)",
              detail=f"new tensors of shapes {spanning[:3]}, made from q and k, span {case.nk} keys or more; the "
                     f"longest segment has {longest}", hint=HINT_DECODE_SPLIT, inputs=inputs)
    segment = segment_bound(case)
    # segments of one key: each segment's lse_s, which the combine holds together, IS its one score, however
    # it was made (an amax, or a running max folded key by key): the tags cannot tell them from kept scores
    if case.num_splits > 1 and 1 < segment < case.nk:
        check_tiles_live(rp, case, fn="flash_decode", inputs=inputs, rows=DECODE_ROWS, limit=segment,
                         hint=HINT_DECODE_SEGMENTS,
                         what=f"flash_decode holds the scores of one segment at a time (§8.4): the live scores of "
                              f"a query row span at most {segment} keys")


# flash_decode(q, k, v, num_splits): q's rows are queries, k's and v's rows keys (liveness.pair_keys)
DECODE_ROWS = {0: (liveness.QUERY, -2), 1: (liveness.KEY, -2), 2: (liveness.KEY, -2)}
HINT_DECODE_SEGMENTS = ("attend to one segment at a time (attention_partial per segment: its scores are used and "
                        "dropped, only (o_s, lse_s) stay), then combine the partials (§8.4); scores of several "
                        "segments held together, in a list or concatenated, are one pass over all the keys")


def nonempty_segments(case: DecodeCase) -> set[int]:
    """How many non-empty segments the legal splits make (a decode may stack the partials of those only,
    dropping the empty ones: they are the identity of ⊕): min(S, Nk) for tensor_split and round(s·Nk/S)
    slices, ceil(Nk / ceil(Nk/S)) for segments of ceil(Nk/S) keys."""
    n, s = case.nk, case.num_splits
    if n == 0 or s <= 0:
        return set()
    return {min(s, n), -(-n // -(-n // s))}


def segment_bound(case: DecodeCase) -> int:
    """The most keys one segment of a near-equal split (§8.4) holds, for the splits a correct split_kv
    makes: torch.tensor_split, slicing at round(s·Nk/S) or segments of ceil(Nk/S) keys hold at most
    ceil(Nk/S); segments of floor(Nk/S) keys with the remainder in the last one hold up to floor(Nk/S) +
    (Nk mod S), which is at least ceil(Nk/S). With more splits than keys that last form is no split at all
    (every key in one segment), so there the bound is one key."""
    n, s = case.nk, case.num_splits
    return n // s + n % s if s <= n else 1


def replayed_decode(student, case: DecodeCase) -> tuple[replay.Replayed, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = case.qkv()
    rp, (jq, jk, jv, _), _ = replay.call(
        student, "flash_decoding.flash_decode", (q, k, v, case.num_splits), {"scale": case.scale}, seed=case.seed + 1,
        reference=lambda q, k, v, n, scale: attention_reference(q, k, v, False, scale))
    return rp, jq, jk, jv


def check_decode(student, case: DecodeCase, *, hidden: bool = False) -> None:
    """flash_decode(q, k, v, num_splits, scale) replayed: its structure, and o and lse against float64
    attention (no mask) of the judge's inputs."""
    rp, q, k, v = replayed_decode(student, case)
    inputs = case.shown(q, k, v)
    o, lse = unpack(rp.result, 2, what="flash_decode returns (o, lse)")
    ref_o, ref_lse = attention_reference(q, k, v, False, case.scale)
    plain_o, plain_lse = attention_plain(q, k, v, False, case.scale)
    lengths = split_lengths(case.nk, case.num_splits)
    combine_o, combine_lse = decode_allowance(q, k, v, case)
    close_or_diagnose(lse, ref_lse, what=f"lse of flash_decode with {case.num_splits} splits", inputs=inputs,
                      plain=plain_lse, factor=tol.FORWARD_FACTOR, atol=combine_lse,
                      diagnose=lambda bound: dg.diagnose_decode(lse, "lse", q, k, v, seg_lengths=lengths,
                                                                scale=case.scale, tol=bound, student=student))
    close_or_diagnose(o, ref_o, what=f"o of flash_decode with {case.num_splits} splits against float64 attention",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR, atol=combine_o,
                      diagnose=lambda bound: dg.diagnose_decode(o, "o", q, k, v, seg_lengths=lengths,
                                                                scale=case.scale, tol=bound, student=student))
    check_decode_structure(rp, case, q, inputs)  # the same replay's structure: values and structure together


def check_decode_trace(student, case: DecodeCase) -> None:
    """flash_decode replayed: no fused attention op, matmul FLOPs within decode_flops_bounds, a correct o."""
    rp, q, k, v = replayed_decode(student, case)
    inputs = case.shown(q, k, v)
    check_decode_structure(rp, case, q, inputs)
    o, _ = unpack(rp.result, 2, what="flash_decode returns (o, lse)")
    ref_o, _ = attention_reference(q, k, v, False, case.scale)
    plain_o, _ = attention_plain(q, k, v, False, case.scale)
    check_close(o, ref_o, what="o of the replayed flash_decode (the counts are of a correct result)", inputs=inputs,
                plain=plain_o, factor=2.0, atol=decode_allowance(q, k, v, case)[0], hint=dg.HINT_DECODE)


def decode_allowance(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: DecodeCase) -> tuple[float, float]:
    """flash_decode's allowance beyond its partials' plain error (tolerances rule 6b): the rounding
    bound of a correct combine (rule 6) of correct partials of this split, rounded to the dtype, as
    (o, lse) atol: the combine reads lse_s values of magnitude |lse|, so each of its steps may round
    by u·|lse|, which plain attention (one softmax) never does."""
    lengths = split_lengths(case.nk, case.num_splits) or [case.nk]
    return tol.combine_bounds(_partials(q, k, v, case, lengths))
