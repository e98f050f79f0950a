"""Part 1 (online_softmax.py): cases and checks shared by the public and the hidden tests.

Checked three ways:
(a) against float64 references computed here in the judge (torch.softmax / torch.logsumexp math
    on the same values), with the tolerance policy of autograder/README.md;
(b) conventions: ⊕ has the identity (-inf, 0, 0); two empty sides give no NaN; ⊕ is commutative and
    associative (hypothesis draws rows of scores, the judge summarises them, the student merges the
    summaries, in both orders and both groupings); rows scaled ×40 or
    shifted by +1000 do not overflow in the safe and online softmax; an all -inf row gives zeros;
(b') one streaming pass (§4.3): online_summary, and online_softmax's summary, must read x's columns in ONE
    pass: streaming.column_order follows, in the judge's replay, which columns every value depends on and
    bounds what an op folds in at once by N/2 columns (a tile of at most half the row; the whole row at
    once, or a second pass that combines column 0 with a max of all columns, fails). It runs on one
    designated input per test set (STREAM here; the hidden cases name theirs), once per submission
    (cached by its text), and every case of those tests checks that verdict after its values;
(c) counters, judge-side: the *_counted softmaxes read their input 2 / 3 / 2 times, counted BY THE
    JUDGE as the input elements it had to deliver (the values stay in the judge; the worker's counter
    asks for each block of 256 as it is read: scenarios/part1.py), and each pass computes from what it
    read: the judge serves every pass its own values (pass_values), so reads that compute nothing (x
    kept from one pass, the others only walked over) give other probabilities. The rebase count (a return
    value) equals the count the judge recomputes from the values.

Every tensor function is recorded in the worker and replayed by the judge (autograder/engine/
replay.py): the checks grade the REPLAY's output, and a twin replay on judge-drawn inputs must
compute the reference of those inputs (an answer computed outside the call cannot).

Tolerances (the 2×-plain rule of the README presumes the plain code's summation order; a softmax
here may sum sequentially, so part 1 uses rigorous rounding bounds instead, and why):
- m (a maximum) is exact in any dtype: compared with atol = rtol = 0.
- softmax outputs: |Δp| <= atol + 4(n+2)·eps·p (softmax_rtol), atol 1e-6 (float32) / 1e-10 (float64).
- ℓ of online_summary is a sequential sum of n positive terms with up to n rebases. The rounding
  error of recursive summation of positive terms is at most (n-1)·u relative, exp adds ~u per
  term and each rebase ~2u, so |Δℓ|/ℓ <= 4(n+2)·u; we allow 4(n+2)·eps = 8(n+2)·u (u = eps/2).
  The known bug (no rescale) is off by a factor exp(m_old - m_new), i.e. O(1).
- ⊕ of two summaries is 2 exps, 2 products and 1 sum of positive terms; the rounding of m_a - m
  adds at most u·|Δ|·e^Δ <= u/e relative: 64·eps relative on ℓ per ⊕ (tolerances rule 5).
- The judge holds no ⊕: every merge check takes its expected value from the scores. The segments
  a, b are the judge's float64 summaries of x[..., :s] and x[..., s:] (rounded to the case dtype),
  and a ⊕ b must be the float64 summary of the whole rows x. m is exact (a max of representable
  values). ℓ: tolerances.merge_data_rtol = 64·eps per ⊕ + u for the one rounding of each of ℓ_a, ℓ_b
  (⊕ is a positive combination, so it moves the result by <= u·ℓ) + 2·summary_rtol(n, float64) for
  the judge's float64 sums (the segments' and the whole row's). o (mixed signs): the same factor as
  an absolute bound, scaled by max Σ_j exp(x_j - m)·|v_j| of the whole rows (tolerances rule 5b).
  The twin replay's inputs are summaries of other scores, its reference their whole rows' summary.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import CheckFailure, check, check_close, join_hints, unpack

from . import probes as pb
from . import streaming

DTYPES = {"float32": torch.float32, "float64": torch.float64}
FN = "online_softmax"
NEG_INF = float("-inf")

HINTS = {
    "naive_softmax": "naive_softmax is exp(x) / Σ_j exp(x_j) over the LAST dim, in the input's dtype (§4.1)",
    "safe_softmax": "safe_softmax subtracts the row max m before exp, so no exponent is > 0 (§4.2); "
                    "a row of all -inf has no max to subtract and gives zeros",
    "online_softmax": "online_softmax is exp(x - m) / ℓ with (m, ℓ) from ONE streaming pass (online_summary, "
                      "§4.3); rows ×40 or +1000 must not overflow, an all -inf row gives zeros",
    "summary_m": "m is the running maximum over the columns; an empty or all -inf row keeps m = -inf (§4.3)",
    "summary_l": "ℓ = Σ_j exp(x_j - m) with the FINAL max m, kept in one pass: when the running max grows, "
                 "ℓ is rescaled by exp(m_old - m_new) (§4.3)",
    "stream": "one streaming pass: keep the running (m, ℓ) of the columns read so far and fold each column x[..., j] "
              "into it (or a tile of at most N/2 columns, its summary merged with ⊕), rebasing ℓ by exp(m_old - m_new) "
              "(§4.3, §4.4); the row max first and then Σ exp(x - m) reads x twice",
    "stream_softmax": "online_softmax takes (m, ℓ) from ONE streaming pass (online_summary, §4.3), then normalises "
                      "exp(x - m) / ℓ; it makes no other max or sum of x",
    "summary_new_term_unshifted": "ℓ of one value is exp(x_0 - m) = 1 and yours is exp(x_0): the max shift is missing from "
                                  "the new term (no shift at all, or a shift by 0 or by the old max): ℓ = ℓ·exp(m_old - "
                                  "m_new) + exp(x_j - m_new), both with the NEW max (§4.3)",
    "summary_no_shift": "ℓ is Σ_j exp(x_j) without the max shift: ℓ = Σ_j exp(x_j - m) is relative to the running "
                        "max m, every term <= 1 (§4.3)",
    "merge": "⊕ rebases both sides on m = max(m_a, m_b): ℓ = ℓ_a·exp(m_a - m) + ℓ_b·exp(m_b - m) (§4.4)",
    "merge_partial": "merge_partial rescales ℓ AND the unnormalised o by exp(m_a - m) and exp(m_b - m), "
                     "o over its trailing value dim (unsqueeze the factors) (§4.5)",
    "identity": "missing -inf guard: (-inf, 0) ⊕ (-inf, 0) hits exp(-inf - (-inf)) = NaN; when the new max "
                "is -inf, rebase on 0 instead, so the empty summary stays the identity of ⊕ (§4.4)",
    "algebra": "⊕ must be commutative and associative (§4.4): merge in any order or grouping and get the "
               "same (m, ℓ); check the rebase and the -inf guard",
    "passes": {
        "naive": "naive_softmax_counted must read each element exactly twice: one pass summing exp(x_j), "
                 "one dividing (§4.1)",
        "safe": "safe_softmax_counted must read each element exactly three times: max, sum of exp(x_j - m), "
                "normalise (§4.2)",
        "online": "online_softmax_counted must read each element exactly twice: one pass keeping the running "
                  "(m, ℓ), one normalising (§4.3)",
    },
    "rebases": "online_softmax_counted must return the number of rebases: the times a LATER element (not the "
               "first) raises the running max, i.e. ℓ is rescaled by exp(m_old - m_new) (§4.3)",
    "rebase_ties": "an element EQUAL to the running max does not raise it: no rebase on a tie (count x_j > m, "
                   "not x_j >= m) (§4.3)",
}


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


# ---------------------------------------------------------------------------------------------
# cases


@dataclass(frozen=True)
class RowsCase:
    """Rows x of shape (..., N), drawn from a fixed seed."""

    shape: tuple[int, ...] = (4, 113)
    dtype: str = "float32"
    seed: int = 0
    mult: float = 1.0  # ×40: peaked rows
    shift: float = 0.0  # +1000: exp(x) overflows unless the max is subtracted
    neg_inf: str = ""  # "" | "some": random -inf entries (column 0 stays finite) | "rows": whole rows -inf
    stream: "RowsCase | None" = None  # the one-pass check's designated input (check_streams; None: STREAM)
    # rows moved apart by this much each (row r of R by spread·(r - (R-1)/2)): the max must be each row's
    # own; one max for the whole tensor underflows the rows far below it
    spread: float = 0.0

    @property
    def id(self) -> str:
        bits = ["x".join(map(str, self.shape)), self.dtype]
        if self.mult != 1:
            bits.append(f"x{self.mult:g}")
        if self.shift:
            bits.append(f"{self.shift:+g}")
        if self.neg_inf:
            bits.append(f"neginf-{self.neg_inf}")
        if self.spread:
            bits.append(f"spread{self.spread:g}")
        return "-".join(bits) + f"-s{self.seed}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def naive_ok(self) -> bool:
        """Inputs on which the textbook exp(x)/Σexp(x) is defined (no overflow, no empty row)."""
        return self.mult == 1 and self.shift == 0 and not self.spread and self.neg_inf != "rows" and self.shape[-1] > 0

    def x64(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.shape, generator=g, dtype=torch.float64) * self.mult + self.shift
        if self.spread and x.dim() > 1:
            rows = x.reshape(-1, x.shape[-1])
            r = torch.arange(rows.shape[0], dtype=torch.float64)
            x = (rows + self.spread * (r - r.mean()).unsqueeze(-1)).reshape(x.shape)
        if self.neg_inf == "some" and x.shape[-1] > 1:
            mask = torch.rand(self.shape, generator=g, dtype=torch.float64) < 0.3
            mask[..., 0] = False
            x = x.masked_fill(mask, NEG_INF)
        elif self.neg_inf == "rows":
            rows = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1)
            rows[1::3] = NEG_INF  # rows 1, 4, 7, ...; with one row, the whole input
            if rows.shape[0] == 1:
                rows[0] = NEG_INF
        # round to the case dtype first, so the float64 reference sees exactly the student's input
        return x.to(self.torch_dtype).to(torch.float64)

    def x(self) -> torch.Tensor:
        return self.x64().to(self.torch_dtype)


# The designated input of the one-pass check (streaming.column_order) for the public cases: rows of 64
# columns, so that tiles of 8, 16 and 32 pass and a dense pass (63 or 64 columns at once) is far above N/2.
STREAM = RowsCase((2, 3, 64), "float32", seed=30)


@dataclass(frozen=True)
class MergeCase:
    """Two adjacent segments [0, split) and [split, N) of rows, summarised by the judge."""

    rows: RowsCase = RowsCase()
    split: int = 50  # 0 or N gives an empty side
    dv: int = 8

    @property
    def id(self) -> str:
        return f"{self.rows.id}-split{self.split}-dv{self.dv}"


# ---------------------------------------------------------------------------------------------
# float64 references and plain same-dtype implementations (judge side)


def ref_summary(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, ℓ) of each row in float64 (numpy: see probes.summary_of_scores), then in x's dtype:
    m = max, ℓ = Σ exp(x - m); empty/all -inf rows: (-inf, 0)."""
    return tuple(t.to(x.dtype) for t in pb.summary_of_scores(x))


