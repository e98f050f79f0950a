"""Part 2 (flash_forward): cases and checks shared by the public and the hidden tests.

Each part is checked three ways:
(a) against trusted references computed here in the judge: course.reference.attention_reference
    (float64) and attention_plain (same math in the input dtype) for the plain-error rule of
    autograder/engine/tolerances.py, o AND lse (a wrong lse passes every O-only test); a failure
    runs the invariant probes (probes.py) for its hint;
(b) against the handout's conventions: lse natural log incl. m, bottom-right causal alignment with
    Nq != Nk both ways, fully masked rows o = 0 / lse = -inf / no NaN;
(c) against what the JUDGE measures in its own replay of the call (autograder/engine/replay.py):
    the worker records the aten ops the call ran, the judge checks them against its allow-list (no
    fused attention op under any name, no dense logsumexp/softmax), replays them on its own copy of
    the inputs and measures matmul FLOPs (from the visible scores' to whole-block causal skipping's; of
    the ops whose results reach the output: liveness.live_matmul_flops), the largest new storage (no Nq×Nk), the keys of every q·kᵀ
    matmul (key_extents), the keys that the live scores of a query row span at any time, however they were
    put together (liveness.pair_keys: S and P̃ one B_r × B_c tile at a time, §5.1), the peak of live data
    made from q and k in the trace tests (liveness.peak_score_like against forward_peak_bound), and float64
    copies of float32 data.

Every test of this part, values included, grades the REPLAY's output against references the judge
computes; the structure of that same replay is checked in the same test (`check_forward_structure`).
So a dense, fused or reference-calling implementation loses the value points too. A second replay on
judge-drawn inputs (`replay.check_twin`) must compute the reference of those inputs, so an answer
brought in from outside the recorded ops (constants, scalars) cannot pass either.

Which inputs expose which bug (measured, see the course's testing notes): Nq != Nk for top-left
alignment; N not a multiple of the blocks (113, 203) for a dropped ragged block; causal Nq > Nk for
a missing -inf guard; lse checked directly for lse bugs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import pytest
import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import CheckFailure, check, check_close, check_tensor, unpack
from .remember import attention_plain, attention_reference  # course.reference's, remembered across grades

from . import diagnose as dg
from . import liveness

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Judge-side math on small tensors: one torch thread. With the default two on a loaded 2-core
    machine, part 4's judge-side checks measured 44 s of wall time instead of 6.4 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass(frozen=True)
class AttnCase:
    """One attention input: q (*lead, nq, d), k (*lead, nk, d), v (*lead, nk, dv), drawn from a fixed seed
    (dv: d unless given)."""

    lead: tuple[int, ...] = (2,)
    nq: int = 113
    nk: int = 113
    d: int = 16
    causal: bool = False
    block_q: int = 64
    block_k: int = 64
    scale: float | None = None
    dtype: str = "float32"
    seed: int = 0
    q_mult: float = 1.0  # > 1 makes attention peaked (scores × q_mult)
    dv: int | None = None  # v's head dim, when it is not d (the handout's v: (..., Nk, dv))

    @property
    def d_v(self) -> int:
        return self.d if self.dv is None else self.dv

    @property
    def id(self) -> str:
        lead = "x".join(map(str, self.lead)) or "()"
        parts = [f"{lead}-{self.nq}x{self.nk}x{self.d}", "causal" if self.causal else "full",
                 f"b{self.block_q}-{self.block_k}", self.dtype]
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        if self.q_mult != 1:
            parts.append(f"peaked{self.q_mult:g}")
        if self.dv is not None:
            parts.append(f"dv{self.dv}")
        return "-".join(parts) + f"-s{self.seed}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def tensors(self, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        return [torch.randn(*self.lead, *s, generator=g, dtype=torch.float64).to(self.torch_dtype) for s in shapes]

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.tensors((self.nq, self.d), (self.nk, self.d), (self.nk, self.d_v))
        return q * self.q_mult, k, v

    def kwargs(self) -> dict[str, Any]:
        return dict(causal=self.causal, block_q=self.block_q, block_k=self.block_k, scale=self.scale)

    def shown(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **extra: Any) -> dict[str, Any]:
        """Inputs as the feedback shows them."""
        return {"q": q, "k": k, "v": v, **self.kwargs(), **extra}


def tolerance(plain: torch.Tensor, expected: torch.Tensor, factor: float, dtype: torch.dtype,
              atol: float | None = None) -> float:
    """The bound check_close applies: factor·max|plain - expected| (finite entries) + atol (tolerances rule 1)."""
    err = tol.finite_max_err(plain, expected)
    return tol.plain_bound(err, factor, dtype) if atol is None else factor * err + atol


def close_or_diagnose(actual: Any, expected: torch.Tensor, *, what: str, inputs: dict[str, Any],
                      plain: torch.Tensor, factor: float, diagnose: Callable[[float], str],
                      hint: str | None = None, atol: float | None = None,
                      others: dict[str, torch.Tensor] | None = None) -> None:
    """check_close; on failure, fail again with the hint of the known bug the output matches. others:
    check_close's (what else the output may hold by mistake)."""
    try:
        check_close(actual, expected, what=what, inputs=inputs, plain=plain, factor=factor, hint=hint, atol=atol,
                    others=others)
        return
    except CheckFailure as first:
        if first.kind in ("type", "dtype", "shape"):
            raise
        try:
            found = diagnose(tolerance(plain, expected, factor, plain.dtype, atol))
        except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
            found = f"(diagnosis unavailable: {type(exc).__name__})"
        first.hint = found or hint
        first.args = (first.message(),)
        raise first


def nonfinite_summary(t: torch.Tensor) -> str:
    return f"{int(torch.isnan(t).sum())} NaN, {int(torch.isinf(t).sum())} inf"


# ---------------------------------------------------------------------------------------------------
# (a) + (b): values of o and lse


