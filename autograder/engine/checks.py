"""Checks used by every assignment test, so that feedback is uniform.

Tolerance rules: all of them, with their rounding arguments, are in autograder/engine/tolerances.py.
check_close applies rule 1 (with `plain`: max error <= factor × plain's error + atol) or, without
`plain`, elementwise |actual - expected| <= atol + rtol·|expected| with the caller's named rule.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import torch

from .tolerances import DEFAULT_ATOL, FLOAT64_ATOL, ROUNDING_EPS, eps  # noqa: F401  (the rules live in tolerances.py)


@contextmanager
def one_thread() -> Iterator[None]:
    """The judge's references and model runs use small tensors: extra OpenMP threads only wait (measured:
    50x slower on 2 loaded cores), so run them on one thread and restore the setting afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class CheckFailure(AssertionError):
    """A check on a student's result failed. Carries structured fields for the feedback."""

    def __init__(self, what: str, *, detail: str = "", inputs: Mapping[str, Any] | None = None,
                 max_abs: float | None = None, max_rel: float | None = None, index: tuple | None = None,
                 expected_value: float | None = None, actual_value: float | None = None,
                 allowed: str | None = None, hint: str | None = None, kind: str = "check",
                 observed: str | None = None) -> None:
        self.what, self.detail, self.hint, self.kind = what, detail, hint, kind
        # what the failed value itself shows (memory never written, another expected output's values):
        # said before any hint, and kept when a diagnosis replaces the hint
        self.observed = observed
        self.inputs = describe_inputs(inputs or {})
        self.max_abs, self.max_rel, self.index = max_abs, max_rel, index
        self.expected_value, self.actual_value, self.allowed = expected_value, actual_value, allowed
        super().__init__(self.message())

    def message(self) -> str:
        """Several lines: what was checked, inputs, errors and where, hint. (A hidden test shows none
        of it: runner.hidden_verdict.)"""
        lines = [f"checked: {self.what}"]
        if self.inputs:
            lines.append("inputs: " + ", ".join(f"{k} {v}" for k, v in self.inputs.items()))
        if self.detail:
            lines.append(self.detail)
        if self.max_abs is not None:
            at = f" at {list(self.index)}" if self.index is not None else ""
            vals = ""
            if self.expected_value is not None:
                vals = f" (expected {self.expected_value:.6g}, got {self.actual_value:.6g})"
            rel = f"; max rel error {self.max_rel:.3g}" if self.max_rel is not None else ""
            lines.append(f"max abs error {self.max_abs:.3g}{at}{vals}{rel}")
        if self.allowed:
            lines.append(f"allowed: {self.allowed}")
        hint = join_hints(self.observed, self.hint)
        if hint:
            lines.append(f"hint: {hint}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "what": self.what, "hint": join_hints(self.observed, self.hint) or None, "kind": self.kind,
            "inputs": self.inputs,
            "detail": self.detail or None, "max_abs_err": _num(self.max_abs), "max_rel_err": _num(self.max_rel),
            "index": None if self.index is None else list(self.index), "allowed": self.allowed,
        }


def _num(x: float | None) -> float | str | None:
    if x is None:
        return None
    return x if math.isfinite(x) else repr(x)