def ref_partial(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, ℓ, o) with o = Σ_j exp(x_j - m) v_j unnormalised, in float64 (numpy), then in x's dtype.
    v: (..., N, dv)."""
    return tuple(t.to(x.dtype) for t in pb.summary_of_scores(x, v))


def ref_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (torch.softmax), with the handout's convention: all -inf row -> 0."""
    empty = torch.isneginf(x).all(dim=-1, keepdim=True)
    return torch.where(empty, torch.zeros_like(x), torch.softmax(x, dim=-1))


def case_data(case: MergeCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores x (..., N) of the case (dtype-representable, in float64) and values v (..., N, dv)."""
    rc = case.rows
    x = rc.x64()
    g = torch.Generator().manual_seed(rc.seed + 1000)
    return x, torch.randn(*x.shape, case.dv, generator=g, dtype=torch.float64)


def twin_data(x: torch.Tensor, v: torch.Tensor | None, dtype: torch.dtype, seed: int) -> tuple:
    """Other scores (and values) for a twin replay: x and v moved by up to 5 % (replay.perturbed: same
    shapes, same -inf entries), the scores still representable in dtype."""
    xt = replay.perturbed(x.to(dtype), seed).double()
    return xt, (None if v is None else replay.perturbed(v, seed + 1))


def summarise(x: torch.Tensor, v: torch.Tensor | None, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The judge's summary (m, ℓ) (or (m, ℓ, o) with v) of the rows x, computed in float64 from the
    scores and rounded to dtype: what a segment's summary looks like to the student."""
    out = ref_summary(x) if v is None else ref_partial(x, v)
    return tuple(t.to(dtype) for t in out)


def split_summaries(x: torch.Tensor, v: torch.Tensor | None, split: int, dtype: torch.dtype) -> tuple[tuple, tuple]:
    """(a, b): the summaries of the segments x[..., :split] and x[..., split:], rounded to dtype."""
    s = max(0, min(split, x.shape[-1]))
    if v is None:
        return summarise(x[..., :s], None, dtype), summarise(x[..., s:], None, dtype)
    return summarise(x[..., :s], v[..., :s, :], dtype), summarise(x[..., s:], v[..., s:, :], dtype)


def whole(x: torch.Tensor, v: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The float64 summary of the whole rows: the expected ⊕ of the summaries of any split of them."""
    return ref_summary(x) if v is None else ref_partial(x, v)


def _shown(a: tuple, b: tuple) -> dict[str, torch.Tensor]:
    shown = {"m_a": a[0], "l_a": a[1], "m_b": b[0], "l_b": b[1]}
    if len(a) == 3:
        shown.update(o_a=a[2], o_b=b[2])
    return shown


# ---------------------------------------------------------------------------------------------
# the student's calls, replayed by the judge


def replayed(student, fn: str, args: tuple, reference, seed: int = 1, **twin: Any) -> Any:
    """online_softmax.<fn>(*args) recorded in the worker and replayed by the judge: the replay's result.
    `reference(*judge_args)` is the float64 answer, which the twin replay must match on its inputs.
    twin: replay.call's twin_inputs= (the twin's (args, kwargs)) and main_reference= (the answer on the
    judge's copy of args, default `reference`)."""
    rp, _, _ = replay.call(student, f"{FN}.{fn}", tuple(args), seed=seed, reference=reference, **twin)
    return rp.result


def replayed_merge(student, fn: str, args: tuple, want: tuple, twin_args: tuple, twin_want: tuple) -> Any:
    """merge_summary / merge_partial replayed: the twin replay runs on `twin_args` (summaries of other
    scores) and must give `twin_want` (the summary of their whole rows); `want` is the answer on args.
    Both answers come from the scores, so neither reference is a ⊕ (they ignore their arguments)."""
    return replayed(student, fn, args, lambda *_: twin_want, twin_inputs=(tuple(twin_args), {}),
                    main_reference=lambda *_: want)


def _ref64(fn):
    return lambda *args: fn(*[tuple(t.double() for t in a) if type(a) is tuple else a.double() for a in args])


# ---------------------------------------------------------------------------------------------
# checks: (a) references


def softmax_rtol(n: int, dtype: torch.dtype) -> float:
    """Relative bound on a softmax computed with ANY summation order (see the module docstring):
    p = exp(x - m) / ℓ inherits ℓ's 4(n+2)·u plus ~2u for exp and the division; we allow
    4(n+2)·eps = 8(n+2)·u. (The 2×-plain rule assumes the plain code's summation order: torch's
    blocked sum is ~log n·u accurate, a correct sequential online sum only ~sqrt(n)·u; at
    n ≈ 1000 and p ≈ 1 correct online code measured 2.2e-6 against an allowed 1.05e-6.)"""
    return tol.softmax_rtol(n, dtype)


@contextmanager
def probed(ladder: Callable[[], "pb.Finding"], recognise: Callable[["pb.Finding"], str | None] | None = None,
           keep: bool = True) -> Iterator[None]:
    """On a value failure inside the block, lead the hint with what the probes prove (and a recogniser's
    verdict on the failed probe); the check's own concept hint follows when `keep`."""
    try:
        yield
    except CheckFailure as failure:
        if failure.kind in ("type", "dtype", "shape"):
            raise
        try:
            finding = ladder()
            extra = recognise(finding) if recognise else None
            # the check's own concept hint, unless a recogniser named the bug or the probe found the failure
            # is not the NaN that hint is about (probes.Finding.finite_case)
            own = failure.hint if keep and not extra and not finding.finite_case else None
            parts = [finding.message(), extra, own]
            failure.hint = join_hints(*parts)
        except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
            failure.hint = f"{failure.hint} (probes unavailable: {type(exc).__name__})"
        failure.args = (failure.message(),)
        raise failure


def recognise_summary(finding: "pb.Finding") -> str | None:
    """ℓ of the failed probe equal to the unshifted Σ_j exp(x_j): the max shift is missing."""
    if finding.failed is None or finding.outputs is None or "ℓ" not in finding.wrong:
        return None
    x, l = finding.inputs, finding.outputs[1]
    if not isinstance(l, torch.Tensor) or l.shape != x.shape[:-1]:
        return None
    unshifted = torch.exp(x).sum(-1)
    ok = torch.isclose(l.double(), unshifted, rtol=1e-9, atol=0.0) | (torch.isinf(l) & torch.isinf(unshifted))
    if not bool(ok.all()):
        return None
    # one value: no shift at all and a shift by another max than the new one (0, the old one) give the same ℓ
    return HINTS["summary_no_shift"] if x.shape[-1] >= 2 else HINTS["summary_new_term_unshifted"]


def check_softmax(student, fn: str, case: RowsCase) -> None:
    x = case.x()
    out = replayed(student, fn, (x,), _ref64(ref_softmax))
    with probed(lambda: pb.softmax_ladder(student, fn)):
        check_close(out, ref_softmax(case.x64()), what=f"{fn}(x) against float64 softmax over the last dim",
                    inputs={"x": x}, rtol=softmax_rtol(x.shape[-1], x.dtype), hint=HINTS[fn], dtype=x.dtype)
    if fn == "online_softmax":
        check_streams(student, fn, case)


def check_summary(student, case: RowsCase) -> None:
    x = case.x()
    m, l = unpack(replayed(student, "online_summary", (x,), _ref64(ref_summary)), 2, what="online_summary(x) returns (m, ℓ)",
                  hint=HINTS["summary_l"])
    m_ref, l_ref = ref_summary(case.x64())
    with probed(lambda: pb.summary_ladder(student), recognise_summary):
        check_close(m, m_ref, what="m of online_summary(x): the row maximum", inputs={"x": x}, atol=0.0,
                    rtol=0.0, hint=HINTS["summary_m"], dtype=x.dtype)
        n = x.shape[-1]
        check_close(l, l_ref, what="ℓ of online_summary(x) against float64 Σ_j exp(x_j - m)", inputs={"x": x},
                    atol=0.0, rtol=tol.summary_rtol(n, x.dtype), hint=HINTS["summary_l"], dtype=x.dtype)
    check_streams(student, "online_summary", case)


def _merge_case(case: MergeCase, with_v: bool):
    """The case's segments (a, b), the expected ⊕ (the whole rows' summary), and a twin's (args, answer)."""
    dt = case.rows.torch_dtype
    x, v = case_data(case)
    v = v if with_v else None
    a, b = split_summaries(x, v, case.split, dt)
    xt, vt = twin_data(x, v, dt, seed=case.rows.seed + 2000)
    return x, v, (a, b), whole(x, v), (split_summaries(xt, vt, case.split, dt), whole(xt, vt))


def stream_order(student, fn: str, designated: RowsCase) -> streaming.Order:
    """streaming.column_order of online_softmax.<fn> on the designated input, replayed by the judge (its values
    and a twin on judge-drawn inputs must be right: a constant answer has no structure to measure). Once per
    grading run (student.memo: the run's own, never another submission's, whose other graded files may make
    the same online_softmax.py behave otherwise): every case of a test gates on the same verdict (a `student`
    without a memo, as in the release tests' direct calls, is measured each time)."""
    memo = getattr(student, "memo", None)
    orders = memo.setdefault("stream_order", {}) if memo is not None else None
    key = (fn, designated.id)
    hit = orders.get(key) if orders is not None else None
    if hit is not None:
        shares = getattr(student, "shares_state", None)
        if callable(shares):
            shares()  # a measurement an earlier call made: this test's pass is never reused (engine/transcripts.py)
        return hit
    ref = {"online_summary": ref_summary, "online_softmax": ref_softmax}[fn]
    x = designated.x()
    rp, (jx,), _ = replay.call(student, f"{FN}.{fn}", (x,), seed=designated.seed + 1, reference=_ref64(ref))
    wrong = replay.twin_error(rp.result, _ref64(ref)(jx))
    shown = {"x": tuple(x.shape)}
    check(wrong is None, what=f"{fn}(x) on the input of the one-pass check is right",
          detail=f"on x of shape {tuple(x.shape)}: {wrong}", hint=HINTS["summary_l" if fn == "online_summary" else fn],
          inputs=shown)
    order = streaming.column_order(rp)
    if orders is not None:
        orders[key] = order
    return order


def check_streams(student, fn: str, case: RowsCase) -> None:
    """§4.3: the summary is made in one streaming pass over the columns (streaming.column_order on the case's
    designated input, STREAM unless it names another)."""
    designated = case.stream or STREAM
    order = stream_order(student, fn, designated)
    check(order.ok, what=f"{fn} reads the columns of x in one streaming pass (§4.3)",
          detail=order.describe(fn),
          hint=HINTS["stream" if fn == "online_summary" else "stream_softmax"], inputs={"x": designated.shape})


def check_merge_summary(student, case: MergeCase) -> None:
    """a ⊕ b of the summaries of x[..., :s] and x[..., s:] against the summary of the whole rows x."""
    x, _, (a, b), (m_ref, l_ref), (twin_args, twin_want) = _merge_case(case, with_v=False)
    dt, shown = case.rows.torch_dtype, _shown(a, b)
    m, l = unpack(replayed_merge(student, "merge_summary", (a, b), (m_ref, l_ref), twin_args, twin_want), 2,
                  what="merge_summary(a, b) returns (m, ℓ)", hint=HINTS["merge"])
    empty = bool((torch.isneginf(a[0]) & torch.isneginf(b[0])).any())
    hint = HINTS["identity"] if empty else HINTS["merge"]
    with probed(lambda: pb.merge_ladder(student, "merge_summary")):
        check_close(m, m_ref, what="m of merge_summary(a, b) = max(m_a, m_b)", inputs=shown, atol=0.0, rtol=0.0,
                    hint=hint, dtype=dt)
        check_close(l, l_ref, what="ℓ of merge_summary(a, b) against the float64 summary of both segments' scores",
                    inputs=shown, atol=0.0, rtol=tol.merge_data_rtol(x.shape[-1], dt), hint=hint, dtype=dt)


def check_merge_partial(student, case: MergeCase) -> None:
    """a ⊕ b of the (m, ℓ, o) of two key segments against the (m, ℓ, o) of all the keys at once."""
    x, v, (a, b), (m_ref, l_ref, o_ref), (twin_args, twin_want) = _merge_case(case, with_v=True)
    dt, shown = case.rows.torch_dtype, _shown(a, b)
    m, l, o = unpack(replayed_merge(student, "merge_partial", (a, b), (m_ref, l_ref, o_ref), twin_args, twin_want), 3,
                     what="merge_partial(a, b) returns (m, ℓ, o)", hint=HINTS["merge_partial"])
    empty = bool((torch.isneginf(a[0]) & torch.isneginf(b[0])).any())
    hint = HINTS["identity"] if empty else HINTS["merge_partial"]
    rtol = tol.merge_data_rtol(x.shape[-1], dt)
    with probed(lambda: pb.merge_ladder(student, "merge_partial")):
        check_close(m, m_ref, what="m of merge_partial(a, b) = max(m_a, m_b)", inputs=shown, atol=0.0, rtol=0.0,
                    hint=hint, dtype=dt)
        check_close(l, l_ref, what="ℓ of merge_partial(a, b) against the float64 summary of both segments' scores",
                    inputs=shown, atol=0.0, rtol=rtol, hint=hint, dtype=dt)
    with probed(lambda: pb.merge_ladder(student, "merge_partial")):
        normalised = o_ref / torch.where(l_ref == 0, torch.ones_like(l_ref), l_ref).unsqueeze(-1)
        check_close(o, o_ref, what="o of merge_partial(a, b) against float64 Σ_j exp(x_j - m) v_j over both segments "
                                   "(o unnormalised)", inputs=shown, atol=rtol * tol.merge_data_scale(x, v), rtol=0.0,
                    hint=hint, dtype=dt,
                    others={"o / ℓ, normalised, instead: ⊕ keeps o unnormalised (Σ_j exp(x_j - m) v_j, §4.5); divide "
                            "by ℓ only once, at the very end": normalised})


# ---------------------------------------------------------------------------------------------
# checks: (b) conventions


def _operand(lead: tuple[int, ...], dt: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A non-empty (m, ℓ, o) in dtype: m of either sign, ℓ in [1, 51], o of mixed signs."""
    g = torch.Generator().manual_seed(seed)
    m = (torch.randn(lead, generator=g, dtype=torch.float64) * 5).to(dt)
    l = (1 + torch.rand(lead, generator=g, dtype=torch.float64) * 50).to(dt)
    return m, l, torch.randn(*lead, 4, generator=g, dtype=torch.float64).to(dt)


def check_identity(student, dtype: str, lead: tuple[int, ...] = (5,), seed: int = 0) -> None:
    """a ⊕ (-inf, 0) = a = (-inf, 0) ⊕ a, and (-inf, 0) ⊕ (-inf, 0) = (-inf, 0) with no NaN (also with o).
    The expected value is the non-identity operand itself (no ⊕ computed here); the twin replay runs on
    another operand with the identity in the same place, and must give that operand."""
    dt = DTYPES[dtype]
    m, l, o = _operand(lead, dt, seed)
    mt, lt, ot = _operand(lead, dt, seed + 1)
    ident = (torch.full(lead, NEG_INF, dtype=dt), torch.zeros(lead, dtype=dt))
    ident_o = (*ident, torch.zeros(*lead, 4, dtype=dt))
    shown = {"m": m, "l": l}
    for what, left, right, want, twin in (
        ("a ⊕ (-inf, 0) = a", (m, l), ident, (m, l), ((mt, lt), ident, (mt, lt))),
        ("(-inf, 0) ⊕ a = a", ident, (m, l), (m, l), (ident, (mt, lt), (mt, lt))),
        ("(-inf, 0) ⊕ (-inf, 0) = (-inf, 0), no NaN", ident, ident, ident, (ident, ident, ident)),
    ):
        want64 = tuple(t.double() for t in want)
        got = unpack(replayed_merge(student, "merge_summary", (left, right), want64, twin[:2],
                                    tuple(t.double() for t in twin[2])), 2,
                     what=f"merge_summary: {what}", hint=HINTS["identity"])
        for name, g_t, w_t in zip("mℓ", got, want64):
            check_close(g_t, w_t, what=f"{name} of merge_summary: {what}", inputs=shown, atol=0.0,
                        rtol=tol.IDENTITY_EPS * eps(dt), hint=HINTS["identity"], dtype=dt)
    for what, left, right, want, twin in (
        ("(m, ℓ, o) ⊕ (-inf, 0, 0) = (m, ℓ, o)", (m, l, o), ident_o, (m, l, o), ((mt, lt, ot), ident_o, (mt, lt, ot))),
        ("(-inf, 0, 0) ⊕ (-inf, 0, 0) = (-inf, 0, 0), no NaN", ident_o, ident_o, ident_o, (ident_o, ident_o, ident_o)),
    ):
        want64 = tuple(t.double() for t in want)
        got = unpack(replayed_merge(student, "merge_partial", (left, right), want64, twin[:2],
                                    tuple(t.double() for t in twin[2])), 3,
                     what=f"merge_partial: {what}", hint=HINTS["identity"])
        for name, g_t, w_t in zip(("m", "ℓ", "o"), got, want64):
            check_close(g_t, w_t, what=f"{name} of merge_partial: {what}", inputs=shown, atol=0.0,
                        rtol=tol.IDENTITY_EPS * eps(dt), hint=HINTS["identity"], dtype=dt)


ROW_MAX = 6  # scores per row of a generated segment (padded with -inf to a batch)


def summaries_strategy(size: int):
    """hypothesis: three float64 batches of scores (x_a, x_b, x_c), each (size, ROW_MAX): rows of 1 to
    ROW_MAX scores in [-60, 60] padded with -inf (which neither adds to ℓ nor raises m); ~1/5 of the
    rows are empty (all -inf: the summary (-inf, 0)). check_algebra summarises them."""
    from hypothesis import strategies as st

    scores = st.lists(st.floats(-60, 60, allow_nan=False), min_size=1, max_size=ROW_MAX)
    row = st.one_of(st.just([]), scores, scores, scores, scores)
    batch = st.lists(row, min_size=size, max_size=size).map(
        lambda rows: torch.tensor([r + [NEG_INF] * (ROW_MAX - len(r)) for r in rows], dtype=torch.float64))
    return st.tuples(batch, batch, batch)


def check_algebra(student, xa: torch.Tensor, xb: torch.Tensor, xc: torch.Tensor) -> None:
    """Commutativity and associativity of merge_summary on the float64 summaries a, b, c of the score
    batches x_a, x_b, x_c: a ⊕ b and b ⊕ a must be the summary of concat(x_a, x_b), (a ⊕ b) ⊕ c and
    a ⊕ (b ⊕ c) that of concat(x_a, x_b, x_c) (tolerances rule 5b with 1 and 2 ⊕s)."""
    f64 = torch.float64
    data = {"a": xa, "b": xb, "c": xc}
    twins = {k: twin_data(x, None, f64, seed=3000 + i)[0] for i, (k, x) in enumerate(data.items())}

    def summary(keys: str, scores: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return whole(torch.cat([scores[k] for k in keys], dim=-1))

    a, b, c = summary("a", data), summary("b", data), summary("c", data)
    shown = {"m_a": a[0], "l_a": a[1], "m_b": b[0], "l_b": b[1], "m_c": c[0], "l_c": c[1]}

    def call(x, y, kx: str, ky: str):
        """x ⊕ y, where x, y stand for the segments kx, ky; the twin merges the summaries of the twin's
        segments kx and ky, and must give the summary of their scores together."""
        return unpack(replayed_merge(student, "merge_summary", (x, y), summary(kx + ky, data),
                                     (summary(kx, twins), summary(ky, twins)), summary(kx + ky, twins)), 2,
                      what="merge_summary(a, b) returns (m, ℓ)", hint=HINTS["merge"])

    ab, ba = call(a, b, "a", "b"), call(b, a, "b", "a")
    abc_left, abc_right = call(ab, c, "ab", "c"), call(a, call(b, c, "b", "c"), "a", "bc")
    ref_ab, ref_abc = summary("ab", data), summary("abc", data)
    n_ab, n_abc = xa.shape[-1] + xb.shape[-1], xa.shape[-1] + xb.shape[-1] + xc.shape[-1]
    for what, got, want, rtol in (
            ("a ⊕ b", ab, ref_ab, tol.merge_data_rtol(n_ab, f64, merges=1)),
            ("b ⊕ a = a ⊕ b", ba, ref_ab, tol.merge_data_rtol(n_ab, f64, merges=1)),
            ("(a ⊕ b) ⊕ c", abc_left, ref_abc, tol.merge_data_rtol(n_abc, f64, merges=2)),
            ("a ⊕ (b ⊕ c) = (a ⊕ b) ⊕ c", abc_right, ref_abc, tol.merge_data_rtol(n_abc, f64, merges=2))):
        for name, g_t, w_t, r in (("m", got[0], want[0], 0.0), ("ℓ", got[1], want[1], rtol)):
            check_close(g_t, w_t, what=f"{name} of {what}, against the float64 summary of the segments' scores "
                        "together", inputs=shown, atol=0.0, rtol=r, hint=HINTS["algebra"], dtype=f64)


# ---------------------------------------------------------------------------------------------
# checks: (c) counters


def counted_values(n: int, seed: int, order: str = "random") -> list[float]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 3
    if order == "ties":  # rounded to integers: later elements often EQUAL the running max (not a rebase)
        x = x.round()
    elif order == "increasing":
        x = x.sort().values
    elif order == "decreasing":
        x = x.sort(descending=True).values
    return x.tolist()


def expected_rebases(values: list[float]) -> int:
    """Times a later element (not the first) is strictly larger than every element before it."""
    count, m = 0, math.inf
    for i, value in enumerate(values):
        if i == 0:
            m = value
        elif value > m:
            count, m = count + 1, value
    return count


def _float_list(result: Any, n: int, what: str, hint: str) -> torch.Tensor:
    if type(result) is not list or len(result) != n or any(type(v) not in (float, int) for v in result):
        got = f"a list of length {len(result)}" if type(result) is list else f"a {type(result).__name__}"
        raise CheckFailure(what, detail=f"expected a list of {n} Python floats, got {got}", hint=hint, kind="type")
    return torch.tensor([float(v) for v in result], dtype=torch.float64)


BLOCK = 256  # elements per delivery: scenarios/part1.BLOCK


def judge_counted(student, which: str, passes: list[list[float]]) -> tuple[Any, int]:
    """Run <which>_softmax_counted with the values kept in the judge, delivered block by block as the
    code reads them (scenarios/part1.py). The k-th delivery of a block is the code's k-th pass over it,
    and it gets the block of `passes[k]` (the last list for any later pass): each pass its own values.
    Returns (its result, the elements the judge delivered)."""
    n = len(passes[0])
    out = student.scenario("part1.counted_start", which=which, n=n)
    delivered = 0
    served: dict[int, int] = {}  # block -> deliveries so far
    limit = 8 * n + BLOCK  # more than any pass count the tests expect: stop a runaway reader
    while type(out) is dict and "need" in out:
        b = out["need"]
        check(type(b) is int and 0 <= b * BLOCK < max(n, 1) and delivered <= limit,
              what=f"{which}_softmax_counted reads its input a bounded number of times",
              detail=f"it asked for more than {limit:,} element reads of {n}" if delivered > limit
              else "it asked for an element that does not exist", hint=HINTS["passes"][which], inputs={"x": (n,)})
        values = passes[min(served.get(b, 0), len(passes) - 1)]
        served[b] = served.get(b, 0) + 1
        block = values[b * BLOCK:(b + 1) * BLOCK]
        delivered += len(block)
        out = student.scenario("part1.counted_feed", values=block)
    check(type(out) is dict and "result" in out, what=f"{which}_softmax_counted ran",
          detail="the scenario returned an unexpected value")
    return out["result"], delivered


STAIR = 1000.0  # more than exp's range in float64 (~709)


def stairs(x: list[float], steps: int = 3) -> list[float]:
    """x with its k-th third lifted by k·STAIR: a shift chosen before the max is seen (the first value, a
    first stretch's max) leaves exp(x - shift) to overflow on a later third, so only a shift that follows
    the running max (rescaling ℓ as it grows: the online softmax, §4.3) or the true max (a max pass first)
    gives finite sums. Without it, every value lay within ~±15 of any other: a softmax shifted once by the
    first value read was exact, with no online rescaling."""
    n = len(x)
    return [v + STAIR * min(steps - 1, i * steps // max(n, 1)) for i, v in enumerate(x)]


def pass_values(n: int, seed: int, passes: int, shift: float = 0.0, lifted: bool = False) -> list[list[float]]:
    """The values each pass of a counted softmax reads: pass 1 gets x, each later pass x moved by up to
    ±0.01 (another draw each pass). A correct k-pass softmax uses what each pass reads (its statistics
    from the earlier passes, its probabilities from the last), so its output is expected_passes(...) of
    these lists; a function that keeps x from one pass and only walks over x in the others (reads
    that compute nothing) gives the softmax of that one pass's values instead, off by ~1e-3 relative.
    shift: added to x; from ~710 on, exp(x) overflows float64, so only a sum shifted by the (running)
    max stays finite: the naive softmax with a rebase counter beside it is not the online one.
    lifted: x in stairs (a shift fixed early overflows later)."""
    x = [v + shift for v in counted_values(n, seed)]
    x = stairs(x) if lifted else x
    g = torch.Generator().manual_seed(seed + 5000)
    moved = [(torch.tensor(x, dtype=torch.float64) + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 0.02)
             .tolist() for _ in range(passes - 1)]
    return [x, *moved]


def expected_passes(which: str, passes: list[list[float]]) -> torch.Tensor:
    """The probabilities a correct counted softmax computes from the values its passes read (float64):
    naive   exp(x2_j) / Σ exp(x1);
    safe    exp(x3_j - m) / Σ exp(x2 - m), m = max x1;
    online  exp(x2_j - m) / ℓ, (m, ℓ) the summary of x1 (§4.1-§4.3)."""
    xs = [torch.as_tensor(p, dtype=torch.float64) for p in passes]
    if which == "naive":
        return torch.exp(xs[1]) / torch.exp(xs[0]).sum()
    m = xs[0].max()
    if which == "safe":
        return torch.exp(xs[2] - m) / torch.exp(xs[1] - m).sum()
    return torch.exp(xs[1] - m) / torch.exp(xs[0] - m).sum()


VALUE_HINTS = {"naive": "naive_softmax", "safe": "safe_softmax", "online": "summary_l"}


def check_passes(student, which: str, n: int, seed: int, shift: float = 0.0) -> None:
    """The passes the judge counted as it delivered the values, then the probabilities from what each pass
    read (pass_values: each pass its own values, moved by `shift`)."""
    want = {"naive": 2, "safe": 3, "online": 2}[which]
    passes = pass_values(n, seed, want, shift, lifted=which != "naive")
    result, reads = judge_counted(student, which, passes)
    fn = f"{which}_softmax_counted"
    if which == "online":
        result, _ = unpack(result, 2, what=f"{fn}(x) returns (probabilities, rebases)", hint=HINTS["rebases"])
    probs = _float_list(result, n, f"{fn}(x) returns a list of probabilities", HINTS["passes"][which])
    check_read_passes(reads, want, n, which)
    kept = torch.tensor(passes[0], dtype=torch.float64)
    if probs.shape == kept.shape and bool(torch.isfinite(probs).all()) and \
            bool(torch.allclose(probs, ref_softmax(kept), rtol=0, atol=1e-12)):
        raise CheckFailure(f"{fn} computes its probabilities from the values its passes read",
                           detail=f"it returned the softmax of the values of its FIRST pass; the judge served each "
                                  f"pass its own values (later passes moved by up to ±0.01), so pass {want} must "
                                  "compute from what it reads", hint=HINTS["passes"][which], inputs={"x": (n,)})
    check_close(probs, expected_passes(which, passes), what=f"{fn}(x) against float64 softmax (each pass on its "
                "own values)", inputs={"x": (n,)}, atol=1e-12, rtol=0.0, hint=HINTS[VALUE_HINTS[which]],
                dtype=torch.float64)


REBASE_SHIFT = 1000.0  # exp(x) overflows float64 from ~710 on: only a sum kept relative to the running max is finite


def check_read_passes(reads: int, want: int, n: int, which: str, lead: str = "") -> None:
    """The judge delivered `want` reads of each of the n elements to <which>_softmax_counted (judge_counted)."""
    fn = f"{which}_softmax_counted"
    check(reads == want * n, what=f"{lead}{fn} reads every element exactly {want} times (counted by the judge)",
          detail=f"the judge delivered {reads} element reads for {n} elements = {reads / max(n, 1):.3g} passes, "
                 f"expected {want} (a pass reads every element once; reading one again starts another pass)",
          hint=HINTS["passes"][which], inputs={"x": (n,)})


def check_rebases(student, n: int, seed: int, order: str = "random") -> None:
    """The rebase count of online_softmax_counted, from the call whose passes the judge counts (it
    delivers the values block by block): the count earns its points only where that call is the online
    softmax, two passes with the right probabilities on values from REBASE_SHIFT up in stairs (a
    decreasing row excepted: its first value is the max). A count is a property of any scan of the
    running max: a three-pass safe softmax, or a naive one or one shifted once, with a counter beside it
    would count the same rebases without the algorithm the test is about."""
    values = [v + REBASE_SHIFT for v in counted_values(n, seed, order)]
    values = values if order == "decreasing" else stairs(values)  # (decreasing: the first value is the max)
    fn = "online_softmax_counted"
    result, reads = judge_counted(student, "online", [values])
    probs, rebases = unpack(result, 2, what=f"{fn}(x) returns (probabilities, rebases)", hint=HINTS["rebases"])
    probs = _float_list(probs, n, f"{fn}(x) returns a list of probabilities", HINTS["passes"]["online"])
    lead = "the call whose rebases are counted is the online softmax: "
    check_read_passes(reads, 2, n, "online", lead)
    check_close(probs, ref_softmax(torch.tensor(values, dtype=torch.float64)),
                what=f"{lead}{fn}(x) against float64 softmax, x from {REBASE_SHIFT:g} up in stairs of {STAIR:g} "
                     "(exp(x) alone overflows)", inputs={"x": (n,)}, atol=1e-12, rtol=0.0,
                hint=HINTS[VALUE_HINTS["online"]], dtype=torch.float64)
    want = expected_rebases(values)
    hint = HINTS["rebases"]
    if order == "ties" and type(rebases) is int and rebases > want:
        with_ties = sum(1 for i in range(1, n) if values[i] >= max(values[:i]))
        if rebases == with_ties:
            hint = HINTS["rebase_ties"]
    check(type(rebases) is int and rebases == want, what="the rebase count of online_softmax_counted",
          detail=f"got {rebases!r}, expected {want} for {n} values in {order} order",
          hint=hint, inputs={"x": (n,)})