def check_forward_values(student, case: AttnCase, *, hidden: bool = False) -> None:
    """o and lse of flash_forward against the float64 reference (2× plain rule), with diagnosis."""
    rp, q, k, v = replayed_forward(student, case)
    o, lse = unpack(rp.result, 2, what="flash_forward returns (o, lse)")
    ref_o, ref_lse = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, plain_lse = attention_plain(q, k, v, case.causal, case.scale)
    inputs = case.shown(q, k, v)
    diag = dict(causal=case.causal, block_q=case.block_q, block_k=case.block_k, scale=case.scale, where=not hidden,
                student=student)
    close_or_diagnose(o, ref_o, what="o of flash_forward against float64 attention", inputs=inputs, plain=plain_o,
                      factor=tol.FORWARD_FACTOR,
                      diagnose=lambda bound: dg.diagnose_forward(o, "o", q, k, v, tol=bound, **diag))
    close_or_diagnose(lse, ref_lse, what="lse of flash_forward: log Σ_j exp(S_ij), natural log, including m",
                      inputs=inputs, plain=plain_lse, factor=tol.FORWARD_FACTOR,
                      diagnose=lambda bound: dg.diagnose_forward(lse, "lse", q, k, v, tol=bound, **diag))
    check_forward_structure(rp, case, inputs=inputs)  # the same replay's structure: values and structure together


def check_fully_masked_rows(student, case: AttnCase) -> None:
    """Causal with Nq > Nk: the first Nq - Nk queries attend no key -> o = 0, lse = -inf, no NaN anywhere."""
    assert case.causal and case.nq > case.nk, "test bug: needs causal with Nq > Nk"
    rp, q, k, v = replayed_forward(student, case)
    o, lse = unpack(rp.result, 2, what="flash_forward returns (o, lse)")
    masked = dg.fully_masked_rows(case.nq, case.nk, True)
    inputs = case.shown(q, k, v)
    rows = f"rows 0..{masked[-1]}"
    # o and lse as flash_forward returns them (q's dtype, (..., Nq, dv) and (..., Nq)) before any arithmetic on them
    check_tensor(o, what="o of flash_forward: (..., Nq, dv) in q's dtype", shape=(*q.shape[:-1], v.shape[-1]),
                 dtype=q.dtype, inputs=inputs)
    check_tensor(lse, what="lse of flash_forward: (..., Nq) in q's dtype", shape=q.shape[:-1], dtype=q.dtype,
                 inputs=inputs)
    check(not bool(torch.isnan(o).any()) and not bool(torch.isnan(lse).any()),
          what="no NaN in o or lse when some rows can attend to no key",
          detail=f"o: {nonfinite_summary(o)}; lse: {nonfinite_summary(lse)}", hint=dg.HINT_NEGINF_GUARD,
          inputs=inputs)
    check(bool((o[..., masked, :] == 0).all()), what=f"o = 0 exactly in the fully masked {rows}",
          detail=f"max |o| there {o[..., masked, :].abs().max().item():.3g}", hint=dg.HINT_MASKED_LSE, inputs=inputs)
    check(bool(torch.isneginf(lse[..., masked]).all()), what=f"lse = -inf in the fully masked {rows}",
          detail=f"got e.g. {lse[..., masked].reshape(-1)[0].item()}", hint=dg.HINT_MASKED_LSE, inputs=inputs)
    visible = list(range(len(masked), case.nq))
    check(bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse[..., visible]).all()),
          what="o finite everywhere and lse finite in rows that see at least one key",
          detail=f"o: {nonfinite_summary(o)}; lse rows {visible[0]}..: {nonfinite_summary(lse[..., visible])}",
          hint=dg.HINT_NAN, inputs=inputs)
    check_forward_structure(rp, case, inputs=inputs)


# ---------------------------------------------------------------------------------------------------
# (c): the tracer


def block_pairs(nq: int, nk: int, causal: bool, block_q: int, block_k: int) -> list[tuple[int, int, int, int]]:
    """(i0, i1, j0, j1) of every (Q block, K/V block) pair with at least one visible key (§6.2)."""
    pairs = []
    for i0 in range(0, nq, block_q):
        i1 = min(i0 + block_q, nq)
        k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk  # the last row of the block sees keys < k_end
        pairs += [(i0, i1, j0, min(j0 + block_k, nk)) for j0 in range(0, k_end, block_k)]
    return pairs


def forward_flops(case: AttnCase, *, causal: bool | None = None) -> int:
    """Matmul FLOPs of a tiled forward: per pair 2·r·c·d (S = Q Kᵀ) + 2·r·c·dv (P̃ V), times the batch."""
    causal = case.causal if causal is None else causal
    batch = math.prod(case.lead)
    return batch * sum(2 * (i1 - i0) * (j1 - j0) * (case.d + case.d_v)
                       for i0, i1, j0, j1 in block_pairs(case.nq, case.nk, causal, case.block_q, case.block_k))


def _visible(case: AttnCase, i: int) -> int:
    """Keys query i may see (bottom-right causal): a prefix of the keys."""
    return max(0, min(case.nk, i + 1 + case.nk - case.nq)) if case.causal else case.nk


def visible_scores(case: AttnCase) -> int:
    """The (query, key) pairs a query may see, per (batch, head): Nq·Nk, or (causal, bottom-right)
    Σ_i visible(i) keys. The fewest scores any correct tiled attention computes: the tightest legal
    causal skipping (tiles cut at the last key a block's rows see, rows that see no key left out)."""
    return sum(_visible(case, i) for i in range(case.nq))