def describe_inputs(inputs: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            out[name] = f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
        elif isinstance(value, (tuple, list)) and all(isinstance(s, int) for s in value):
            out[name] = str(tuple(value))
        else:
            text = repr(value)
            out[name] = text if len(text) <= 60 else text[:57] + "..."
    return out


def _type_name(x: Any) -> str:
    return type(x).__name__


# The start of a probe ladder's message when no probe failed (probes.NEUTRAL): it names nothing, so it
# comes after every clause that does (a hint may be cut to a length: what is cut is the list of probes)
NAMES_NOTHING = "the probes found no smaller input that fails"


def join_hints(*parts: str | None) -> str:
    """Hints joined with "; ", each clause once (a clause inside another one counts as said): a probe's
    finding and a check's own hint often say the same thing, and a student should read it once. A
    clause that names nothing (NAMES_NOTHING) goes last."""
    seen: list[str] = []
    for part in parts:
        for clause in (part or "").split("; "):
            clause = clause.strip()
            if not clause or any(clause in s for s in seen):  # said already (maybe after a "found: " lead)
                continue
            seen = [s for s in seen if s not in clause] + [clause]
    return "; ".join(sorted(seen, key=lambda c: c.startswith(NAMES_NOTHING)))


def check(condition: bool, *, what: str, detail: str = "", hint: str | None = None,
          inputs: Mapping[str, Any] | None = None) -> None:
    """Fail with a CheckFailure unless condition is exactly True (not merely truthy)."""
    if condition is not True:
        raise CheckFailure(what, detail=detail, hint=hint, inputs=inputs)


def unpack(result: Any, n: int, *, what: str, hint: str | None = None) -> tuple:
    """result as a tuple of n items; a list is accepted. Fails clearly otherwise."""
    if type(result) not in (tuple, list) or len(result) != n:
        got = f"a {_type_name(result)} of length {len(result)}" if type(result) in (tuple, list) else f"a {_type_name(result)}"
        raise CheckFailure(what, detail=f"expected a tuple of {n} values, got {got}", hint=hint, kind="type")
    return tuple(result)


def check_tensor(actual: Any, *, what: str, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
                 inputs: Mapping[str, Any] | None = None, hint: str | None = None) -> torch.Tensor:
    """`actual` as a plain torch.Tensor of `shape` and `dtype` (each where given), or a CheckFailure of kind
    "type", "dtype" or "shape" that names what was expected and what came. Every check that does arithmetic
    on a student's result (compares, indexes, takes abs or max) validates it with this first: a wrong
    type, dtype or shape is the student's mistake, never an error of the grader. (check_close does.)"""
    if type(actual) is not torch.Tensor:
        want = f"a tensor of shape {tuple(shape)}" if shape is not None else "a tensor"
        raise CheckFailure(what, detail=f"expected {want}, got a {_type_name(actual)}", inputs=inputs, hint=hint,
                           kind="type")
    if dtype is not None and actual.dtype != dtype:
        raise CheckFailure(what, detail=f"dtype {str(actual.dtype).removeprefix('torch.')}, expected "
                           f"{str(dtype).removeprefix('torch.')} (outputs have the input's dtype)",
                           inputs=inputs, hint=hint, kind="dtype")
    if shape is not None and tuple(actual.shape) != tuple(shape):
        raise CheckFailure(what, detail=f"shape {tuple(actual.shape)}, expected {tuple(shape)}",
                           inputs=inputs, hint=hint, kind="shape")
    return actual


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for s in reversed(shape):
        idx.append(flat % s if s else 0)
        flat //= s if s else 1
    return tuple(reversed(idx))


HINT_UNWRITTEN = ("elements that were never written: they hold the memory torch.empty (new_empty, empty_like) "
                  "returned, which is garbage (NaN in the grader's replay): write every element, e.g. o = 0 and "
                  "lse = -inf for rows that no key reaches, or start from torch.zeros / torch.full")


HINT_OVERFLOW = ("inf where a finite value is expected: an exp that overflowed (float32 holds exp(x) only up to "
                 "x = 88.7: subtract the max before exp, §4.2) or a division by 0")

HINT_EMPTIED = ("-inf where a finite value is expected: a row that sees keys ended with the statistics of an empty "
                "one (m = -inf or ℓ = 0): a max or a sum over one tile alone (a fully masked tile has -inf and 0), "
                "or a guard that reset them")


HINT_FLOAT32 = ("this float64 result holds float32 numbers only (each equals its rounding to float32): the computation "
                "went through float32 somewhere, a .float() or a tensor made without dtype= (torch.zeros(n), "
                "torch.tensor(...), torch.full(...) default to float32): keep the input's dtype throughout")


def _float32_inside(actual: torch.Tensor, expected: torch.Tensor, max_rel: float) -> str | None:
    """HINT_FLOAT32 when a float64 result is off by float32's rounding and every finite value of it is a
    float32 number (it went through float32), while the expected values are not all float32 numbers."""
    if actual.dtype != torch.float64 or not 0 < max_rel < 1e-4:
        return None
    a, e = actual.detach(), expected.detach().to(torch.float64)
    fa, fe = a[torch.isfinite(a)], e[torch.isfinite(e)]
    if fa.numel() < 2 or not bool((fa == fa.float().double()).all()) or bool((fe == fe.float().double()).all()):
        return None
    return HINT_FLOAT32


def _never_written(actual: torch.Tensor, where: torch.Tensor) -> int:
    """How many elements of `actual` at `where` hold the replay's 'never written' value (replay.unwritten)."""
    from .replay import unwritten  # (the replay fills what torch.empty returns; a plain tensor has none)

    try:
        return int((unwritten(actual) & where).sum())
    except (RuntimeError, TypeError):
        return 0


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b (float64) agree to float32 rounding (NaN with NaN, the same infinities)."""
    if a.shape != b.shape:
        return False
    fin = torch.isfinite(b)
    if not bool(((torch.isnan(a) == torch.isnan(b)) & (torch.isinf(a) == torch.isinf(b))).all()):
        return False
    if bool((torch.isinf(b) & (a != b)).any()):
        return False
    if not bool(fin.any()):
        return True
    scale = float(b[fin].abs().max()) + 1.0
    return float((a - b)[fin].abs().max()) <= 1e-5 * scale


def _holds_other(actual: torch.Tensor, expected: torch.Tensor, others: Mapping[str, torch.Tensor] | None) -> str | None:
    """'it holds <description>' when the failed value equals one of `others` (and that one is not itself
    the expected value). The description says what instead and what that means."""
    for name, other in (others or {}).items():
        if not isinstance(other, torch.Tensor) or other.shape != actual.shape:
            continue
        o = other.detach().to(actual.dtype)
        if _same(actual, o) and not _same(expected, o):
            return f"it holds {name}"
    return None


def check_close(actual: Any, expected: torch.Tensor | float, *, what: str,
                inputs: Mapping[str, Any] | None = None, plain: torch.Tensor | None = None,
                factor: float = 2.0, atol: float | None = None, rtol: float | None = None,
                hint: str | None = None, dtype: torch.dtype | None = None,
                others: Mapping[str, torch.Tensor] | None = None) -> None:
    """Check a student's tensor against the float64 reference `expected`.

    - type: `actual` must be a torch.Tensor (results are rebuilt from raw bytes in the judge, so
      this is a real tensor and cannot compare equal on its own);
    - dtype: `dtype` if given, else the dtype of `plain` if given, else the dtype of the first
      floating tensor in `inputs`;
    - shape: that of `expected`;
    - non-finite values: NaN exactly where expected is NaN, the same ±inf where expected is ±inf,
      finite elsewhere;
    - values: with `plain`, max|actual-expected| <= factor·max|plain-expected| + atol; else
      |actual-expected| <= atol + rtol·|expected| elementwise. atol defaults to FLOAT64_ATOL for
      float64 results and DEFAULT_ATOL otherwise; rtol to 0.
    A failure says what the value itself shows (CheckFailure.observed): elements the code never wrote
    (replay.unwritten), or, with `others` ({description: tensor}), that it holds one of those instead
    (another output's expected value, another input: swapped outputs, one buffer for two).
    """
    if not isinstance(expected, torch.Tensor):
        expected = torch.tensor(expected, dtype=torch.float64)
    want_dtype = dtype or (plain.dtype if isinstance(plain, torch.Tensor) else None)
    if want_dtype is None:
        for v in (inputs or {}).values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                want_dtype = v.dtype
                break
    check_tensor(actual, what=what, shape=expected.shape, dtype=want_dtype, inputs=inputs, hint=hint)
    a = actual.detach().to(torch.float64) if not actual.is_complex() else actual.detach().to(torch.complex128)
    e = expected.detach().to(a.dtype)
    if atol is None:
        atol = FLOAT64_ATOL if actual.dtype == torch.float64 else DEFAULT_ATOL
    rtol = 0.0 if rtol is None else rtol
    shape = e.shape

    # non-finite agreement
    e_nan, a_nan = torch.isnan(e), torch.isnan(a)
    e_inf, a_inf = torch.isinf(e), torch.isinf(a)
    bad = (a_nan & ~e_nan) | (e_nan & ~a_nan) | (e_inf & ~(a_inf & (a == e))) | (a_inf & ~e_inf)
    if bool(bad.any()):
        i = _index(int(bad.reshape(-1).nonzero()[0]), shape)
        got, want = a[i].item(), e[i].item()
        n_bad = int(bad.sum())
        detail = f"at {list(i)} expected {want}, got {got}"
        never = _never_written(actual, bad)
        if never:
            detail += f"; {never} of them never written"
        overflow = bool((bad & torch.isposinf(a) & torch.isfinite(e)).any())
        emptied = bool((bad & torch.isneginf(a) & torch.isfinite(e)).any())
        observed = HINT_UNWRITTEN if never else _holds_other(a, e, others) or (
            HINT_OVERFLOW if overflow else HINT_EMPTIED if emptied else None)
        raise CheckFailure(what, detail=f"{n_bad} element(s) non-finite where they should not be (or the reverse): "
                           f"{detail}", inputs=inputs, hint=hint, kind="nonfinite", index=i, observed=observed)
    finite = torch.isfinite(e)
    diff = torch.where(finite, (a - e).abs(), torch.zeros((), dtype=torch.float64))
    if diff.is_complex():
        diff = diff.real
    if diff.numel() == 0:
        return
    flat = diff.reshape(-1)
    max_abs = float(flat.max())
    where_abs = _index(int(flat.argmax()), shape)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny) if not e.is_complex() else diff
    rel = torch.where(finite & (e != 0), rel, torch.zeros((), dtype=torch.float64)).reshape(-1)
    max_rel = float(rel.max())

    if plain is not None:
        p = plain.detach().to(a.dtype)
        if tuple(p.shape) != tuple(e.shape):
            raise ValueError(f"test bug: plain result has shape {tuple(p.shape)}, expected {tuple(e.shape)}")
        p_err = torch.where(finite, (p - e).abs(), torch.zeros((), dtype=torch.float64))
        if not bool(torch.isfinite(p_err).all()):
            raise ValueError("test bug: the plain implementation is not finite where the reference is")
        err_plain = float(p_err.max()) if p_err.numel() else 0.0
        bound = factor * err_plain + atol
        if max_abs <= bound:
            return
        # each entry may also be off by its own rounding to the result's dtype (tolerances rule 1):
        # an lse of 125 in float32 is 7.6e-6 apart from its neighbours, more than atol
        own = ROUNDING_EPS * eps(actual.dtype) * e.abs()
        excess = torch.where(finite, diff - bound - own, torch.full((), -1.0, dtype=torch.float64)).reshape(-1)
        if float(excess.max()) <= 0:
            return
        allowed = (f"{factor:g} × plain {str(plain.dtype).removeprefix('torch.')} error {err_plain:.3g} "
                   f"+ {atol:g} = {bound:.3g} (+ {ROUNDING_EPS:g}·eps·|expected| per entry)")
        i = _index(int(excess.argmax()), shape)
    else:
        tol = atol + rtol * e.abs()
        excess = torch.where(finite, diff - tol, torch.full((), -1.0, dtype=torch.float64)).reshape(-1)
        if float(excess.max()) <= 0:
            return
        i = _index(int(excess.argmax()), shape)
        allowed = f"|error| <= {atol:g}" + (f" + {rtol:g}·|expected|" if rtol else "") + " elementwise"
    raise CheckFailure(what, inputs=inputs, max_abs=max_abs if plain is not None else float(diff[i]),
                       max_rel=max_rel, index=i, expected_value=float(e[i].real if e.is_complex() else e[i]),
                       actual_value=float(a[i].real if a.is_complex() else a[i]), allowed=allowed, hint=hint,
                       kind="mismatch", observed=_holds_other(a, e, others) or _float32_inside(actual, e, max_rel))


def judge_settings(max_examples: int = 25, **overrides: Any):
    """hypothesis settings for tests that call the student: deterministic, no example database on
    disk, no deadline (a call crosses a process boundary), and no shrinking (each shrink step
    would call the student again; a hanging submission would cost a timeout per step)."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck), print_blob=False, **overrides)
