"""Part 1 (online_softmax.py): cases and checks shared by the public and the hidden tests.

Checked three ways:
(a) against float64 references computed here in the judge (torch.softmax / torch.logsumexp math
    on the same values), with the tolerance policy of autograder/README.md;
(b) conventions: ⊕ has the identity (-inf, 0, 0); two empty sides give no NaN; ⊕ is commutative and
    associative (hypothesis draws the summaries, the student merges them); rows scaled ×40 or
    shifted by +1000 do not overflow in the safe and online softmax; an all -inf row gives zeros;
(c) counters, judge-side: the *_counted softmaxes read their input 2 / 3 / 2 times, counted BY THE
    JUDGE as the input elements it had to deliver (the values stay in the judge; the worker's counter
    asks for each block of 64 as it is read: scenarios/part1.py), and the rebase count (a return
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
  adds at most u·|Δ|·e^Δ <= u/e relative. We allow 64·eps relative on ℓ; for o (mixed signs) the
  same bound on the absolute error scaled by max(|o_a|·α + |o_b|·β).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import CheckFailure, check, check_close, unpack

from . import probes as pb

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

    @property
    def id(self) -> str:
        bits = ["x".join(map(str, self.shape)), self.dtype]
        if self.mult != 1:
            bits.append(f"x{self.mult:g}")
        if self.shift:
            bits.append(f"{self.shift:+g}")
        if self.neg_inf:
            bits.append(f"neginf-{self.neg_inf}")
        return "-".join(bits) + f"-s{self.seed}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def naive_ok(self) -> bool:
        """Inputs on which the textbook exp(x)/Σexp(x) is defined (no overflow, no empty row)."""
        return self.mult == 1 and self.shift == 0 and self.neg_inf != "rows" and self.shape[-1] > 0

    def x64(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.shape, generator=g, dtype=torch.float64) * self.mult + self.shift
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


def _safe_max(m: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def ref_summary(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, ℓ) of each row, in x's dtype: m = max, ℓ = Σ exp(x - m); empty/all -inf rows: (-inf, 0)."""
    if x.shape[-1] == 0:
        return (torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype))
    m = x.amax(dim=-1)
    return m, torch.exp(x - _safe_max(m).unsqueeze(-1)).sum(dim=-1)


def ref_partial(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, ℓ, o) with o = Σ_j exp(x_j - m) v_j unnormalised. v: (..., N, dv)."""
    m, l = ref_summary(x)
    if x.shape[-1] == 0:
        return m, l, torch.zeros(*x.shape[:-1], v.shape[-1], dtype=x.dtype)
    p = torch.exp(x - _safe_max(m).unsqueeze(-1))
    return m, l, (p.unsqueeze(-1) * v).sum(dim=-2)


def ref_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim (torch.softmax), with the handout's convention: all -inf row -> 0."""
    empty = torch.isneginf(x).all(dim=-1, keepdim=True)
    return torch.where(empty, torch.zeros_like(x), torch.softmax(x, dim=-1))