def _whole_block_scores(case: AttnCase, shift: int) -> int:
    """Scores computed per (batch, head) by whole-block causal skipping on the grid of Q blocks that
    start at `shift` + k·B_r (a first block of `shift` rows before it): each Q block computes the K/V
    blocks (of B_c keys, from key 0) that hold a key its last row may see."""
    starts = ([0] if shift else []) + list(range(shift, case.nq, case.block_q))
    total = 0
    for i0, i1 in zip(starts, starts[1:] + [case.nq]):
        last = _visible(case, i1 - 1)
        total += (i1 - i0) * min(case.nk, -(-last // case.block_k) * case.block_k)
    return total


def computed_scores_bounds(case: AttnCase) -> tuple[int, int]:
    """(fewest, most) scores a correct tiled attention computes per (batch, head). Fewest: the visible
    ones (visible_scores: the tightest legal causal skipping). Most: whole-block causal skipping on the
    grid of Q blocks where it computes the most, aligned at row 0 or shifted (a Q loop that starts
    after the rows that see no key). Non-causal: Nq·Nk both."""
    if not case.causal:
        return case.nq * case.nk, case.nq * case.nk
    return visible_scores(case), max(_whole_block_scores(case, s) for s in range(min(case.block_q, case.nq)))


def forward_flops_bounds(case: AttnCase) -> tuple[int, int]:
    """(fewest, most) matmul FLOPs of a correct tiled forward: 2·(d + dv) per computed score (4·d when
    dv = d), over computed_scores_bounds. Non-causal the two agree: 2·Nq·Nk·(d + dv) per (batch, head)."""
    fewest, most = computed_scores_bounds(case)
    per_score = 2 * math.prod(case.lead) * (case.d + case.d_v)
    return per_score * fewest, per_score * most


HINT_FUSED = ("flash_forward must not call scaled_dot_product_attention or any fused attention kernel: compute "
              "each tile yourself with torch matmuls (§5.1)")
HINT_NXN = ("S and P may exist only one B_r × B_c tile at a time (§5.1): never build a tensor with a full "
            "Nq × Nk score matrix per (batch, head)")
HINT_NO_SKIP = ("causal without block skipping: every (Q block, K/V block) pair was multiplied; skip whole K/V "
                "blocks that lie entirely above the diagonal, never loading them (§6.2 block skipping)")
HINT_HIDDEN_MATMUL = ("part of the attention is computed as a broadcast multiply + sum (or divide, addcmul, ... + sum; "
                      "{elems:,} products): that is a matmul hidden from the matmul count; use @ / torch.matmul on the "
                      "tiles")
HINT_FEWER = ("fewer matmul FLOPs than the visible scores need: keys that a row may see were skipped (the diagonal "
              "block? the ragged last block?), or part of the work is not a torch matmul (a "
              "broadcast multiply + sum counts no matmul FLOPs: use @ / torch.matmul on the tiles)")
HINT_MORE = ("more matmul FLOPs than the tiles need: multiply each (Q block, K/V block) pair once, with ragged "
             "last tiles (no padding to full blocks) and no extra products (e.g. P̃ @ ones for a row sum)")


def flops_hint(actual: int, expected: int, full: int, trace: dict[str, Any]) -> str:
    if actual == full and expected < full:
        return HINT_NO_SKIP
    if actual < expected and trace.get("broadcast_product_elems", 0):
        return HINT_HIDDEN_MATMUL.format(elems=trace["broadcast_product_elems"])
    return HINT_FEWER if actual < expected else HINT_MORE


HINT_UPCAST = ("the call makes float64 copies of float32 data: compute in the dtype of q (a float64 detour is "
               "what the course's dense reference does, not FlashAttention)")


def replayed_forward(student, case: AttnCase) -> tuple[replay.Replayed, torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash_forward recorded in the worker and replayed by the judge on its own q, k, v:
    (the replay, the judge's q, k, v). Check rp.result against references of THESE q, k, v."""
    q, k, v = case.qkv()
    rp, (jq, jk, jv), _ = replay.call(
        student, "flash_forward.flash_forward", (q, k, v), case.kwargs(), seed=case.seed + 1,
        reference=lambda q, k, v, causal, scale, **_: attention_reference(q, k, v, causal, scale))
    return rp, jq, jk, jv


def _extents(n: int, block: int) -> set[int]:
    """The sizes of the tiles along one side: full blocks and the ragged last one."""
    return {min(block, n)} | ({n % block} if n > block and n % block else set())


def matmul_flops_defined(case: AttnCase) -> bool:
    """Whether the matmul FLOPs of a tiled call are defined by its ops: a tile of one row AND one key
    (or d = 1) makes some tile products scalar multiplications, which einsum and matmul lower to
    plain `mul` (no matmul to count). Elsewhere an outer product over a length-1 contraction is
    counted as the matmul it is (engine/replay.py)."""
    one_row = 1 in _extents(case.nq, case.block_q)
    one_key = 1 in _extents(case.nk, case.block_k)
    return case.d > 1 and not (one_row and one_key)


def separates(case: AttnCase) -> bool:
    """Whether a tiled forward's largest storage (o, a scaled copy of q or k, one tile of S over the
    batch) is at most half of one head's Nq×Nk scores, so that storage tells tiled from dense."""
    itemsize = case.torch_dtype.itemsize
    legit = itemsize * math.prod(case.lead) * max(case.nq * max(case.d, case.d_v), case.nk * max(case.d, case.d_v),
                                                  case.block_q * case.block_k)
    return 2 * legit <= case.nq * case.nk * itemsize


def check_no_hidden_matmul(products: int, fn: str, inputs: dict) -> None:
    """No outer product built by elementwise arithmetic (a * b, a / (1 / b), addcmul, ... of two smaller
    tensors): with a sum it is a matmul the FLOP count cannot see, so skipped or repeated work would
    hide in it (replay.OUTER_OPS)."""
    check(not products, what=f"every product of tiles inside {fn} is a matmul (no broadcast multiply or divide + sum)",
          detail=f"{products:,} elements were made by elementwise ops combining two smaller tensors (outer products)",
          hint=HINT_HIDDEN_MATMUL.format(elems=products), inputs=inputs)


def check_trace_common(trace: dict[str, Any], *, fn: str, nq: int, nk: int, itemsize: int, inputs: dict,
                       fused_hint: str = HINT_FUSED, nxn_hint: str = HINT_NXN, upcasts: int = 0,
                       float32: bool = False, storage: bool = True) -> None:
    """No fused attention op (the replay refuses it); no new storage as large as one (batch, head)'s
    Nq × Nk scores (when `storage`: the shapes separate the two). Float64 copies of float32 data are
    legal (accumulating in float64 is a correct variant); `upcasts` and `float32` are informational."""
    fused = trace["fused_attention_ops"]
    check(not fused, what=f"no fused attention op inside {fn}", detail=f"the call dispatched {', '.join(fused)}",
          hint=fused_hint, inputs=inputs)
    check_no_hidden_matmul(trace.get("broadcast_product_elems", 0), fn, inputs)
    if not storage:
        return
    nxn = nq * nk * itemsize
    big = trace["max_new_storage"]
    if big["op"] == "aten::mul" and trace.get("broadcast_product_elems"):
        nxn_hint = HINT_HIDDEN_MATMUL.format(elems=trace["broadcast_product_elems"])
    check(trace["max_new_storage_bytes"] < nxn, what=f"no tensor of Nq × Nk or more per (batch, head) inside {fn}",
          detail=(f"largest new storage {big['bytes']:,} bytes ({big['op']} -> {big['dtype']} {tuple(big['shape'])}); "
                  f"one head's Nq × Nk scores are {nq}·{nk}·{itemsize} = {nxn:,} bytes"),
          hint=nxn_hint, inputs=inputs)


def check_forward_structure(rp: replay.Replayed, case: AttnCase, *, inputs: dict) -> None:
    """The structure of the replayed flash_forward: no fused op, input dtype, no Nq×Nk storage (where
    the shapes separate tiled from dense), matmul FLOPs from the visible scores' to whole-block causal
    skipping's (forward_flops_bounds), one tile of
    scores live at a time (the tags; and the peak of live data where the shapes separate)."""
    trace = rp.as_trace()
    check_trace_common(trace, fn="flash_forward", nq=case.nq, nk=case.nk, itemsize=case.torch_dtype.itemsize,
                       inputs=inputs, upcasts=rp.upcasts, float32=case.dtype == "float32", storage=separates(case))
    check_key_extents(rp, case, fn="flash_forward", inputs=inputs)
    check_no_hand_made_products(rp, "flash_forward", inputs)
    if matmul_flops_defined(case):
        fewest, most = forward_flops_bounds(case)
        full = forward_flops(case, causal=False)
        pairs = len(block_pairs(case.nq, case.nk, case.causal, case.block_q, case.block_k))
        total = len(block_pairs(case.nq, case.nk, False, case.block_q, case.block_k))
        live = liveness.live_ops(rp)
        got = liveness.live_matmul_flops(rp, live=live)
        check_scored_once(rp, case, live, inputs=inputs)
        if case.causal:
            what = ("matmul FLOPs of flash_forward: 2·(d + dv) per score, from the visible scores (tiles cut to the keys "
                    "their rows see) to whole-block causal skipping's (§6.2)")
            need = (f"a correct forward needs {fewest:,} to {most:,} ({pairs} of {total} block pairs; all pairs "
                    f"would be {full:,})")
        else:
            what, need = "matmul FLOPs of flash_forward = 2·Nq·Nk·(d + dv) per (batch, head)", f"expected {most:,}"
        check(fewest <= got <= most, what=what, detail=f"counted {got:,}{dead_flops(rp, got)}, {need}",
              hint=flops_hint(got, fewest if got < fewest else most, full, trace), inputs=inputs)
    check_tiles_live(rp, case, fn="flash_forward", inputs=inputs, rows=FORWARD_ROWS)
    if peak_separates(case):  # on every replay whose shapes let memory tell a tile from a row panel
        check_peak(rp, case, fn="flash_forward", inputs=inputs)


def dead_flops(rp: replay.Replayed, live: int, start: int = 0) -> str:
    """A note for a FLOP detail: the FLOPs of products whose results nothing uses (not counted)."""
    dead = rp.flops_between(start) - live
    return f" in ops whose results reach the output (+{dead:,} in products nothing uses, not counted)" if dead else ""


# flash_forward(q, k, v): what numbers the rows of each input for liveness.pair_keys (q's rows are queries,
# k's and v's rows are keys)
FORWARD_ROWS = {0: (liveness.QUERY, -2), 1: (liveness.KEY, -2), 2: (liveness.KEY, -2)}
HINT_TILES = ("S and P̃ exist one B_r × B_c tile at a time (§5.1): fold each tile into the running m, ℓ and acc of its "
              "rows (online softmax, §4.3) before the next K/V block; scores of many K/V blocks held together (a "
              "row panel from torch.cat or stack, tiles kept in a list or dict, a buffer written tile by tile) are "
              "the Nq × Nk matrix again, a row block at a time")


def check_tiles_live(rp: replay.Replayed, case: Any, *, fn: str, inputs: dict, rows: dict[int, tuple[int, int]],
                     limit: int | None = None, hint: str = HINT_TILES, lives: liveness.Lives | None = None,
                     what: str | None = None) -> None:
    """§5.1: the scores of a query row exist one K/V block at a time. liveness.pair_keys tags every element
    of the replay with the query row and the key it is indexed by and measures, at every op, how many keys
    the live (query, key) data of one query row spans (S, P̃, dP, dS and anything moved or computed from them
    element by element; m, ℓ, acc, o are reduced over the keys). A correct program, whatever its loop
    order, (batch, head) grouping, dtype or per-key updates, holds one K/V block: at most B_c keys (`limit`)."""
    limit = min(case.block_k, case.nk) if limit is None else limit
    span = liveness.pair_keys(rp, rows, lives)
    if span.keys <= limit:
        return
    shapes = ", ".join(str(s) for s in span.shapes[:3])
    if span.unfollowed:
        detail = f"{span.unfollowed} (the grader then counts every key); live then: tensors of shapes {shapes}"
    else:
        detail = (f"at op {span.at} of the call, scores of query row {span.row} for keys {span.lo}..{span.hi} "
                  f"({span.keys} keys) existed at once, in tensors of shapes {shapes}; a K/V block has {limit}")
    check(False, what=what or (f"{fn} holds S and P̃ one B_r × B_c tile at a time (§5.1): the live scores of a "
                               f"query row span at most B_c keys"),
          detail=detail, hint=hint, inputs=inputs)


def check_key_extents(rp: replay.Replayed, case: AttnCase, *, fn: str, inputs: dict,
                      sides: dict[int, int] | None = None, hint: str | None = None) -> None:
    """Every matmul between query-side and key-side data spans at most B_c keys, and batches at most the
    call's (batch, head) pairs (key_extents), so that the call really works one (Q block, K/V block) tile
    at a time: a B_r × Nk row panel has storage below Nq × Nk and, trimmed to whole visible blocks, the
    tiled matmul FLOPs; keys moved onto a bmm's batch dim would escape a bound on its matrix dims."""
    tile = min(case.block_k, case.nk)
    limits = {"keys": tile, "tile": max(case.block_q, case.block_k, case.d, case.d_v),
              "batch": max(1, math.prod(case.lead))}
    wide = [e for e in key_extents(rp, sides) if e.n > limits[e.bound]]
    if not wide:
        return
    e = wide[0]
    detail = (f"{e.what} has a batch of {e.n}; the call has {limits['batch']} (batch, head) pairs, and the keys of a "
              f"tile belong on its matrix dims" if e.bound == "batch" else
              f"{e.what} spans {e.n} keys; a K/V block has B_c = {tile}")
    check(False, what=f"{fn} multiplies one (Q block, K/V block) tile at a time", detail=detail,
          hint=hint or HINT_PANEL, inputs=inputs)


HINT_PANEL = ("S = Q Kᵀ and P̃ V exist one B_r × B_c tile at a time (§5.1): loop over the K/V blocks with the online "
              "softmax (rescale m, ℓ and O per block, §4.3) instead of scoring a row block against many keys at once")
# Every matmul overload the allow-list takes (replay.ALLOWED) -> the positions of its two factors;
# a vector factor is read as the row or column that mm would make of it (_as_matrix).
_MATMULS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2),
            "mv": (0, 1), "addmv": (1, 2), "dot": (0, 1), "vdot": (0, 1)}


def _as_matrix(t: torch.Tensor, first: bool) -> tuple[int, ...] | None:
    """The shape of a matmul factor as a matrix: a vector is a row (first factor) or a column (second)."""
    if t.dim() >= 2:
        return tuple(t.shape)
    if t.dim() == 1:
        return (1, t.shape[0]) if first else (t.shape[0], 1)
    return None


QUERY_SIDE, KEY_SIDE, VALUE_SIDE = 1, 2, 4  # what a tensor of the replay derives from (bits)
FORWARD_SIDES = {0: QUERY_SIDE, 1: KEY_SIDE, 2: VALUE_SIDE}  # flash_forward(q, k, v)


class Extent(NamedTuple):
    what: str  # the product, e.g. "S = Q·Kᵀ"
    index: int  # its op in the replay
    n: int  # the extent
    bound: str  # what bounds it: "keys" (B_c), "tile" (a tile's largest dim), "batch" (the (batch, head) pairs)


class _PerRef(dict):
    """ref -> fn(the replay's tensor of ref, ref), worked out on first use."""

    def __init__(self, env: dict[int, Any], fn: Callable[[Any, int], Any]) -> None:
        super().__init__()
        self.env, self.fn = env, fn

    def __missing__(self, ref: int) -> Any:
        value = self[ref] = self.fn(self.env.get(ref), ref)
        return value


def _node(t: Any, ref: int) -> Any:
    """A tensor's SideFlow node: its storage's data pointer (what is written into a buffer through any view
    reaches every view of it), or ("ref", ref) for a tensor without a readable storage."""
    try:
        ptr = t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None
    except (RuntimeError, NotImplementedError):
        ptr = None
    return ptr if ptr is not None else ("ref", ref)


class SideFlow:
    """What Sides follows through each op of a replay, worked out once per replay (side_flow): the
    nodes (_node: storages) the op passes sides from (`reads`) and to (`writes`). All of it is a
    function of the replay's own final tensors (shapes, strides, storages), none of a walk's state, so
    every walk of the replay shares it."""

    def __init__(self, rp: replay.Replayed) -> None:
        self.node = _PerRef(rp.env, _node)  # ref -> its node
        self.reads: list[tuple[Any, ...]] = []  # per op: the nodes it passes sides from
        self.writes: list[tuple[Any, ...]] = []  # per op: the nodes of its tensor leaves
        self.shape_only: list[bool] = []  # per op: its values come from shapes and numbers (replay._SHAPE_ONLY)
        self.matmuls: list[int] = []  # the ops key_extents measures: matmuls (_MATMULS) with their tensors in place
        self.mixing: list[int] = []  # the ops hand_made_products looks at: any other op of data that reads two tensors
        node, number = self.node, _PerRef(rp.env, lambda t, ref: _is_number(t))
        shape_only_kinds = replay._SHAPE_ONLY
        for index, op in enumerate(rp.prepared):
            info = op.info
            kind = info.kind
            reads = op.reads
            plain = info.short.removesuffix("_")  # baddbmm_ multiplies like baddbmm
            if plain in _MATMULS and op.fast is not None:
                self.matmuls.append(index)
            if not info.view and plain not in _MIXING_ALLOWED and kind not in shape_only_kinds \
                    and info.trusted is None and len(reads) > 1:  # (a judge:: op is the judge's own code)
                self.mixing.append(index)
            leaves = op.leaves
            if kind == "elementwise" and (out := _first_out(rp, op)) is not None and out.numel() > 1:
                # a number spread over an elementwise op's output passes on no side (k + 0·q[0, 0] is k)
                self.reads.append(tuple([node[ref] for ref in reads if not number[ref]]))
            else:
                self.reads.append(tuple([node[ref] for ref in reads]))
            self.writes.append((node[leaves[0]],) if len(leaves) == 1 and type(leaves[0]) is int else
                               tuple([node[leaf] for leaf in leaves if type(leaf) is int]))
            self.shape_only.append(kind in shape_only_kinds)


def side_flow(rp: replay.Replayed) -> SideFlow:
    """rp's SideFlow, made on first use and kept with the replay (rp.analyses): key_extents,
    hand_made_products, scores_like_shapes and liveness.peak_score_like all walk the same replay."""
    flow = rp.analyses.get("side_flow")
    if flow is None:
        flow = rp.analyses["side_flow"] = SideFlow(rp)
    return flow


class Sides:
    """What each tensor of a replay derives from (QUERY_SIDE / KEY_SIDE / VALUE_SIDE bits), followed op
    by op from `sides` (input ref -> bits; default the forward's q, k, v) with `follow`. Followed per
    storage: data written in place into a buffer (copy_, index_put_, slice assignment) reaches every
    view of it, also one taken before the write (a view's own bits never differ from its storage's, so
    the bits are kept per storage: SideFlow's nodes). With `data_only`, ops whose values come from
    shapes and numbers (ones_like, new_zeros, arange: replay._SHAPE_ONLY) pass on no side: positions
    counted by a cumsum of ones_like(q) derive from no data."""

    def __init__(self, rp: replay.Replayed, sides: dict[int, int] | None = None, data_only: bool = False) -> None:
        self.rp, self.data_only = rp, data_only
        self.flow = side_flow(rp)
        self.at = 0  # the ops followed so far: [0, at)
        self.storage: dict[Any, int] = {}  # node (a storage's data pointer, or ("ref", ref)) -> bits
        for ref, m in (FORWARD_SIDES if sides is None else sides).items():
            n = self.flow.node[ref]
            self.storage[n] = self.storage.get(n, 0) | m

    def of(self, ref: int) -> int:
        return self.storage.get(self.flow.node[ref], 0)

    def follow(self, end: int | None = None) -> None:
        """Follow the ops from the last one followed up to `end` (exclusive; None: all of them), in order:
        each passes the bits of what it reads on to what it writes."""
        flow, bits = self.flow, self.storage
        end = len(flow.reads) if end is None else end
        reads, writes = flow.reads, flow.writes
        skip = flow.shape_only if self.data_only else None
        for index in range(self.at, end):
            if skip is not None and skip[index]:
                continue
            m = 0
            for n in reads[index]:
                m |= bits.get(n, 0)
            if m:
                for n in writes[index]:
                    bits[n] = bits.get(n, 0) | m
        self.at = max(self.at, end)


def score_and_value_flops(rp: replay.Replayed, live: list[bool]) -> tuple[int, int]:
    """Matmul FLOPs (as the replay counts them, broadcast products included) of the live ops that make
    scores (an operand derived from k alone, none from v: S = Q·Kᵀ) and of those that weigh values (an
    operand derived from v: P̃·V), in flash_forward's replay. A forward computes each score it uses once
    and weighs V by it once: 2·d FLOPs for the one per 2·dv for the other. (Other products, P̃ @ ones
    say, are neither: the FLOP range sees them.)"""
    sd = Sides(rp)
    at, score, value = rp.flops_at, 0, 0
    for index, op in enumerate(rp.prepared):
        flops = at[index + 1] - at[index]
        if not flops or not live[index]:
            continue
        sd.follow(index)
        bits = [sd.of(ref) for ref in op.reads]
        if any(b & VALUE_SIDE for b in bits):
            value += flops
        elif any(b & KEY_SIDE and not b & QUERY_SIDE for b in bits):
            score += flops
    return score, value


HINT_SCORED_TWICE = ("the scores were computed more often than V was weighed by them: each score S_ij = q_i·k_j is made "
                     "once and used at once (online softmax: rescale m, ℓ and acc per K/V block, §5.1); a first pass "
                     "for the row max and a second for exp(S - m) computes S twice")


def check_scored_once(rp: replay.Replayed, case: AttnCase, live: list[bool], *, inputs: dict) -> None:
    """The FLOPs of S = Q·Kᵀ and of P̃·V match (2·d and 2·dv per computed score): a two-pass softmax over
    tiles (the row max first, then exp(S - m)) scores every tile twice, within the causal FLOP range."""
    score, value = score_and_value_flops(rp, live)
    dv = case.d_v
    check(score * dv == value * case.d, what="flash_forward computes each score once: matmul FLOPs of S = Q·Kᵀ "
                                             "equal those of P̃·V",
          detail=f"S = Q·Kᵀ: {score:,} FLOPs, P̃·V: {value:,}", hint=HINT_SCORED_TWICE if score > value else HINT_MORE,
          inputs=inputs)


def scores_like_shapes(rp: replay.Replayed, sides: dict[int, int] | None = None) -> list[tuple[int, ...]]:
    """Shapes of the replay's new tensors (one per new storage) that derive from both the query side
    and the key side: score tiles, P̃, statistics, accumulators, the outputs; a row panel of S or a
    whole row of scores, however it was put together (one matmul, or tiles concatenated)."""
    sd = Sides(rp, sides)
    sd.follow()
    return [tuple(rp.env[ref].shape) for ref in rp.new_storage_of
            if isinstance(rp.env.get(ref), torch.Tensor) and sd.of(ref) & QUERY_SIDE and sd.of(ref) & KEY_SIDE]


def key_extents(rp: replay.Replayed, sides: dict[int, int] | None = None) -> list[Extent]:
    """For each matmul of the replay that multiplies query-side data with k- or v-derived data: how
    many keys it spans, and its batch. What each tensor derives from is followed through every op of
    the replay, from `sides` (input ref -> QUERY_SIDE / KEY_SIDE / VALUE_SIDE; default the forward's
    q, k, v; the backward adds dO, o and lse on the query side). S = Q·Kᵀ and dP = dO·Vᵀ span the
    k/v side's free dim; P̃·V and dS·K their contraction. When both sides derive from the query side
    (P̃ᵀ·dO, dSᵀ·Q, or data mixed on purpose), every dim of both must fit a tile: the largest of them is
    reported. The batch of a bmm (its leading dims) is reported too: keys there would escape the rest."""
    Q, K, V = QUERY_SIDE, KEY_SIDE, VALUE_SIDE
    sd = Sides(rp, sides)
    found = []
    prepared = rp.prepared
    for index in sd.flow.matmuls:
        op = prepared[index]
        sd.follow(index + 1)  # the op's own output too
        where = _MATMULS[op.info.short.removesuffix("_")]  # baddbmm_ multiplies like baddbmm
        slots = dict(op.fast[1])
        if where[0] not in slots or where[1] not in slots:
            continue
        (ra, rb) = slots[where[0]], slots[where[1]]
        a, b = rp.env.get(ra), rp.env.get(rb)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        sa, sb = _as_matrix(a, True), _as_matrix(b, False)
        if sa is None or sb is None:
            continue
        ma, mb = sd.of(ra), sd.of(rb)
        if not (ma | mb) & Q or not (ma | mb) & (K | V):
            continue
        if bool(ma & Q) == bool(mb & Q):  # both (or neither) derive from q: no side is the key side
            found.append(Extent("a product of q- and k/v-derived tiles", index, max(*sa[-2:], *sb[-2:]), "tile"))
        # The query side's own dims index keys once it derives from k or v (P̃ from S, dP = dO·Vᵀ, dS with or
        # without its P factor): then the product contracts over keys. Pure query-side data (q, dO) meets
        # Kᵀ / Vᵀ, and the keys are the free dim.
        elif ma & Q:  # A is the query side: B is Kᵀ / Vᵀ (free dim: keys) or K / V (contraction: keys)
            found.append(Extent("S = Q·Kᵀ", index, sb[-1], "keys") if not ma & (K | V)
                         else Extent("P̃·V", index, sb[-2], "keys"))
        else:  # B is the query side: A is K / V (free dim: keys) or Kᵀ / Vᵀ (contraction: keys)
            found.append(Extent("Sᵀ = K·Qᵀ", index, sa[-2], "keys") if not mb & (K | V)
                         else Extent("Vᵀ·P̃ᵀ", index, sa[-1], "keys"))
        batch = max(math.prod(sa[:-2]), math.prod(sb[:-2]))
        if batch > 1:
            found.append(Extent(f"the batched matmul {op.info.short}", index, batch, "batch"))
    return found


def _first_out(rp: replay.Replayed, op: Any) -> torch.Tensor | None:
    leaf = op.leaves[0] if op.leaves else None
    t = rp.env.get(leaf) if type(leaf) is int else None
    return t if isinstance(t, torch.Tensor) else None


def _is_number(t: Any) -> bool:
    """A tensor of one distinct value (one element, or one expanded): in arithmetic, a number."""
    return not isinstance(t, torch.Tensor) or replay._effective_numel(t) <= 1


# ops that may read query-side and key-side data together: the matmuls (their FLOPs are counted;
# einsum never reaches a record: the dispatcher lowers it to bmm, mul and views)
_MIXING_ALLOWED = frozenset(_MATMULS)


class HandMade(NamedTuple):
    index: int  # the op in the replay
    op: str
    shapes: tuple[tuple[int, ...], tuple[int, ...]]  # a query-side operand's shape, a key/value-side one's


def hand_made_products(rp: replay.Replayed, sides: dict[int, int] | None = None) -> list[HandMade]:
    """The ops other than matmuls that read data made from the query side only together with data made
    from the key or value side only (Sides of data, from `sides`). A correct program
    meets q with k and v in matmuls only (S = Q·Kᵀ, dP = dO·Vᵀ; what follows mixes their results); the
    same product written otherwise (q_i * k summed over d, a stack of q and k reduced by prod, exp of a
    sum of logs, a gather of k by an index made from q) is a matmul whose FLOPs no rule counts. Exempt:
    a mul that is an outer product over a dim of extent 1 in both (a contraction of length one, as
    einsum lowers it: the replay counts its FLOPs)."""
    Q, KV = QUERY_SIDE, KEY_SIDE | VALUE_SIDE
    sd = Sides(rp, sides, data_only=True)
    found: list[HandMade] = []
    prepared = rp.prepared
    for index in sd.flow.mixing:
        op = prepared[index]
        name = op.info.short.removesuffix("_")
        sd.follow(index)  # before the op writes (an in-place mul_ mixes its operands' sides)
        q_only = kv_only = None
        tensors = []
        for ref in op.reads:
            t = rp.env.get(ref)
            if not isinstance(t, torch.Tensor):
                continue
            tensors.append(t)  # a number made from q is data too: q_ic · k_jc summed over c is q_i · k_j
            bits = sd.of(ref)
            if bits & Q and not bits & KV:
                q_only = q_only if q_only is not None else tuple(t.shape)
            elif bits & KV and not bits & Q:
                kv_only = kv_only if kv_only is not None else tuple(t.shape)
        if q_only is not None and kv_only is not None:
            out = _first_out(rp, op)
            over_one = name == "mul" and len(tensors) == 2 and out is not None and \
                liveness._outer_over_one(tensors, tuple(out.shape))
            if not over_one:
                found.append(HandMade(index, op.info.short, (q_only, kv_only)))
    return found


HINT_HAND_MADE = ("multiply q with k (and P̃ or dO with v) only in matmuls on tiles: S = Q_i K_jᵀ, P̃ V_j, dP = dO V_jᵀ "
                  "with @ / torch.matmul (§5.1, §7.2); an elementwise product of query-side and key-side data (a "
                  "broadcast multiply + sum, a row of q times k summed over d) is a matmul written by hand, and the "
                  "FLOP and tile rules count matmuls")


def check_no_hand_made_products(rp: replay.Replayed, fn: str, inputs: dict,
                                sides: dict[int, int] | None = None) -> None:
    """hand_made_products finds nothing: query-side and key-side data meet in matmuls only."""
    found = hand_made_products(rp, sides)
    if not found:
        return
    h = found[0]
    check(False, what=f"{fn} multiplies query-side with key-side data in matmuls only",
          detail=(f"op {h.index} of the call ({h.op}) combines a {h.shapes[0]} tensor made from the query side only "
                  f"with a {h.shapes[1]} tensor made from k or v only, outside a matmul"
                  + (f" ({len(found)} such ops)" if len(found) > 1 else "")),
          hint=HINT_HAND_MADE, inputs=inputs)


def forward_peak_bound(case: AttnCase) -> int:
    """The most elements of data made from both q and k (liveness.peak_score_like) that a correct forward
    holds at once, all (batch, head) pairs together (lead of them), from this analysis:
    - the outputs o and lse, Nq·(dv + 1) per pair, live from their allocation to the end; FA1's loop order
      (K/V blocks outer) keeps m, ℓ and acc of every row as well, Nq·(dv + 2), and makes o and lse from
      them at the end: Nq·(2·dv + 3);
    - inside the loops, one (Q block, K/V block) tile of B_r × B_c and what follows from it (masked S,
      S - m, P̃: each read by the next, two live at once, a third for a float64 copy or an einsum's
      reshape), and m, ℓ, acc of the Q block with their updates (old and new values, α, acc·α, P̃V: up to
      three B_r·(dv + 2) at once): 3·B_r·(B_c + dv + 2), with B_r and B_c the tile's extents (a Q block of
      Nq < block_q rows is Nq rows). One of those three units may be a buffer sized for a whole tile,
      block_q × (block_k + dv + 2), allocated once and written tile by tile (a GPU's shared memory is): with
      Nq = 1 and block_q = 32 such a buffer holds 32 rows where the tile has one, and is still one tile.
    Measured over the catalogue (instructor/equivalents, every part-2 case): beyond Nq·(2·dv + 3) the
    reference uses at most 1.55 of those 3 units, the worst variants 1.82 (the causal mask counted by a
    cumsum of ones_like(S), made "from q and k" by its shape) and 1.76 (FA2 with m, ℓ, acc of all rows in
    buffers); tests/test_liveness.py checks the reference against 2 units on the long-row cases."""
    lead = math.prod(case.lead)
    br, bc, dv = min(case.block_q, case.nq), min(case.block_k, case.nk), case.d_v
    return lead * (case.nq * (2 * dv + 3) + 2 * br * (bc + dv + 2) + case.block_q * (case.block_k + dv + 2))


def peak_separates(case: AttnCase) -> bool:
    """Whether one (batch, head)'s row panel, B_r × Nk scores live at once (one copy, written in place),
    next to the outputs o and lse of every pair, exceeds forward_peak_bound: where the peak tells a tiled
    forward from a row panel however it was put together."""
    lead = math.prod(case.lead)
    return min(case.block_q, case.nq) * case.nk + lead * case.nq * (case.d_v + 1) > forward_peak_bound(case)


def check_peak(rp: replay.Replayed, case: AttnCase, *, fn: str, inputs: dict) -> None:
    """§5.1 measured as memory: the peak of live data made from q and k stays within forward_peak_bound."""
    peak = liveness.peak_score_like(rp)
    bound = forward_peak_bound(case)
    check(peak.elements <= bound,
          what=f"{fn} holds the scores one B_r × B_c tile at a time (§5.1): at most {bound:,} elements made from q "
               f"and k live at once",
          detail=f"at op {peak.at} of the call, {peak.elements:,} elements made from q and k were live at once "
                 f"(the largest: {', '.join(str(s) for s, _ in peak.largest[:3])}); o, lse, m, ℓ and acc of every "
                 f"row and three tiles with their Q block's statistics are {bound:,}", hint=HINT_TILES, inputs=inputs)


def check_forward_trace(student, case: AttnCase, *, hidden: bool = False) -> None:
    """flash_forward replayed: no fused op, no Nq×Nk storage, exact matmul FLOPs, one tile of scores at a
    time (also measured as memory where the shapes separate), and a correct result."""
    assert separates(case) and matmul_flops_defined(case), f"test bug: {case.id} cannot separate tiled from naive"
    rp, q, k, v = replayed_forward(student, case)
    inputs = case.shown(q, k, v)
    check_forward_structure(rp, case, inputs=inputs)
    o, _ = unpack(rp.result, 2, what="flash_forward returns (o, lse)")
    ref_o, _ = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, _ = attention_plain(q, k, v, case.causal, case.scale)
    diag = dict(causal=case.causal, block_q=case.block_q, block_k=case.block_k, scale=case.scale, where=not hidden,
                student=student)
    close_or_diagnose(o, ref_o, what="o of the replayed flash_forward call (the counts are of a correct result)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR,
                      diagnose=lambda bound: dg.diagnose_forward(o, "o", q, k, v, tol=bound, **diag))
