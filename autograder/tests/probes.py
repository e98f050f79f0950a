"""Diagnosis by invariants: after a check fails, a ladder of small probe calls finds where the
student's result first departs from course.reference's float64 dense attention.

Each rung changes ONE thing against the rungs before it (one tile -> several K/V blocks -> several
Q blocks -> a ragged last block -> ... -> causal -> Nq != Nk -> float32 -> peaked scores). The first
rung whose result is wrong, after every earlier rung was right, proves where the bug lives:

    "correct with one K/V block, wrong with 4 K/V blocks (o and lse wrong): the merge across K/V
     blocks, i.e. the rescale of acc and ℓ by exp(m_old - m_new) when the row max grows (§5.1)"

A hint is given only when a probe proves it; when every probe passes, the message says so and
names nothing (the failure then depends on the test's own inputs). Probes run only after a check
failed (no cost for passing code), on judge-chosen inputs that are not the test's inputs, so a
hidden test's message reveals nothing of its inputs. Nothing here implements a graded function:
every expected value is course.reference's dense float64 attention (which ships anyway) or torch
autograd through it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import NAMES_NOTHING, CheckFailure, check_close
from autograder.engine.errors import StudentError, exception_hint
from . import remember
from .remember import attention_plain, attention_reference  # course.reference's, remembered across grades

# A probe whose call crashes or times out stops the ladder: another call would cost another loss.
_STOP_KINDS = {"timeout", "crash", "exit", "memory", "gave_up", "refused", "missing", "import", "output"}
NEUTRAL = NAMES_NOTHING  # the prefix of every message that names nothing (join_hints puts it last)


@dataclass(frozen=True)
class Rung:
    """One probe input: `label` says what is new against the rungs before it; `implies` is what a
    first failure here proves (the part of the algorithm that handles exactly that)."""

    label: str
    spec: dict[str, Any]
    implies: str
    # per-output refinements: {frozenset of wrong outputs: text}, checked before `implies`
    refine: dict[frozenset, str] = field(default_factory=dict)
    # what a first failure here proves when the error is NOT confined to the rows this rung adds (rows
    # that see no key, say): `implies` speaks of those rows only and would name the wrong cause
    outside: str | None = None
    # what it proves when the wrong results hold no NaN: `implies` names the NaN of a missing guard
    finite: str | None = None


@dataclass
class Finding:
    passed: list[Rung]
    failed: Rung | None
    wrong: list[str]  # outputs that were wrong on the failed rung ("o", "lse", "dq", ...)
    raised: str | None = None  # the one-line error, if the probe call raised
    outputs: Any = None  # what the student returned on the failed rung
    inputs: Any = None  # the inputs of the failed rung
    expected: Any = None  # the expected outputs there, where the ladder keeps them
    outside: bool = False  # the error reaches beyond the rows the failed rung adds (Rung.outside)
    later_heads: bool = False  # some (batch, head)s right and others not, or one holds another's (HEADS_TEXT)

    @property
    def finite_case(self) -> bool:
        """The failed rung has a text for wrong results without NaN (Rung.finite), and these hold none."""
        if self.failed is None or not self.failed.finite or self.raised:
            return False
        leaves = self.outputs if isinstance(self.outputs, (tuple, list)) else [self.outputs]
        return not any(isinstance(t, torch.Tensor) and t.is_floating_point() and bool(torch.isnan(t).any())
                       for t in leaves)

    def message(self, proven: str | None = None) -> str:
        """What the ladder found. proven: what a recogniser proved on the failed probe's own inputs (a known
        bug): it replaces the rung's `implies`, which only says what the rung's new feature suggests."""
        if self.failed is None:
            n = len(self.passed)
            said = ", ".join(r.label for r in self.passed)  # what this ladder tried, in its own words
            return f"{NEUTRAL}: all {n} probes are correct ({said})" if n else f"{NEUTRAL} (no probe ran)"
        before = f"correct with {self.passed[-1].label}, " if self.passed else ""
        if self.raised:
            # what the exception itself most often means (errors.exception_hint: a shape error's sizes and
            # usual causes) before what the rung's new feature suggests
            said = exception_hint(self.raised)
            return (f"{before}raises with {self.failed.label} ({self.raised}): "
                    + (f"{said}; " if said else "") + self.failed.implies)
        which = " and ".join(self.wrong) + " wrong"
        if self.later_heads:
            return f"{before}wrong with {self.failed.label} ({which}, not in every head alike): {HEADS_TEXT}"
        if proven:
            return f"{before}wrong with {self.failed.label} ({which}): {proven}"
        if self.finite_case:
            return f"{before}wrong with {self.failed.label} ({which}, no NaN): {self.failed.finite}"
        if self.outside and self.failed.outside:
            return f"{before}wrong with {self.failed.label} ({which}, in rows that do see keys): {self.failed.outside}"
        text = self.failed.refine.get(frozenset(self.wrong), self.failed.implies)
        return f"{before}wrong with {self.failed.label} ({which}): {text}"


def _close(actual: Any, expected: torch.Tensor, plain: torch.Tensor | None, factor: float) -> bool:
    try:
        check_close(actual, expected, what="probe", plain=plain, factor=factor,
                    dtype=plain.dtype if plain is not None else None)
        return True
    except CheckFailure:
        return False


def climb(rungs: list[Rung], run_one: Callable[[Rung], tuple[list[str], Any, Any]], hidden: bool = True) -> Finding:
    """Run the rungs in order until one is wrong. run_one returns (wrong outputs, outputs, inputs).

    hidden: the probes serve a hidden test, whose feedback holds only text the judge wrote: a probe
    that raised is then reported by the kind of failure, never with the submission's own message
    (a submission could put the hidden inputs it saw there)."""
    passed: list[Rung] = []
    for rung in rungs:
        try:
            wrong, outputs, inputs, *expected = run_one(rung)
        except StudentError as e:
            said = e.kind if (hidden or e.kind in _STOP_KINDS) else str(e)
            return Finding(passed, rung, [], raised=said)
        except CheckFailure as e:  # wrong return type/shape on the probe
            said = e.what if hidden else e.what + (f": {e.detail}" if e.detail else "")
            return Finding(passed, rung, [], raised=said)
        if wrong:
            outside, heads = OUTSIDE in wrong, LATER_HEADS in wrong
            wrong = [w for w in wrong if w not in (OUTSIDE, LATER_HEADS)]
            return Finding(passed, rung, wrong, outputs=outputs, inputs=inputs,
                           expected=expected[0] if expected else None, outside=outside, later_heads=heads)
        passed.append(rung)
    return Finding(passed, None, [])


def _hidden(student: Any) -> bool:
    """Whether the probes serve a hidden test or its diagnosis (unknown: treated as hidden)."""
    return getattr(student, "hidden", True) is not False


def in_hidden_test(student: Any) -> bool:
    """Inside a hidden test the checks need no probes: its verdict is uniform and shows the hint of its
    diagnosis, which runs the ladders before the first hidden test (runner.GradingPlugin.run_diagnoses)."""
    return getattr(student, "test_set", None) == "hidden"


OUTSIDE = "(outside)"  # in run_one's wrong outputs: the error reaches rows the rung does not add (Rung.outside)
LATER_HEADS = "(later heads)"  # ... and: some (batch, head)s are right and others not, or one holds another's
HEADS_TEXT = ("some (batch, head)s are right and others wrong, or one holds another's values, so the tile math is "
              "right: each head's data starts at its own offset (Q, O at head·Nq·d, K, V at head·Nk·d, L at "
              "head·Nq: Nq for the query side, Nk for the key side), in every load and store")


def _climb(student: Any, rungs: list[Rung], run_one: Callable[[Rung], tuple]) -> Finding:
    """climb() for a check; nothing found, without a call, inside a hidden test (in_hidden_test)."""
    if in_hidden_test(student):
        return Finding([], None, [])
    return climb(rungs, run_one, _hidden(student))


def _tensors(lead, shapes, seed, dtype, mult=1.0):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(*lead, *s, generator=g, dtype=torch.float64) for s in shapes]
    out[0] = out[0] * mult
    return [t.to(dtype) for t in out]


# ---------------------------------------------------------------------------------------------------
# Parts 2 and 3: the forward ladder

_RESCALE = ("the merge across K/V blocks: when the row max grows, acc and ℓ must be rescaled by "
            "exp(m_old - m_new) (the rescale factor, not its inverse), and acc divided by ℓ once at the end (§5.1)")
_DV = ("v's head dim dv may differ from the head dim d of q and k: o is (..., Nq, dv), and the default scale is 1/√d "
       "of q and k (q.shape[-1]), never of v")
FORWARD_RUNGS = [
    Rung("one full tile (Nq = Nk = 16, blocks 16)", dict(nq=16, nk=16, bq=16, bk=16),
         "the math inside one tile: S = scale·q kᵀ (scale=None means 1/√d), P̃ = exp(S - rowmax), "
         "o = P̃V / rowsum P̃, lse = m + log ℓ in natural log",
         {frozenset({"lse"}): "lse within one tile: lse = m + log ℓ, natural log, m included (§5.1)",
          frozenset({"o"}): "o within one tile: o = P̃V / ℓ, P̃V divided by the row sum ℓ once (lse is right, so S, m "
                            "and ℓ are)"}),
    Rung("one Q block and 4 K/V blocks (Nq 16, Nk 64, blocks 16)", dict(nq=16, nk=64, bq=16, bk=16, mult=3.0),
         _RESCALE,
         {frozenset({"o"}): "the merge across K/V blocks: acc must be rescaled by exp(m_old - m_new) with ℓ (§5.1); "
                            "ℓ and lse are right, so only acc misses the factor (or is divided more than once)",
          frozenset({"lse"}): "lse across K/V blocks: lse = m + log ℓ with the FINAL m and ℓ of the row (§5.1)"}),
    Rung("4 Q blocks (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16),
         "the loop over Q blocks: reset m, ℓ, acc for every Q block and write its rows i0..i1 of o and lse"),
    Rung("block_q ≠ block_k (Nq = Nk = 64, block_q 32, block_k 16)", dict(nq=64, nk=64, bq=32, bk=16),
         "block_q sizes the Q blocks and block_k the K/V blocks: a loop uses the other one"),
    Rung("a ragged last K/V block (Nk = 56, block_k 16)", dict(nq=64, nk=56, bq=16, bk=16),
         "the ragged last K/V block: loop j0 over range(0, Nk, block_k) and slice keys j0:min(j0 + block_k, Nk)"),
    Rung("a ragged last Q block (Nq = 56, block_q 16)", dict(nq=56, nk=64, bq=16, bk=16),
         "the ragged last Q block: loop i0 over range(0, Nq, block_q) and let the last block be shorter"),
    Rung("N = 1 (a single tile shorter than the blocks)", dict(nq=1, nk=1, bq=16, bk=16),
         "a tile shorter than the blocks on both sides: slice rows i0:min(i0 + block_q, Nq) and keys "
         "j0:min(j0 + block_k, Nk), never assume a full block"),
    Rung("an explicit scale (scale = 0.3)", dict(nq=32, nk=32, bq=16, bk=16, scale=0.3),
         "the scale argument: S = scale · q kᵀ with the given scale; only scale=None means 1/√d"),
    Rung("leading dims (2, 3)", dict(lead=(2, 3), nq=32, nk=32, bq=16, bk=16),
         "leading dims: fold every leading dim into one batch dim (reshape(-1, N, d)) and restore them at the end"),
    Rung("no leading dim (q of shape (Nq, d))", dict(lead=(), nq=32, nk=32, bq=16, bk=16),
         "q, k, v may have no leading dim at all: (Nq, d)"),
    Rung("v's head dim differs (d = 8, dv = 12)", dict(nq=32, nk=32, bq=16, bk=16, dv=12), _DV),
    Rung("causal, one tile (Nq = Nk = 16)", dict(nq=16, nk=16, bq=16, bk=16, causal=True),
         "the element-wise causal mask: query i sees key j iff j <= i (here Nq = Nk); masked scores are -inf "
         "before the max and the exp"),
    Rung("causal, several blocks (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16, causal=True),
         "causal across blocks: mask with GLOBAL indices (i0 + r, j0 + c), compute and mask the diagonal block, "
         "skip only K/V blocks entirely above the diagonal (§6.2)"),
    Rung("causal with Nq < Nk (Nq 32, Nk 64)", dict(nq=32, nk=64, bq=16, bk=16, causal=True),
         "bottom-right causal alignment: query i sees key j iff j <= i + (Nk - Nq), not j <= i (§6.2)"),
    Rung("causal with Nq > Nk (Nq 64, Nk 40: rows that see no key, one Q block half of them)",
         dict(nq=64, nk=40, bq=16, bk=8, causal=True),
         "rows that attend no key (causal, Nq > Nk): guard exp(-inf - (-inf)) and ℓ = 0 so they get o = 0, "
         "lse = -inf and no NaN (§4.4); the offset Nk - Nq is negative here",
         outside="a K/V block can hold none of a row's keys although earlier blocks did (a block crossing the "
                 "diagonal; block_k < block_q here): its row max is -inf, so the running max must stay "
                 "m = max(m_old, rowmax S) (not the tile's own max), and that row's ℓ and acc stay as they were "
                 "(α = 1, P̃ = 0; no exp(-inf - (-inf))) (§5.1, §6.2)"),
    Rung("causal, ragged, block_q ≠ block_k (Nq 56, Nk 72, block_q 32, block_k 16)",
         dict(nq=56, nk=72, bq=32, bk=16, causal=True),
         "causal skipping with ragged blocks and an offset Nk - Nq that is not a multiple of the blocks: the last "
         "visible K/V block of Q block [i0, i1) is the one holding key i1 - 1 + (Nk - Nq)"),
    Rung("causal, Q blocks whose last visible key opens a K/V block (Nq 24, Nk 25, blocks 8)",
         dict(nq=24, nk=25, bq=8, bk=8, causal=True),
         "the causal end of the K/V loop: the last row of Q block [i0, i1) sees keys up to i1 - 1 + (Nk - Nq), "
         "so loop over the blocks that start below min(Nk, i1 + Nk - Nq) (§6.2); a bound one key short drops "
         "the block that starts at that key"),
    Rung("float32 (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16, dtype=torch.float32),
         "float32 precision: keep every step in the input dtype (or wider), no float16/bfloat16 step, and return "
         "o and lse in q's dtype"),
    Rung("peaked float32 scores (q × 40)", dict(nq=64, nk=64, bq=16, bk=16, dtype=torch.float32, mult=40.0),
         "large scores: subtract the running max before exp so no exponent is > 0 (§4.2), and rescale with "
         "exp(m_old - m_new) <= 1"),
    Rung("causal, peaked float32 scores (q × 40)", dict(nq=64, nk=64, bq=16, bk=16, causal=True, dtype=torch.float32,
                                                        mult=40.0),
         "masked keys must not enter the row max nor ℓ: set S to -inf where j > i + (Nk - Nq) BEFORE the max and the "
         "exp (a large masked score in m makes exp(S - m) of the visible keys underflow), not P to 0 after it"),
]
KERNEL_SKIP = {"an explicit scale (scale = 0.3)", "no leading dim (q of shape (Nq, d))",
               "N = 1 (a single tile shorter than the blocks)", "v's head dim differs (d = 8, dv = 12)"}


def forward_inputs(spec: dict[str, Any], seed: int = 7):
    lead = spec.get("lead", (2,))
    dtype = spec.get("dtype", torch.float64)
    d = spec.get("d", 8)
    dv = spec.get("dv", d)
    return _tensors(lead, [(spec["nq"], d), (spec["nk"], d), (spec["nk"], dv)], seed, dtype, spec.get("mult", 1.0))


def _wrong_forward(o, lse, q, k, v, causal, scale) -> list[str]:
    ref_o, ref_lse = attention_reference(q, k, v, causal, scale)
    plain_o, plain_lse = attention_plain(q, k, v, causal, scale)
    f = tol.FORWARD_FACTOR
    wrong = [n for n, a, e, p in (("o", o, ref_o, plain_o), ("lse", lse, ref_lse, plain_lse)) if not _close(a, e, p, f)]
    if wrong and causal and _wrong_where_keys_are_seen(o, lse, ref_o, ref_lse, q.shape[-2], k.shape[-2]):
        wrong.append(OUTSIDE)
    return wrong


def _off(a: torch.Tensor, e: torch.Tensor, rel: float) -> torch.Tensor:
    """Where a is off e by more than rel·(1 + |e|) (bool, e's shape); equal infinities agree, NaN never does."""
    a64, e64 = a.detach().double(), e.detach().double()
    both_inf = torch.isinf(a64) & torch.isinf(e64) & (a64 == e64)
    err = torch.where(both_inf, torch.zeros_like(a64), (a64 - e64).abs()).nan_to_num(math.inf)
    return err > rel * (1.0 + e64.abs().nan_to_num(0.0, 0.0, 0.0))


def _heads_differ(o, lse, q, k, v, causal: bool) -> bool:
    """Whether o and lse are right (to float32 rounding) in some (batch, head)s and wrong in others, or a wrong
    one holds another head's expected values: an offset of a head's data, not the tile math."""
    if q.dim() < 3 or math.prod(q.shape[:-2]) < 2:
        return False
    ref_o, ref_lse = attention_reference(q, k, v, causal, None)
    ok = []
    for a, e, inner in ((o, ref_o, 2), (lse, ref_lse, 1)):
        if not isinstance(a, torch.Tensor) or a.shape != e.shape:
            return False
        bad = _off(a.reshape(-1, *e.shape[-inner:]), e.reshape(-1, *e.shape[-inner:]), 1e-4)
        ok.append(~bad.reshape(bad.shape[0], -1).any(1))
    heads_ok = ok[0] & ok[1]
    if bool(heads_ok.any()) and not bool(heads_ok.all()):
        return True
    # every head wrong, but one holds another head's values (all stores to one head's place)
    for a, e, inner in ((o, ref_o, 2), (lse, ref_lse, 1)):
        a64, e64 = a.detach().double().reshape(-1, *e.shape[-inner:]), e.detach().double().reshape(-1, *e.shape[-inner:])
        for h in range(a64.shape[0]):
            for g in range(e64.shape[0]):
                if g != h and torch.allclose(a64[h], e64[g], rtol=1e-4, atol=1e-5, equal_nan=True) \
                        and not torch.allclose(e64[h], e64[g], rtol=1e-4, atol=1e-5, equal_nan=True):
                    return True
    return False


def _wrong_where_keys_are_seen(o, lse, ref_o, ref_lse, nq: int, nk: int) -> bool:
    """Whether o or lse is off (beyond float32 rounding) in a row that sees at least one key (bottom-right
    causal): the error is not only in the rows that see none."""
    seen = torch.arange(nq) + (nk - nq) >= 0  # (Nq,)
    for a, e, row_dim in ((o, ref_o, -2), (lse, ref_lse, -1)):
        if not isinstance(a, torch.Tensor) or a.shape != e.shape or not a.numel():
            continue
        bad = _off(a, e, 1e-5)
        dim = row_dim % bad.dim()
        rows = bad.movedim(dim, 0).reshape(bad.shape[dim], -1).any(1)
        if bool((rows & seen).any()):
            return True
    return False


def _pair(result: Any) -> tuple[Any, Any]:
    if type(result) not in (tuple, list) or len(result) < 2:
        raise CheckFailure("the probe's result is (o, lse)", detail=f"got a {type(result).__name__}")
    return result[0], result[1]


def forward_ladder(student) -> Finding:
    """flash_forward on FORWARD_RUNGS."""
    def one(r: Rung):
        s = r.spec
        q, k, v = forward_inputs(s)
        causal, scale = s.get("causal", False), s.get("scale")
        o, lse = _pair(student.call("flash_forward.flash_forward", q, k, v, causal=causal, block_q=s["bq"],
                                    block_k=s["bk"], scale=scale))
        return _wrong_forward(o, lse, q, k, v, causal, scale), (o, lse), (q, k, v, s)
    return _climb(student, FORWARD_RUNGS, one)


def kernel_ladder(run_case: Callable[..., dict], hidden: bool = True) -> Finding:
    """The same ladder through the part-3 kernel: run_case(nq, nk, d, causal, block_rows, block_cols, lead, q_mult)
    runs the student's kernel through the part-3 check path and returns its {"o", "lse"}. The kernel is float32
    with scale 1/√d; block_rows must be a multiple of 8."""
    rungs = [r for r in FORWARD_RUNGS if r.label not in KERNEL_SKIP and r.spec.get("dtype") is not torch.float32]
    rungs = [Rung(r.label.replace("block_q", "block_rows").replace("block_k", "block_cols"), r.spec, r.implies, r.refine)
             for r in rungs]

    def one(r: Rung):
        s = r.spec
        lead = s.get("lead", (2,))
        out = run_case(nq=s["nq"], nk=s["nk"], d=8, causal=s.get("causal", False), block_rows=s["bq"],
                       block_cols=s["bk"], lead=lead, q_mult=s.get("mult", 1.0))
        q, k, v = out["qkv"]
        wrong = _wrong_forward(out["o"], out["lse"], q, k, v, s.get("causal", False), None)
        if wrong and _heads_differ(out["o"], out["lse"], q, k, v, s.get("causal", False)):
            wrong.append(LATER_HEADS)
        return wrong, (out["o"], out["lse"]), (q, k, v, s)
    return climb(rungs, one, hidden)


# ---------------------------------------------------------------------------------------------------
# Part 4: the backward ladder

BACKWARD_RUNGS = [
    Rung("one full tile (Nq = Nk = 16, blocks 16)", dict(nq=16, nk=16, bq=16, bk=16),
         "the tile math of §7.1-§7.3: P = exp(scale·Q Kᵀ - L), dV = Pᵀ dO, dP = dO Vᵀ, D = rowsum(dO ∘ O), "
         "dS = P ∘ (dP - D), dQ = scale·dS K, dK = scale·dSᵀ Q",
         {frozenset({"dv"}): "dV = Pᵀ dO with P = exp(scale·Q Kᵀ - L) recomputed from lse (§7.2)",
          frozenset({"dq", "dk"}): "dS = P ∘ (dP - D) with D = rowsum(dO ∘ O), and the scale once in dQ = scale·dS K "
                                   "and dK = scale·dSᵀ Q (dV is right, so P is)",
          frozenset({"dq"}): "dQ = scale · dS K (dK and dV are right, so dS is)",
          frozenset({"dk"}): "dK = scale · dSᵀ Q, the scale once (dQ and dV are right, so dS is)"}),
    Rung("one Q block and 4 K/V blocks (Nq 16, Nk 64, blocks 16)", dict(nq=16, nk=64, bq=16, bk=16),
         "the loop over K/V blocks: dQ_i accumulates every K/V block's scale·dS K_j (+=, never =), and D_i is "
         "rowsum(dO_i ∘ O_i) over the whole row, not one tile's (§7.3, §7.4)",
         {frozenset({"dq"}): "dQ_i accumulates over all K/V blocks: dQ_i += scale·dS_ij K_j, never overwritten (§7.4)"}),
    Rung("4 Q blocks and one K/V block (Nq 64, Nk 16, blocks 16)", dict(nq=64, nk=16, bq=16, bk=16),
         "the loop over Q blocks: dK_j and dV_j accumulate every Q block's contribution (+=, never =) (§7.4)",
         {frozenset({"dk", "dv"}): "dK_j and dV_j accumulate over all Q blocks (dK_j += …, dV_j += P_ijᵀ dO_i); "
                                   "never overwritten (§7.4)"}),
    Rung("4 × 4 blocks (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16),
         "the two loops together: each (Q block, K/V block) pair once, dQ, dK, dV accumulated across pairs"),
    Rung("block_q ≠ block_k (Nq = Nk = 64, block_q 32, block_k 16)", dict(nq=64, nk=64, bq=32, bk=16),
         "block_q sizes the Q blocks and block_k the K/V blocks: a loop uses the other one"),
    Rung("a ragged last K/V block (Nk = 56, block_k 16)", dict(nq=64, nk=56, bq=16, bk=16),
         "the ragged last K/V block: loop j0 over range(0, Nk, block_k) and slice keys j0:min(j0 + block_k, Nk)"),
    Rung("a ragged last Q block (Nq = 56, block_q 16)", dict(nq=56, nk=64, bq=16, bk=16),
         "the ragged last Q block: loop i0 over range(0, Nq, block_q) and let the last block be shorter"),
    Rung("an explicit scale (scale = 0.3)", dict(nq=32, nk=32, bq=16, bk=16, scale=0.3),
         "the scale argument: S = scale·Q Kᵀ, dQ = scale·dS K, dK = scale·dSᵀ Q with the given scale"),
    Rung("leading dims (2, 3)", dict(lead=(2, 3), nq=32, nk=32, bq=16, bk=16),
         "leading dims: fold every leading dim into one batch dim and restore them at the end"),
    Rung("v's head dim differs (d = 8, dv = 12)", dict(nq=32, nk=32, bq=16, bk=16, dv=12),
         "v's head dim dv may differ from d: dv and do have v's head dim, dq and dk q's and k's, and the default "
         "scale is 1/√d of q and k, never of v"),
    Rung("causal, one tile (Nq = Nk = 16)", dict(nq=16, nk=16, bq=16, bk=16, causal=True),
         "the element-wise causal mask: key j is visible to query i iff j <= i (the diagonal included); "
         "P = 0 where masked"),
    Rung("causal, several blocks (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16, causal=True),
         "causal across blocks: mask with GLOBAL indices, compute the diagonal blocks, skip only block pairs "
         "entirely above the diagonal (§6.2)"),
    Rung("causal with Nq < Nk (Nq 32, Nk 64)", dict(nq=32, nk=64, bq=16, bk=16, causal=True),
         "bottom-right causal alignment: query i sees key j iff j <= i + (Nk - Nq), not j <= i (§6.2)"),
    Rung("causal with Nq > Nk (Nq 64, Nk 40: rows that see no key, one Q block half of them)",
         dict(nq=64, nk=40, bq=16, bk=8, causal=True),
         "rows with lse = -inf (they attend no key): guard exp(S - L) so their P row is 0, no NaN; the offset "
         "Nk - Nq is negative here"),
    Rung("causal, ragged, block_q ≠ block_k (Nq 56, Nk 72, block_q 32, block_k 16)",
         dict(nq=56, nk=72, bq=32, bk=16, causal=True),
         "causal skipping with ragged blocks and an offset that is not a multiple of the blocks: the first Q "
         "block that sees K/V block [j0, j1) holds row j0 - (Nk - Nq)"),
    Rung("float32 (Nq = Nk = 64, blocks 16)", dict(nq=64, nk=64, bq=16, bk=16, dtype=torch.float32),
         "float32 precision: keep every step in the input dtype (or wider) and return the input's dtype"),
]


def backward_inputs(spec: dict[str, Any], seed: int = 11):
    lead = spec.get("lead", (2,))
    dtype = spec.get("dtype", torch.float64)
    d = 8
    dv = spec.get("dv", d)
    q, k, v, do = _tensors(lead, [(spec["nq"], d), (spec["nk"], d), (spec["nk"], dv), (spec["nq"], dv)], seed, dtype)
    return q, k, v, do


def reference_grads(q, k, v, do, causal, scale, dtype=torch.float64):
    return remember.reference_grads(q, k, v, do, causal, scale, str(dtype).removeprefix("torch."))


def backward_ladder(student) -> Finding:
    """flash_backward on BACKWARD_RUNGS, given the reference o and lse (as the tests give them)."""
    def one(r: Rung):
        s = r.spec
        q, k, v, do = backward_inputs(s)
        causal, scale = s.get("causal", False), s.get("scale")
        o, lse = attention_reference(q, k, v, causal, scale)
        grads = student.call("flash_backward.flash_backward", q, k, v, o.to(q.dtype), lse.to(q.dtype), do,
                             causal=causal, block_q=s["bq"], block_k=s["bk"], scale=scale)
        if type(grads) not in (tuple, list) or len(grads) != 3:
            raise CheckFailure("the probe's result is (dq, dk, dv)", detail=f"got a {type(grads).__name__}")
        ref = reference_grads(q, k, v, do, causal, scale)
        plain = reference_grads(q, k, v, do, causal, scale, q.dtype)
        wrong = [n for n, a, e, p in zip(("dq", "dk", "dv"), grads, ref, plain)
                 if not _close(a, e, p, tol.GRADIENT_FACTOR)]
        return wrong, grads, (q, k, v, o, lse, do, s)
    return _climb(student, BACKWARD_RUNGS, one)


# ---------------------------------------------------------------------------------------------------
# Part 6: combine, partial and decode ladders (expected: dense attention over the whole key range)

def _seg_partials(q, k, v, lengths, scale, dtype):
    """Exact partials (float64 dense attention per segment, (0, -inf) when empty), cast to dtype."""
    out, a = [], 0
    for n in lengths:
        if n == 0:
            out.append((torch.zeros(*q.shape[:-1], v.shape[-1], dtype=dtype),
                        torch.full(q.shape[:-1], -math.inf, dtype=dtype)))
        else:
            o, lse = attention_reference(q, k[..., a:a + n, :], v[..., a:a + n, :], False, scale)
            out.append((o.to(dtype), lse.to(dtype)))
        a += n
    return out


COMBINE_RUNGS = [
    Rung("one partial (combine of a single segment is that segment)", dict(lengths=[12]),
         "⊕ over one segment returns it unchanged: lse = lse_1, o = o_1"),
    Rung("two equal segments", dict(lengths=[6, 6]),
         "⊕: lse = log Σ_s exp(lse_s) and o = Σ_s exp(lse_s - lse) o_s (§4.4, §8.4): weight each normalised "
         "o_s by its share of the softmax mass",
         {frozenset({"lse"}): "the combined lse is log Σ_s exp(lse_s) (computed stably around max_s lse_s), §4.4",
          frozenset({"o", "lse"}): "the combined lse is log Σ_s exp(lse_s) (stably, around max_s lse_s), and each o_s "
                                   "is weighted by exp(lse_s - lse) (§4.4, §8.4)"}),
    Rung("three unequal segments with peaked scores", dict(lengths=[2, 7, 3], mult=20.0),
         "⊕ with very different lse_s: compute around the max (lse = max + log Σ exp(lse_s - max)) and weight by "
         "exp(lse_s - lse), not by segment length or 1/S (§4.4)"),
    Rung("an empty segment among them (o = 0, lse = -inf)", dict(lengths=[5, 0, 7]),
         "an empty segment (o = 0, lse = -inf) is the identity of ⊕: its weight exp(-inf - lse) = 0, no NaN (§4.4)"),
    Rung("every segment empty", dict(lengths=[0, 0], nk=0),
         "every segment empty: the result is o = 0, lse = -inf with no NaN; guard exp(lse_s - lse) when lse = -inf"),
    Rung("float32 partials", dict(lengths=[6, 6], dtype=torch.float32, mult=20.0),
         "float32: keep the combine in the partials' dtype (or wider) and return it"),
]


def combine_ladder(student) -> Finding:
    def one(r: Rung):
        s = r.spec
        lengths = s["lengths"]
        nk = sum(lengths)
        dtype = s.get("dtype", torch.float64)
        q, k, v = _tensors((2,), [(1, 8), (nk, 8), (nk, 8)], 5, torch.float64, s.get("mult", 1.0))
        q, k, v = (t.to(dtype) for t in (q, k, v))
        partials = _seg_partials(q, k, v, lengths, None, dtype)
        o, lse = _pair(student.call("flash_decoding.combine_partials", partials))
        if nk == 0:
            ok_o = type(o) is torch.Tensor and not bool(torch.isnan(o).any()) and bool((o == 0).all())
            ok_l = type(lse) is torch.Tensor and bool(torch.isneginf(lse).all())
            return [n for n, ok in (("o", ok_o), ("lse", ok_l)) if not ok], (o, lse), (partials, lengths)
        ref_o, ref_lse = attention_reference(q, k, v, False, None)
        bound_o, bound_lse = tol.combine_bounds(partials)
        wrong = [n for n, a, e, b in (("o", o, ref_o, bound_o), ("lse", lse, ref_lse, bound_lse))
                 if not _close_abs(a, e, b, dtype)]
        return wrong, (o, lse), (partials, lengths), (ref_o, ref_lse)
    return _climb(student, COMBINE_RUNGS, one)


def _close_abs(actual, expected, bound, dtype) -> bool:
    try:
        check_close(actual, expected, what="probe", atol=bound, rtol=0.0, dtype=dtype)
        return True
    except CheckFailure:
        return False


PARTIAL_RUNGS = [
    Rung("one segment of 12 keys", dict(nk=12),
         "attention over the segment: o_s = softmax(scale·q kᵀ) v normalised within the segment, lse_s = m + log ℓ",
         {frozenset({"lse"}): "lse_s = m + log ℓ over the segment's scaled scores, in natural log (§4.4, §5.1)"}),
    Rung("an explicit scale (0.3)", dict(nk=12, scale=0.3),
         "the scale argument: S = scale · q kᵀ; only scale=None means 1/√d"),
    Rung("v's head dim differs (d = 8, dv = 12)", dict(nk=12, dv=12), _DV),
    Rung("peaked scores (q × 40)", dict(nk=12, mult=40.0),
         "large scores: subtract the row max before exp (§4.2)"),
    Rung("an empty segment (0 keys)", dict(nk=0),
         "an empty segment gives o = 0, lse = -inf (the identity of ⊕), no NaN"),
]


def partial_ladder(student) -> Finding:
    def one(r: Rung):
        s = r.spec
        q, k, v = _tensors((2,), [(1, 8), (s["nk"], 8), (s["nk"], s.get("dv", 8))], 6, torch.float64, s.get("mult", 1.0))
        o, lse = _pair(student.call("flash_decoding.attention_partial", q, k, v, s.get("scale")))
        if s["nk"] == 0:
            ok_o = type(o) is torch.Tensor and tuple(o.shape) == (2, 1, 8) and bool((o == 0).all())
            ok_l = type(lse) is torch.Tensor and tuple(lse.shape) == (2, 1) and bool(torch.isneginf(lse).all())
            return [n for n, ok in (("o", ok_o), ("lse", ok_l)) if not ok], (o, lse), None
        return _wrong_forward(o, lse, q, k, v, False, s.get("scale")), (o, lse), None
    return _climb(student, PARTIAL_RUNGS, one)


DECODE_RUNGS = [
    Rung("num_splits = 1", dict(nk=12, splits=1),
         "with one segment flash_decode is attention_partial over all keys"),
    Rung("2 segments of 6 keys", dict(nk=12, splits=2),
         "the split and combine: split_kv's segments, attention_partial of each, combine_partials (⊕) of them (§8.4)"),
    Rung("3 uneven segments (13 keys)", dict(nk=13, splits=3),
         "uneven segments: every key in exactly one segment (tensor_split), lengths may differ by one"),
    Rung("more splits than keys (5 keys, 8 splits: empty segments)", dict(nk=5, splits=8),
         "empty segments (o = 0, lse = -inf) must pass through ⊕ as the identity, no NaN"),
    Rung("an explicit scale (0.3)", dict(nk=12, splits=2, scale=0.3),
         "the scale argument reaches every attention_partial call"),
    Rung("v's head dim differs (d = 8, dv = 12)", dict(nk=12, splits=2, dv=12), _DV),
    Rung("two queries (Nq = 2)", dict(nk=12, splits=2, nq=2),
         "Nq > 1: every query row is combined on its own"),
]


def decode_ladder(student) -> Finding:
    def one(r: Rung):
        s = r.spec
        q, k, v = _tensors((2,), [(s.get("nq", 1), 8), (s["nk"], 8), (s["nk"], s.get("dv", 8))], 8, torch.float64, 10.0)
        o, lse = _pair(student.call("flash_decoding.flash_decode", q, k, v, s["splits"], s.get("scale")))
        return _wrong_forward(o, lse, q, k, v, False, s.get("scale")), (o, lse), (q, k, v)
    return _climb(student, DECODE_RUNGS, one)


# ---------------------------------------------------------------------------------------------------
# Part 1: softmax, online_summary and ⊕ ladders (expected: torch.softmax / logsumexp in float64)

def _rows(kind: str, shape=(3, 6), seed=3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if kind == "increasing":
        x = x.sort(-1).values
    elif kind == "decreasing":
        x = x.sort(-1, descending=True).values
    elif kind == "shifted":
        x = x + 1000.0
    elif kind == "neginf":
        x[..., 1::2] = -math.inf
    elif kind == "allneginf":
        x[1] = -math.inf
    elif kind == "negative":
        x = -x.abs() - 1.0
    elif kind == "spread":  # row i shifted by 400·i: one max for the whole tensor underflows the lower rows
        x = x + 400.0 * torch.arange(x.shape[-2], dtype=x.dtype).unsqueeze(-1)
    return x


SOFTMAX_RUNGS = [
    Rung("one row of 6 values", dict(kind="plain", shape=(1, 6)),
         "the softmax of one row: exp(x_j - m) / Σ_k exp(x_k - m)"),
    Rung("several rows (3 × 6)", dict(kind="plain", shape=(3, 6)),
         "each row on its own: the max and the sum run over the LAST dim only (dim=-1, keepdim=True)"),
    Rung("leading dims (2 × 3 × 6)", dict(kind="plain", shape=(2, 3, 6)),
         "any number of leading dims: reduce over dim=-1, not over a fixed dim"),
    Rung("-inf entries", dict(kind="neginf", shape=(3, 6)),
         "-inf scores get probability 0 and do not break the row's max or sum"),
    Rung("rows shifted by +1000", dict(kind="shifted", shape=(3, 6), naive=False),
         "large scores: subtract the row max before exp so no exponent is > 0 (§4.2); exp(1000) overflows"),
    Rung("rows 400 apart (row i shifted by 400·i)", dict(kind="spread", shape=(3, 6), naive=False),
         "each row subtracts its OWN max (amax over dim=-1, keepdim=True), not one max of the whole tensor: a "
         "row far below the global max underflows to 0"),
    Rung("an all -inf row", dict(kind="allneginf", shape=(3, 6), naive=False),
         "an all -inf row has no max to subtract: guard exp(-inf - (-inf)) and ℓ = 0, and give zeros (§4.2)"),
]


def softmax_ladder(student, fn: str) -> Finding:
    rungs = [r for r in SOFTMAX_RUNGS if fn != "naive_softmax" or r.spec.get("naive", True)]

    def one(r: Rung):
        x = _rows(r.spec["kind"], r.spec["shape"])
        out = student.call(f"online_softmax.{fn}", x)
        lse = torch.logsumexp(x, -1, keepdim=True)
        ref = torch.exp(x - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse))
        ok = _close_rel(out, ref, tol.softmax_rtol(x.shape[-1], x.dtype), x.dtype)
        return ([] if ok else ["p"]), out, x
    return _climb(student, rungs, one)


def _close_rel(actual, expected, rtol, dtype, atol=None) -> bool:
    try:
        check_close(actual, expected, what="probe", atol=tol.atol_for(dtype) if atol is None else atol, rtol=rtol,
                    dtype=dtype)
        return True
    except CheckFailure:
        return False


SUMMARY_RUNGS = [
    Rung("one column", dict(kind="plain", shape=(3, 1)),
         "the summary of one value: m = x_0, ℓ = exp(x_0 - m) = 1"),
    Rung("increasing rows (the max grows at every column)", dict(kind="increasing"),
         "when the running max grows, rescale ℓ by exp(m_old - m_new) before adding exp(x_j - m_new) (§4.3)"),
    Rung("decreasing rows (the max never grows)", dict(kind="decreasing"),
         "when the max does not grow, ℓ += exp(x_j - m) with the current max"),
    Rung("random rows", dict(kind="plain"),
         "ℓ = Σ_j exp(x_j - m) relative to the FINAL max m, rescaled at every rebase (§4.3)"),
    Rung("rows of negative values only", dict(kind="negative"),
         "the running max starts at -inf, the identity of max (and ℓ at 0): one started at 0 stays 0 on a row of "
         "negative values (§4.3)",
         {frozenset({"ℓ"}): "ℓ on rows whose values are all negative (m is right): ℓ = Σ_j exp(x_j - m) relative to "
                            "the row's own max, rescaled by exp(m_old - m_new) at every rebase (§4.3)"}),
    Rung("leading dims (2 × 3 × 6)", dict(kind="plain", shape=(2, 3, 6)),
         "any number of leading dims: stream over the last dim, vectorised over the others"),
    Rung("-inf entries", dict(kind="neginf"),
         "an x_j = -inf adds exp(-inf) = 0; guard exp(-inf - (-inf)) while the running max is still -inf"),
    Rung("an all -inf row", dict(kind="allneginf"),
         "an all -inf row keeps (m, ℓ) = (-inf, 0): guard exp(-inf - (-inf)) = NaN (§4.4)"),
    Rung("rows shifted by +1000", dict(kind="shifted"),
         "ℓ is relative to the max (Σ_j exp(x_j - m), each term <= 1): without the max shift exp(x_j) overflows"),
]


def summary_ladder(student) -> Finding:
    def one(r: Rung):
        x = _rows(r.spec["kind"], r.spec.get("shape", (3, 6)))
        m, l = _pair(student.call("online_softmax.online_summary", x))
        m_ref = x.amax(-1)
        l_ref = torch.exp(x - torch.where(torch.isneginf(m_ref), torch.zeros_like(m_ref), m_ref).unsqueeze(-1)).sum(-1)
        wrong = [n for n, a, e, rt in (("m", m, m_ref, 0.0), ("ℓ", l, l_ref, tol.summary_rtol(x.shape[-1], x.dtype)))
                 if not _close_rel(a, e, rt, x.dtype, atol=0.0)]
        return wrong, (m, l), x
    return _climb(student, SUMMARY_RUNGS, one)


def summary_of_scores(x: torch.Tensor, v: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """(m, ℓ) of each row of the scores x (..., N), or (m, ℓ, o) with values v (..., N, dv), in
    float64: m = max, ℓ = Σ_j exp(x_j - m), o = Σ_j exp(x_j - m) v_j; empty or all -inf rows give
    (-inf, 0, 0). Computed in NUMPY on purpose: these are the judge's references for graded torch
    functions, and numpy work is invisible to the grader's recorder, so this code copied into a
    submission brings its answers in from outside the recorded ops (refused or caught by the twin)."""
    a = x.detach().double().numpy()
    if a.shape[-1] == 0:
        m, l = np.full(a.shape[:-1], -np.inf), np.zeros(a.shape[:-1])
        o = None if v is None else np.zeros((*a.shape[:-1], v.shape[-1]))
    else:
        m = a.max(axis=-1)
        p = np.exp(a - np.where(np.isneginf(m), 0.0, m)[..., None])
        l = p.sum(axis=-1)
        o = None if v is None else np.einsum("...n,...nd->...d", p, v.detach().double().numpy())
    arrays = (m, l) if o is None else (m, l, o)
    return tuple(torch.from_numpy(np.array(a, dtype=np.float64)) for a in arrays)  # np.array keeps 0-d shapes


def _segment(x: torch.Tensor, v: torch.Tensor):
    """(m, ℓ, o) of a segment straight from its values: no ⊕ involved."""
    return summary_of_scores(x, v)


def _summaries(ma: float, mb: float, lead=(3,)):
    """a, b: (m, ℓ, o) of two key segments whose maxima are ma and mb (-inf: an empty segment), and the
    (m, ℓ, o) of both segments together, the expected ⊕."""
    g = torch.Generator().manual_seed(4)
    xs, vs = [], []
    for top in (ma, mb):
        x = torch.randn(*lead, 4, generator=g, dtype=torch.float64)
        x = torch.full_like(x, -math.inf) if top == -math.inf else x - x.amax(-1, keepdim=True) + top
        xs.append(x)
        vs.append(torch.randn(*lead, 4, 4, generator=g, dtype=torch.float64))
    a, b = _segment(xs[0], vs[0]), _segment(xs[1], vs[1])
    return a, b, _segment(torch.cat(xs, -1), torch.cat(vs, -2))


MERGE_RUNGS = [
    Rung("equal maxima (m_a = m_b)", dict(ma=0.0, mb=0.0),
         "⊕ with no rebase: ℓ = ℓ_a + ℓ_b (and o = o_a + o_b) when both maxima are equal (§4.4)"),
    Rung("m_a > m_b", dict(ma=3.0, mb=0.0),
         "⊕ rebases b on the larger max m = m_a: ℓ_b (and o_b) times exp(m_b - m) (§4.4)"),
    Rung("m_b > m_a", dict(ma=0.0, mb=3.0),
         "⊕ rebases a on the larger max m = m_b: ℓ_a (and o_a) times exp(m_a - m) (§4.4)"),
    Rung("a ⊕ identity (-inf, 0)", dict(ma=2.0, mb=-math.inf),
         "the identity (-inf, 0) contributes exp(-inf - m)·0 = 0: a ⊕ (-inf, 0) = a (§4.4)"),
    Rung("identity ⊕ identity", dict(ma=-math.inf, mb=-math.inf),
         "missing -inf guard: with m = -inf, exp(-inf - (-inf)) = NaN; rebase on 0 so (-inf, 0) ⊕ (-inf, 0) = (-inf, 0)",
         finite="(-inf, 0) ⊕ (-inf, 0) must be the identity (-inf, 0) itself: the 0 a guard rebases on is for the "
                "exponents only, exp(m_a - 0); the merged m stays max(m_a, m_b) = -inf and ℓ stays 0 (§4.4)"),
    Rung("leading dims (2 × 3)", dict(ma=1.0, mb=2.0, lead=(2, 3)),
         "any leading dims; o has one more trailing dim than m and ℓ: unsqueeze(-1) the factors"),
]


def merge_ladder(student, fn: str) -> Finding:
    with_o = fn == "merge_partial"

    def one(r: Rung):
        a, b, ref = _summaries(r.spec["ma"], r.spec["mb"], r.spec.get("lead", (3,)))
        if not with_o:
            a, b, ref = a[:2], b[:2], ref[:2]
        got = student.call(f"online_softmax.{fn}", a, b)
        if type(got) not in (tuple, list) or len(got) != len(a):
            raise CheckFailure(f"the probe's result is {'(m, ℓ, o)' if with_o else '(m, ℓ)'}",
                               detail=f"got a {type(got).__name__}")
        names = ("m", "ℓ", "o")
        wrong = [n for n, x, e in zip(names, got, ref) if not _close_rel(x, e, tol.merge_rtol(torch.float64),
                                                                        torch.float64, atol=1e-12)]
        return wrong, got, (a, b)
    return _climb(student, MERGE_RUNGS, one)


# ---------------------------------------------------------------------------------------------------
# Part 5: the cache on its own (one update, then a second, then another layer)

CACHE_RUNGS = [
    Rung("one update of 3 tokens", dict(n=1),
         "KVCache.update(layer, k_new, v_new) returns (k_all, v_all): the layer's filled prefix, here exactly k_new, "
         "v_new"),
    Rung("a second update of 2 tokens", dict(n=2),
         "after a second update, (k_all, v_all) hold ALL the cached tokens so far (length + T), in order, not only the "
         "new ones: write k_new at positions length .. length + T - 1 and return the prefix [:length + T]"),
    Rung("an update of another layer", dict(n=3),
         "each layer has its own keys, values and length: updating layer 1 leaves layer 0 as it was"),
]


def cache_ladder(student) -> Finding:
    g = torch.Generator().manual_seed(9)
    sizes = [(0, 3), (0, 2), (1, 4)]
    updates = [(layer, torch.randn(1, 2, t, 4, generator=g), torch.randn(1, 2, t, 4, generator=g))
               for layer, t in sizes]

    def one(r: Rung):
        n = r.spec["n"]
        record = student.scenario("part5.cache_updates", n_layers=2, batch=1, n_heads=2, max_len=8, head_dim=4,
                                  updates=updates[:n], dtype="float32")
        flat = tuple(t for _, k, v in updates[:n] for t in (k, v))
        res = replay.replay_record(student, record, "KVCache.update", flat, {}, seed=None)[0].result  # the judge's
        k_all, v_all = res["results"][n - 1]
        layer = updates[n - 1][0]
        mine = [u for u in updates[:n] if u[0] == layer]
        want_k, want_v = torch.cat([u[1] for u in mine], 2), torch.cat([u[2] for u in mine], 2)
        wrong = [name for name, a, e in (("k_all", k_all, want_k), ("v_all", v_all, want_v))
                 if not (isinstance(a, torch.Tensor) and a.shape == e.shape and bool(torch.equal(a, e)))]
        return wrong, (k_all, v_all), None
    return _climb(student, CACHE_RUNGS, one)