def merge_ref(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """⊕ in float64 on the given (already rounded) values: (m, ℓ) or (m, ℓ, o)."""
    a = [t.to(torch.float64) for t in a]
    b = [t.to(torch.float64) for t in b]
    m = torch.maximum(a[0], b[0])
    base = _safe_max(m)
    alpha, beta = torch.exp(a[0] - base), torch.exp(b[0] - base)
    out = [m, a[1] * alpha + b[1] * beta]
    if len(a) == 3:
        out.append(a[2] * alpha.unsqueeze(-1) + b[2] * beta.unsqueeze(-1))
    return tuple(out)


def _segments(case: MergeCase, with_v: bool) -> tuple[tuple, tuple, dict]:
    rc = case.rows
    x = rc.x64()
    n = x.shape[-1]
    s = max(0, min(case.split, n))
    g = torch.Generator().manual_seed(rc.seed + 1000)
    v = torch.randn(*x.shape, case.dv, generator=g, dtype=torch.float64)
    dt = rc.torch_dtype
    if with_v:
        a = ref_partial(x[..., :s], v[..., :s, :])
        b = ref_partial(x[..., s:], v[..., s:, :])
    else:
        a, b = ref_summary(x[..., :s]), ref_summary(x[..., s:])
    a = tuple(t.to(dt) for t in a)
    b = tuple(t.to(dt) for t in b)
    shown = {"m_a": a[0], "l_a": a[1], "m_b": b[0], "l_b": b[1]}
    if with_v:
        shown.update(o_a=a[2], o_b=b[2])
    return a, b, shown


# ---------------------------------------------------------------------------------------------
# the student's calls, replayed by the judge


def replayed(student, fn: str, args: tuple, reference, seed: int = 1) -> Any:
    """online_softmax.<fn>(*args) recorded in the worker and replayed by the judge: the replay's result.
    `reference(*judge_args)` is the float64 answer, which the twin replay must match on its inputs."""
    rp, _, _ = replay.call(student, f"{FN}.{fn}", tuple(args), seed=seed, reference=reference)
    return rp.result


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
            parts = [finding.message(), extra, failure.hint if keep and not extra else None]
            failure.hint = "; ".join(p for p in parts if p)
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
    return HINTS["summary_no_shift"] if bool(ok.all()) else None


def check_softmax(student, fn: str, case: RowsCase) -> None:
    x = case.x()
    out = replayed(student, fn, (x,), _ref64(ref_softmax))
    with probed(lambda: pb.softmax_ladder(student, fn)):
        check_close(out, ref_softmax(case.x64()), what=f"{fn}(x) against float64 softmax over the last dim",
                    inputs={"x": x}, rtol=softmax_rtol(x.shape[-1], x.dtype), hint=HINTS[fn], dtype=x.dtype)


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


def check_merge_summary(student, case: MergeCase) -> None:
    a, b, shown = _segments(case, with_v=False)
    dt = case.rows.torch_dtype
    m, l = unpack(replayed(student, "merge_summary", (a, b), merge_ref), 2, what="merge_summary(a, b) returns (m, ℓ)",
                  hint=HINTS["merge"])
    m_ref, l_ref = merge_ref(a, b)
    empty = bool((torch.isneginf(a[0]) & torch.isneginf(b[0])).any())
    hint = HINTS["identity"] if empty else HINTS["merge"]
    with probed(lambda: pb.merge_ladder(student, "merge_summary")):
        check_close(m, m_ref, what="m of merge_summary(a, b) = max(m_a, m_b)", inputs=shown, atol=0.0, rtol=0.0,
                    hint=hint, dtype=dt)
        check_close(l, l_ref, what="ℓ of merge_summary(a, b) against float64 ⊕", inputs=shown, atol=0.0,
                    rtol=tol.merge_rtol(dt), hint=hint, dtype=dt)


def check_merge_partial(student, case: MergeCase) -> None:
    a, b, shown = _segments(case, with_v=True)
    dt = case.rows.torch_dtype
    m, l, o = unpack(replayed(student, "merge_partial", (a, b), merge_ref), 3, what="merge_partial(a, b) returns (m, ℓ, o)",
                     hint=HINTS["merge_partial"])
    m_ref, l_ref, o_ref = merge_ref(a, b)
    empty = bool((torch.isneginf(a[0]) & torch.isneginf(b[0])).any())
    hint = HINTS["identity"] if empty else HINTS["merge_partial"]
    with probed(lambda: pb.merge_ladder(student, "merge_partial")):
        check_close(m, m_ref, what="m of merge_partial(a, b) = max(m_a, m_b)", inputs=shown, atol=0.0, rtol=0.0,
                    hint=hint, dtype=dt)
        check_close(l, l_ref, what="ℓ of merge_partial(a, b) against float64 ⊕", inputs=shown, atol=0.0,
                    rtol=tol.merge_rtol(dt), hint=hint, dtype=dt)
    base = _safe_max(m_ref)
    scale = (a[2].double().abs() * torch.exp(a[0].double() - base).unsqueeze(-1)
             + b[2].double().abs() * torch.exp(b[0].double() - base).unsqueeze(-1))
    bound = tol.merge_rtol(dt) * float(scale.max()) if scale.numel() else 0.0
    with probed(lambda: pb.merge_ladder(student, "merge_partial")):
        check_close(o, o_ref, what="o of merge_partial(a, b) against float64 ⊕ (o unnormalised)", inputs=shown,
                    atol=bound, rtol=0.0, hint=hint, dtype=dt)


# ---------------------------------------------------------------------------------------------
# checks: (b) conventions


def check_identity(student, dtype: str, lead: tuple[int, ...] = (5,), seed: int = 0) -> None:
    """a ⊕ (-inf, 0) = a = (-inf, 0) ⊕ a, and (-inf, 0) ⊕ (-inf, 0) = (-inf, 0) with no NaN (also with o)."""
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(seed)
    m = (torch.randn(lead, generator=g, dtype=torch.float64) * 5).to(dt)
    l = (1 + torch.rand(lead, generator=g, dtype=torch.float64) * 50).to(dt)
    o = torch.randn(*lead, 4, generator=g, dtype=torch.float64).to(dt)
    ident = (torch.full(lead, NEG_INF, dtype=dt), torch.zeros(lead, dtype=dt))
    ident_o = (*ident, torch.zeros(*lead, 4, dtype=dt))
    shown = {"m": m, "l": l}
    for what, left, right, want in (
        ("a ⊕ (-inf, 0) = a", (m, l), ident, (m, l)),
        ("(-inf, 0) ⊕ a = a", ident, (m, l), (m, l)),
        ("(-inf, 0) ⊕ (-inf, 0) = (-inf, 0), no NaN", ident, ident, ident),
    ):
        got = unpack(replayed(student, "merge_summary", (left, right), merge_ref), 2, what=f"merge_summary: {what}",
                     hint=HINTS["identity"])
        for name, g_t, w_t in zip("mℓ", got, want):
            check_close(g_t, w_t.double(), what=f"{name} of merge_summary: {what}", inputs=shown, atol=0.0,
                        rtol=tol.IDENTITY_EPS * eps(dt), hint=HINTS["identity"], dtype=dt)
    for what, left, right, want in (
        ("(m, ℓ, o) ⊕ (-inf, 0, 0) = (m, ℓ, o)", (m, l, o), ident_o, (m, l, o)),
        ("(-inf, 0, 0) ⊕ (-inf, 0, 0) = (-inf, 0, 0), no NaN", ident_o, ident_o, ident_o),
    ):
        got = unpack(replayed(student, "merge_partial", (left, right), merge_ref), 3, what=f"merge_partial: {what}",
                     hint=HINTS["identity"])
        for name, g_t, w_t in zip(("m", "ℓ", "o"), got, want):
            check_close(g_t, w_t.double(), what=f"{name} of merge_partial: {what}", inputs=shown, atol=0.0,
                        rtol=tol.IDENTITY_EPS * eps(dt), hint=HINTS["identity"], dtype=dt)


def summaries_strategy(size: int):
    """hypothesis: three float64 summary batches (a, b, c) of `size` elements; ~1/5 are empty."""
    from hypothesis import strategies as st

    one = st.one_of(
        st.just((NEG_INF, 0.0)),
        st.tuples(st.floats(-60, 60, allow_nan=False), st.floats(1.0, 1e3, allow_nan=False)),
        st.tuples(st.floats(-60, 60, allow_nan=False), st.floats(1.0, 1e3, allow_nan=False)),
        st.tuples(st.floats(-60, 60, allow_nan=False), st.floats(1.0, 1e3, allow_nan=False)),
        st.tuples(st.floats(-60, 60, allow_nan=False), st.floats(1.0, 1e3, allow_nan=False)),
    )
    batch = st.lists(one, min_size=size, max_size=size).map(
        lambda items: (torch.tensor([i[0] for i in items], dtype=torch.float64),
                       torch.tensor([i[1] for i in items], dtype=torch.float64)))
    return st.tuples(batch, batch, batch)


def check_algebra(student, a, b, c) -> None:
    """Commutativity and associativity of merge_summary on float64 batches, against float64 ⊕."""
    shown = {"m_a": a[0], "m_b": b[0], "m_c": c[0]}
    call = lambda x, y: unpack(replayed(student, "merge_summary", (x, y), merge_ref), 2,  # noqa: E731
                               what="merge_summary(a, b) returns (m, ℓ)", hint=HINTS["merge"])
    ab, ba = call(a, b), call(b, a)
    abc_left, abc_right = call(ab, c), call(a, call(b, c))
    ref_ab = merge_ref(a, b)
    ref_abc = merge_ref(ref_ab, c)
    rtol = tol.merge_rtol(torch.float64)  # a few roundings of exp/product/sum (tolerances rule 5)
    for what, got, want in (("a ⊕ b", ab, ref_ab), ("b ⊕ a = a ⊕ b", ba, ref_ab),
                            ("(a ⊕ b) ⊕ c", abc_left, ref_abc), ("a ⊕ (b ⊕ c) = (a ⊕ b) ⊕ c", abc_right, ref_abc)):
        for name, g_t, w_t in zip("mℓ", got, want):
            check_close(g_t, w_t, what=f"{name} of {what}", inputs=shown, atol=0.0, rtol=2 * rtol if "c" in what else rtol,
                        hint=HINTS["algebra"], dtype=torch.float64)


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


BLOCK = 64  # elements per delivery: scenarios/part1.BLOCK


def judge_counted(student, which: str, values: list[float]) -> tuple[Any, int]:
    """Run <which>_softmax_counted with the values kept in the judge, delivered block by block as the
    code reads them (scenarios/part1.py). Returns (its result, the elements the judge delivered)."""
    n = len(values)
    out = student.scenario("part1.counted_start", which=which, n=n)
    delivered = 0
    limit = 8 * n + BLOCK  # more than any pass count the tests expect: stop a runaway reader
    while type(out) is dict and "need" in out:
        b = out["need"]
        check(type(b) is int and 0 <= b * BLOCK < max(n, 1) and delivered <= limit,
              what=f"{which}_softmax_counted reads its input a bounded number of times",
              detail=f"it asked for more than {limit:,} element reads of {n}" if delivered > limit
              else "it asked for an element that does not exist", hint=HINTS["passes"][which], inputs={"x": (n,)})
        block = values[b * BLOCK:(b + 1) * BLOCK]
        delivered += len(block)
        out = student.scenario("part1.counted_feed", values=block)
    check(type(out) is dict and "result" in out, what=f"{which}_softmax_counted ran",
          detail="the scenario returned an unexpected value")
    return out["result"], delivered


def check_passes(student, which: str, n: int, seed: int) -> None:
    values = counted_values(n, seed)
    result, reads = judge_counted(student, which, values)
    fn = f"{which}_softmax_counted"
    if which == "online":
        result, _ = unpack(result, 2, what=f"{fn}(x) returns (probabilities, rebases)", hint=HINTS["rebases"])
    probs = _float_list(result, n, f"{fn}(x) returns a list of probabilities", HINTS["passes"][which])
    x = torch.tensor(values, dtype=torch.float64)
    check_close(probs, ref_softmax(x), what=f"{fn}(x) against float64 softmax", inputs={"x": (n,)}, atol=1e-12,
                rtol=0.0, hint=HINTS["passes"][which], dtype=torch.float64)
    want = {"naive": 2, "safe": 3, "online": 2}[which]
    check(reads == want * n, what=f"{fn} reads every element exactly {want} times (counted by the judge)",
          detail=f"the judge delivered {reads} element reads for {n} elements = {reads / max(n, 1):.3g} passes, "
                 f"expected {want} (a pass reads the elements in order, block by block)",
          hint=HINTS["passes"][which], inputs={"x": (n,)})


def check_rebases(student, n: int, seed: int, order: str = "random") -> None:
    values = counted_values(n, seed, order)
    out = student.scenario("part1.counted", values=values, which="online")
    _, rebases = unpack(out.get("result") if type(out) is dict else out, 2,
                        what="online_softmax_counted(x) returns (probabilities, rebases)", hint=HINTS["rebases"])
    want = expected_rebases(values)
    hint = HINTS["rebases"]
    if order == "ties" and type(rebases) is int and rebases > want:
        with_ties = sum(1 for i in range(1, n) if values[i] >= max(values[:i]))
        if rebases == with_ties:
            hint = HINTS["rebase_ties"]
    check(type(rebases) is int and rebases == want, what="the rebase count of online_softmax_counted",
          detail=f"got {rebases!r}, expected {want} for {n} values in {order} order",
          hint=hint, inputs={"x": (n,)})
