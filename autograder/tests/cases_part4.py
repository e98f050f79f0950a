"""Part 4 (flash_backward, FlashAttentionFunction, flash_attention): checks shared by public and hidden tests.

Part 4 is graded independently of part 2:
- flash_backward receives the judge's o and lse (float64 reference, cast to the input dtype);
- FlashAttentionFunction / flash_attention run in the worker with a correct forward in place of the
  student's flash_forward (scenarios/part4.py), so a part-2 bug costs points only in part 2.

(a) references: dq, dk, dv against torch autograd through course.reference.attention_reference
    (float64); the plain float32 autograd gradients set the tolerance (3× rule); a gradient check of
    the student's FlashAttentionFunction on tiny float64 shapes: its analytical gradients (the replayed
    backward) against the exact float64 derivative of the forward it ran (the judge's own forward).
    Gradients are tested on unit-scale inputs only: with peaked scores P = exp(S - L) amplifies the
    float32 rounding of S and of the given L beyond what the plain softmax (which renormalises) shows;
    the reference solution measured 3.1-4.5× the plain error at scores ×5 to ×20, 0.7-1.3× at ×1.
(b) conventions: fully masked rows (causal, Nq > Nk) have zero gradients, nothing is NaN;
    bottom-right alignment with Nq != Nk both ways.
(c) what the JUDGE measures in its own replay (autograder/engine/replay.py): backward matmul FLOPs
    between the tightest legal causal skipping and 2.5× the forward's whole-block count (5 tile
    matmuls against 2, §7.5) plus D as a matmul, counting only ops whose results reach the gradients
    (liveness.live_matmul_flops: a product nothing uses recomputes nothing); no fused op, no Nq×Nk
    storage; S, P, dP and dS one B_r × B_c tile at a time (cases_part2.check_tiles_live); the Function
    keeps q, k, v, O and lse and nothing more for its backward: the storages made in the forward that
    the recorded backward reads (saved tensors, ctx attributes, closures, lists and dicts of tiles
    alike), no one of them Nq × Nk per head and all of them together no more than q, k, v, O and lse
    hold (§7.2: the backward recomputes S and P).

Every test grades the replay's output (the worker's own return values are never used), and a second
replay on judge-drawn inputs must compute the reference gradients of those inputs (check_twin).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from autograder.engine import replay
from autograder.engine import tolerances as tol
from autograder.engine.checks import check, check_tensor, unpack
from . import remember
from .remember import attention_plain, attention_reference  # course.reference's, remembered across grades

from . import diagnose as dg
from . import liveness
from .cases_part2 import (KEY_SIDE, QUERY_SIDE, VALUE_SIDE, AttnCase, check_key_extents, check_no_hand_made_products,
                          check_tiles_live, check_trace_common, close_or_diagnose, dead_flops, forward_flops,
                          computed_scores_bounds, matmul_flops_defined, separates)

HINT_BWD_FEWER = ("fewer matmul FLOPs than 2.5× the forward: per visible (Q block, K/V block) pair the backward "
                  "does 5 tile matmuls, S = scale·Q Kᵀ (recomputed), dV += Pᵀ dO, dP = dO Vᵀ, dQ += dS K, "
                  "dK += dSᵀ Q (§7.2, §7.5); recompute P instead of storing it")
HINT_BWD_MORE = ("more matmul FLOPs than 2.5× the forward: 5 tile matmuls per visible block pair, each pair once, "
                 "ragged last tiles as they are, and causal skipping of blocks above the diagonal (§6.2, §7.4)")
HINT_BWD_NO_SKIP = ("causal backward without block skipping: every (Q block, K/V block) pair was computed; skip "
                    "the pairs entirely above the diagonal as in the forward (§6.2 block skipping)")
HINT_SAVES_P = ("the autograd.Function keeps an Nq × Nk tensor (P or S) for backward: save only q, k, v, O and "
                "lse with ctx.save_for_backward and recompute P in backward (§7.2)")
HINT_SAVES_O_LSE = ("FlashAttentionFunction.forward must save O and lse (the row logsumexp, shape (..., Nq)) with "
                    "ctx.save_for_backward, next to q, k, v (§7.2)")
HINT_FUNCTION_ARGS = ("FlashAttentionFunction must pass causal, block_q, block_k AND scale from forward to backward "
                      "(keep them on ctx) and on to flash_backward; the gradients here are those of another scale "
                      "or mask")
HINT_FUNCTION = ("FlashAttentionFunction.backward must call flash_backward with the saved q, k, v, O, lse and "
                 "return (dq, dk, dv, None, None, None, None)")


def _do(case: AttnCase) -> torch.Tensor:
    """The upstream gradient dO, from its own seed (so dO is independent of q, k, v)."""
    g = torch.Generator().manual_seed(10_000 + case.seed)
    return torch.randn(*case.lead, case.nq, case.d, generator=g, dtype=torch.float64).to(case.torch_dtype)


def reference_grads(q, k, v, do, case: AttnCase) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(float64 autograd gradients of attention_reference, autograd gradients of attention_plain in q's dtype)."""
    return (remember.reference_grads(q, k, v, do, case.causal, case.scale),
            remember.reference_grads(q, k, v, do, case.causal, case.scale, str(q.dtype).removeprefix("torch.")))


def lost_settings(actual: Any, which: str, q, k, v, o64, lse64, do, case: AttnCase, bound: float) -> str | None:
    """Where the Function's gradient `which` is what the backward gives from the forward's o and lse with
    ANOTHER causal flag or scale (the settings did not reach it through ctx): the hint that names which.
    The probes check flash_backward on its own, so they cannot see a setting the Function drops."""
    idx = {"dq": 0, "dk": 1, "dv": 2}[which]
    if not isinstance(actual, torch.Tensor) or not actual.is_floating_point():
        return None
    nq, nk = q.shape[-2], k.shape[-2]
    tried = {f"causal={not case.causal}": (not case.causal, case.scale)}
    if case.scale is not None:
        tried["the default scale 1/√d instead of its scale argument"] = (case.causal, None)
    right = dg.masked_backward(q, k, v, o64, lse64, do, dg._mask(nq, nk, case.causal), case.scale, d_mode="ok")[idx]
    off = dg._dist(actual, right) if actual.shape == right.shape else math.inf
    for label, (causal, scale) in tried.items():
        got = dg.masked_backward(q, k, v, o64, lse64, do, dg._mask(nq, nk, causal), scale, d_mode="ok")[idx]
        if got.shape != actual.shape or dg._dist(got, right) <= bound:
            continue  # indistinguishable from the right gradient on these inputs
        # masked keys under the forward's lse give large values: their rounding in q's dtype scales with them
        allowed = dg.MATCH_TOL_FACTOR * bound + 64 * torch.finfo(actual.dtype).eps * float(got.abs().max())
        found = dg._dist(actual, got)
        if found <= allowed and found <= dg.MATCH_RATIO * off:
            return (f"{which} is what flash_backward gives with {label}: the Function's backward did not get the "
                    f"settings its forward used; keep causal, block_q, block_k and scale on ctx and pass them all "
                    f"to flash_backward")
    return None


def _check_grads(grads: Any, q, k, v, o64, lse64, do, case: AttnCase, *, fn: str, hidden: bool,
                 student: Any = None, hint: str | None = None, function: bool = False) -> None:
    """dq, dk, dv against float64 autograd (3× rule). The hint: the backward probes and recognisers, and `hint`
    first when the gradients come through the Function (whose flash_backward the probes check on its own);
    with `function`, a gradient of a backward that got other settings is named first (lost_settings)."""
    dq, dk, dv = unpack(grads, 3, what=f"{fn} returns (dq, dk, dv)")
    expected, plain = reference_grads(q, k, v, do, case)
    inputs = case.shown(q, k, v, do=do)
    diag = dict(causal=case.causal, block_q=case.block_q, block_k=case.block_k, scale=case.scale, where=not hidden,
                student=student)
    names = ("dq", "dk", "dv")
    for name, actual, exp, pl in zip(names, (dq, dk, dv), expected, plain):
        others = {f"the values expected of {n} instead: two outputs swapped, or one tensor written for both?": e
                  for n, e in zip(names, expected) if n != name}
        close_or_diagnose(
            actual, exp, what=f"{name} of {fn} against torch autograd of float64 attention", inputs=inputs,
            plain=pl, factor=tol.GRADIENT_FACTOR, others=others,
            diagnose=lambda bound, a=actual, n=name: dg._compose(
                function and lost_settings(a, n, q, k, v, o64, lse64, do, case, bound) or hint,
                dg.diagnose_backward(a, n, q, k, v, o64, lse64, do, tol=bound, **diag)))


def check_backward_values(student, case: AttnCase, *, hidden: bool = False) -> None:
    """flash_backward(q, k, v, o, lse, dO) with the judge's o and lse -> dq, dk, dv against autograd (3× rule)."""
    rp, q, k, v, do, o64, lse64 = replayed_backward(student, case)
    _check_grads(rp.result, q, k, v, o64, lse64, do, case, fn="flash_backward", hidden=hidden, student=student)
    check_backward_structure(rp, case, inputs=case.shown(q, k, v, do=do), sides=BACKWARD_SIDES)


def check_masked_rows_grads(student, case: AttnCase) -> None:
    """Causal with Nq > Nk: no NaN in any gradient, and dq = 0 in the rows that attend no key."""
    assert case.causal and case.nq > case.nk, "test bug: needs causal with Nq > Nk"
    rp, q, k, v, do, _, _ = replayed_backward(student, case)
    dq, dk, dv = unpack(rp.result, 3, what="flash_backward returns (dq, dk, dv)")
    inputs = case.shown(q, k, v, do=do)
    for name, t, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        # each gradient as flash_backward returns it (its input's shape, q's dtype) before any arithmetic on it
        check_tensor(t, what=f"{name} of flash_backward: the shape of {name[1:]}, in q's dtype", shape=like.shape,
                     dtype=q.dtype, inputs=inputs)
        check(not bool(torch.isnan(t).any()), what=f"no NaN in {name} when some rows can attend to no key (lse = -inf)",
              detail=f"{int(torch.isnan(t).sum())} NaN", hint=dg.HINT_BACKWARD_NAN, inputs=inputs)
    masked = dg.fully_masked_rows(case.nq, case.nk, True)
    check(bool((dq[..., masked, :] == 0).all()), what=f"dq = 0 in the fully masked rows 0..{masked[-1]}",
          detail=f"max |dq| there {dq[..., masked, :].abs().max().item():.3g}", hint=dg.HINT_BACKWARD_NAN,
          inputs=inputs)
    check_backward_structure(rp, case, inputs=inputs, sides=BACKWARD_SIDES)


def backward_flops_bounds(case: AttnCase) -> tuple[int, int]:
    """(fewest, most) matmul FLOPs of a correct tiled backward.

    Per computed score the backward does 5 matmuls of 2·d (§7.2), 10·d in all, over the scores a
    correct tiled attention computes (cases_part2.computed_scores_bounds: from the visible ones, the
    tightest legal causal skipping, to whole-block skipping on any grid of blocks); most also allows
    D_i = dO_i · O_i written as a matmul (einsum, a batched (1×d)·(d×1) product), 2·Nq·d per (batch,
    head). Non-causal, the two agree up to that D term."""
    batch = math.prod(case.lead)
    fewest, most = computed_scores_bounds(case)
    return 10 * batch * case.d * fewest, 10 * batch * case.d * most + 2 * batch * case.nq * case.d


def backward_flops_hint(actual: int, expected: int, full: int) -> str:
    if actual >= full and expected < full:
        return HINT_BWD_NO_SKIP
    return HINT_BWD_FEWER if actual < expected else HINT_BWD_MORE


def replayed_backward(student, case: AttnCase):
    """flash_backward(q, k, v, o, lse, dO) with the judge's o and lse, recorded and replayed by the judge.
    Returns (rp, q, k, v, do, o64, lse64): the judge's inputs and their float64 forward."""
    q, k, v = case.qkv()
    do = _do(case)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)

    def reference(q, k, v, o, lse, do, causal, scale, **_):
        return reference_grads(q, k, v, do, case)[0]

    # the twin: the same program on judge-drawn q, k, v, dO with THEIR o and lse
    tq, tk, tv, tdo = (replay.perturbed(t, case.seed * 10 + i) for i, t in enumerate((q, k, v, do)))
    to64, tlse64 = attention_reference(tq, tk, tv, case.causal, case.scale)
    twin = ((tq, tk, tv, to64.to(q.dtype), tlse64.to(q.dtype), tdo), case.kwargs())
    rp, _, _ = replay.call(student, "flash_backward.flash_backward", (q, k, v, o64.to(q.dtype), lse64.to(q.dtype), do),
                           case.kwargs(), reference=reference, twin_inputs=twin)
    return rp, q, k, v, do, o64, lse64


# flash_backward(q, k, v, o, lse, dO): what each input of its record derives from, for the key extents
BACKWARD_SIDES = {0: QUERY_SIDE, 1: KEY_SIDE, 2: VALUE_SIDE, 3: QUERY_SIDE, 4: QUERY_SIDE, 5: QUERY_SIDE}
FUNCTION_SIDES = {0: QUERY_SIDE, 1: KEY_SIDE, 2: VALUE_SIDE, 3: QUERY_SIDE}  # a Function's record: q, k, v, dO
# ... and what numbers its rows, for liveness.pair_keys: q, o, dO (dim -2) and lse (dim -1) by query, k and v by key
Q_, K_ = liveness.QUERY, liveness.KEY
BACKWARD_ROWS = {0: (Q_, -2), 1: (K_, -2), 2: (K_, -2), 3: (Q_, -2), 4: (Q_, -1), 5: (Q_, -2)}
# the Function's record (scenarios/part4.function): q, k, v, dO
FUNCTION_ROWS = {0: (Q_, -2), 1: (K_, -2), 2: (K_, -2), 3: (Q_, -2)}
HINT_BACKWARD_TILES = ("recompute S and P one B_r × B_c tile at a time in the backward (§7.2, §7.4): P, dP and dS of a "
                       "tile are used and dropped before the next one; tiles kept together, from the forward or "
                       "assembled in the backward, are the Nq × Nk matrix again")
HINT_BACKWARD_PANEL = ("recompute S, P, dP and dS one B_r × B_c tile at a time (§7.2, §7.4): loop over the K/V blocks "
                       "and, inside, the Q blocks, instead of one matmul of a row block against many keys at once")


def check_backward_structure(rp: replay.Replayed, case: AttnCase, *, inputs: dict, start: int = 0,
                             fn: str = "flash_backward", sides: dict[int, int] | None = None,
                             rows: dict[int, tuple[int, int]] = BACKWARD_ROWS) -> None:
    """The replayed backward: no fused op, input dtype, no Nq×Nk storage (where the shapes separate),
    every Q·Kᵀ-like matmul over at most B_c keys (with `sides`: a direct flash_backward record), matmul
    FLOPs of the live ops from op `start` on (the backward of a Function's record) within
    backward_flops_bounds, the live scores of a query row over at most B_c keys (`rows`: what numbers the
    rows of the record's inputs)."""
    trace = rp.as_trace()
    check_trace_common(trace, fn=fn, nq=case.nq, nk=case.nk, itemsize=case.torch_dtype.itemsize, inputs=inputs,
                       fused_hint="flash_backward must compute the tiles itself with torch matmuls, no fused "
                                  "attention kernel (§7.2)",
                       nxn_hint="recompute P one B_r × B_c tile at a time (§7.2): never build an Nq × Nk tensor",
                       upcasts=rp.upcasts, float32=case.dtype == "float32", storage=separates(case))
    if sides is not None:
        check_key_extents(rp, case, fn=fn, inputs=inputs, sides=sides, hint=HINT_BACKWARD_PANEL)
    check_no_hand_made_products(rp, fn, inputs, sides or FUNCTION_SIDES)
    if matmul_flops_defined(case):
        got = liveness.live_matmul_flops(rp, start)
        fewest, most = backward_flops_bounds(case)
        fwd = forward_flops(case)
        full = 5 * forward_flops(case, causal=False) // 2
        check(fewest <= got <= most,
              what=f"matmul FLOPs of {fn}: 2.5 × the forward's (§7.5), causal skipping (§6.2)",
              detail=f"counted {got:,}{dead_flops(rp, got, start)} = {got / max(fwd, 1):.3g} × the forward's "
                     f"{fwd:,}; a correct backward needs {fewest:,} to {most:,}",
              hint=backward_flops_hint(got, fewest if got < fewest else most, full), inputs=inputs)
    check_tiles_live(rp, case, fn=fn, inputs=inputs, rows=rows, hint=HINT_BACKWARD_TILES,
                     what=f"{fn} holds S, P, dP and dS one B_r × B_c tile at a time (§7.2): the live scores of "
                          f"a query row span at most B_c keys")


def check_backward_trace(student, case: AttnCase) -> None:
    """flash_backward replayed: no fused op, no Nq×Nk storage, matmul FLOPs 2.5× the forward's, right grads."""
    assert separates(case) and matmul_flops_defined(case), f"test bug: {case.id} cannot separate tiled from naive"
    rp, q, k, v, do, o64, lse64 = replayed_backward(student, case)
    check_backward_structure(rp, case, inputs=case.shown(q, k, v, do=do), sides=BACKWARD_SIDES)
    _check_grads(rp.result, q, k, v, o64, lse64, do, case, fn="the replayed flash_backward", hidden=True,
                 student=student)


def judge_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """The judge's own flash_forward for part 4 (what the worker's "judge::forward" op stands for)."""
    o, lse = attention_reference(q, k, v, causal, scale)
    return o.to(q.dtype), lse.to(q.dtype)


def replayed_function(student, case: AttnCase, *, via: str, do: torch.Tensor | None = None,
                      seed: int | None = 1):
    """FlashAttentionFunction (via="apply") or flash_attention forward + o.backward(dO), recorded as one
    program and replayed by the judge with its own forward. Returns (rp, q, k, v, do)."""
    q, k, v = case.qkv()
    do = _do(case) if do is None else do
    kw = dict(causal=case.causal, block_q=case.block_q, block_k=case.block_k, scale=case.scale, via=via)
    record = student.scenario("part4.function", q=q, k=k, v=v, do=do, **kw)
    fn = "FlashAttentionFunction.apply" if via == "apply" else "flash_attention"
    check(type(record) is not dict or "problem" not in record, what=f"{fn} returns a differentiable o",
          detail=str(record.get("problem"))[:200] if type(record) is dict else "", hint=HINT_FUNCTION,
          inputs=case.shown(q, k, v, do=do))

    def reference(q, k, v, do, **_):
        o, _lse = attention_reference(q, k, v, case.causal, case.scale)
        return {"o": o, **dict(zip(("dq", "dk", "dv"), reference_grads(q, k, v, do, case)[0]))}

    rp, _, _ = replay.replay_record(student, record, fn, (q, k, v, do), {}, seed=seed, reference=reference,
                                    trusted={"forward": judge_forward})
    forwards = rp.op_counts.get("judge::forward", 0)
    check(forwards == 1 and bool(rp.marks.get("backward")),
          what=f"{fn} runs the forward once, then its backward",
          detail=f"the forward ran {forwards} times", hint=HINT_FUNCTION, inputs=case.shown(q, k, v, do=do))
    result = rp.result
    check(type(result) is dict and all(type(result.get(n)) is torch.Tensor for n in ("o", "dq", "dk", "dv")),
          what=f"{fn}(...).backward(dO) gives o and the gradients of q, k and v",
          detail="some of q.grad, k.grad, v.grad are missing", hint=HINT_FUNCTION, inputs=case.shown(q, k, v, do=do))
    return rp, q, k, v, do


def check_function_backward(rp: replay.Replayed, case: AttnCase, inputs: dict) -> None:
    """The structure rules of flash_backward on the backward of a Function's record (every replay of the
    part is held to them, not only the direct flash_backward calls: a Function whose backward builds the
    Nq × Nk matrix computes right gradients too)."""
    check_backward_structure(rp, case, inputs=inputs, start=rp.marks["backward"][0], fn="the Function's backward",
                             rows=FUNCTION_ROWS)


def _other_arguments(q, k, v, case: AttnCase) -> dict[str, torch.Tensor]:
    """The forward's output had an argument not reached it (check_close's `others`): causal flipped, or
    the default scale for a given one."""
    out = {f"the output of attention with causal={not case.causal} instead: pass causal through to the "
           f"forward (flash_attention -> FlashAttentionFunction.apply -> flash_forward)":
           attention_reference(q, k, v, not case.causal, case.scale)[0]}
    if case.scale is not None:
        out["the output of attention with the default scale 1/√d instead: pass scale through to the forward"] = \
            attention_reference(q, k, v, case.causal, None)[0]
    return out


def check_function_grads(student, case: AttnCase, *, hidden: bool = False) -> None:
    """flash_attention(q, k, v, causal) forward and backward (o.backward(dO)) against float64 autograd."""
    assert case.block_q == case.block_k == 64 and case.scale is None, "test bug: flash_attention uses the defaults"
    rp, q, k, v, do = replayed_function(student, case, via="flash_attention")
    out = rp.result
    inputs = case.shown(q, k, v, do=do)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, _ = attention_plain(q, k, v, case.causal, case.scale)
    close_or_diagnose(out["o"], o64, what="o of flash_attention (forward through the autograd.Function)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR, diagnose=lambda bound: HINT_FUNCTION,
                      others=_other_arguments(q, k, v, case))
    _check_grads((out["dq"], out["dk"], out["dv"]), q, k, v, o64, lse64, do, case,
                 fn="flash_attention(...).backward(dO)", hidden=hidden, student=student, function=True)
    check_function_backward(rp, case, inputs)


def check_function_apply(student, case: AttnCase, *, hidden: bool = False) -> None:
    """FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, scale) forward and backward (replayed)
    against float64 autograd: every argument, the scale included, must reach the forward and the backward."""
    rp, q, k, v, do = replayed_function(student, case, via="apply")
    out = rp.result
    inputs = case.shown(q, k, v, do=do)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, _ = attention_plain(q, k, v, case.causal, case.scale)
    close_or_diagnose(out["o"], o64, what="o of FlashAttentionFunction.apply (with its scale argument)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR, diagnose=lambda bound: HINT_FUNCTION,
                      others=_other_arguments(q, k, v, case))
    _check_grads((out["dq"], out["dk"], out["dv"]), q, k, v, o64, lse64, do, case,
                 fn="FlashAttentionFunction.apply(..., scale).backward(dO)", hidden=hidden, student=student,
                 hint=HINT_FUNCTION_ARGS, function=True)
    check_function_backward(rp, case, inputs)


def check_function_saves(student, case: AttnCase) -> None:
    """FlashAttentionFunction keeps q, k, v, O and lse for its backward, nothing of size Nq × Nk per head,
    and its backward recomputes (matmul FLOPs of the backward within backward_flops_bounds).

    What it keeps is measured in the judge's replay: the tensors made during the forward that the
    recorded backward reads (ctx.save_for_backward, ctx attributes and closures alike)."""
    nxn = case.nq * case.nk
    legit = math.prod(case.lead) * max(case.nq, case.nk) * case.d
    assert 2 * legit <= nxn, f"test bug: {case.id} cannot tell saved q, k, v from a saved P"
    rp, q, k, v, do = replayed_function(student, case, via="apply")
    inputs = case.shown(q, k, v, do=do)
    lives = liveness.lives_of(rp)
    kept = [list(t.shape) for t in rp.kept_for_backward("backward")]
    big = [s for s in kept if math.prod(s) >= nxn]
    check(not big, what="FlashAttentionFunction keeps no tensor of Nq × Nk or more per head for backward",
          detail=f"the backward reads tensors of shapes {big[:4]} made in the forward; Nq × Nk = {nxn:,} elements",
          hint=HINT_SAVES_P, inputs=inputs)
    stored = liveness.kept_for_backward(rp, "backward", lives)
    held, allowed = sum(s.elements for s in stored), kept_bound(case)
    largest = sorted(stored, key=lambda s: -s.elements)
    check(held <= allowed,
          what="FlashAttentionFunction keeps for its backward no more than q, k, v, O and lse hold (§7.2: the "
               "backward recomputes S and P)",
          detail=f"the backward reads {len(stored)} storages made in the forward, {held:,} elements in all (the "
                 f"largest of shapes {[lives.shape(x) for x in largest[:4]]}); q, k, v, O and lse hold "
                 f"{allowed:,}", hint=HINT_SAVES_P, inputs=inputs)
    o_shape, lse_shape = [*case.lead, case.nq, case.d], [*case.lead, case.nq]
    # O and lse kept as they are, or as views of them (a Function that folds the leading dims once and
    # saves the folded (B, Nq, d) views is correct): a kept tensor of their shape, or on their storage
    on_storage = _storages(rp.kept_for_backward("backward"))
    o_ptr, lse_ptr = _forward_output_storages(rp)
    check((o_shape in kept or o_ptr in on_storage) and (lse_shape in kept or lse_ptr in on_storage),
          what="FlashAttentionFunction keeps O and lse for its backward (ctx.save_for_backward)",
          detail=f"the backward reads tensors of shapes {kept[:8]} made in the forward; O is {o_shape}, lse is "
                 f"{lse_shape}", hint=HINT_SAVES_O_LSE, inputs=inputs)
    check_function_backward(rp, case, inputs)


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    out = set()
    for t in tensors:
        try:
            out.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            pass
    return out


def _forward_output_storages(rp: replay.Replayed) -> tuple[int | None, int | None]:
    """The storages of O and lse of the (first) judge::forward op before the backward: what a Function
    that saves O and lse, or views of them, keeps."""
    at = rp.marks.get("backward", [len(rp.prepared)])[0]
    for op in rp.prepared[:at]:
        if op.info.name == "judge::forward":
            outs = [rp.env.get(leaf) for leaf in op.leaves if type(leaf) is int]
            ptrs = [next(iter(_storages([t])), None) if isinstance(t, torch.Tensor) else None for t in outs]
            return (ptrs + [None, None])[0], (ptrs + [None, None])[1]
    return None, None


def kept_bound(case: AttnCase) -> int:
    """Elements of q, k, v, O and lse: the most that a forward which saves them (or copies of them, in any
    dtype: elements are counted, not bytes) keeps for its backward. The call's own inputs q, k, v are not
    counted at all (they exist anyway), so this also leaves room for O and lse twice, or for scaled or
    float64 copies of q, k and v. P tiles kept for the backward hold an element per visible (query, key)
    pair: with Nq = Nk = N and dv = d, a causal head's N(N + 1)/2 against this bound's N(4d + 1), more as
    soon as N > 8d + 1, and whole tiles hold more (the SAVES cases: 10 of 16 tiles of 32 × 32 at N = 128,
    d = 16: 10,240 > 8,320 per head before O and lse; N = 150, d = 8 non-causal: 22,500 > 4,950)."""
    return math.prod(case.lead) * (case.nq * (case.d + case.d + 1) + case.nk * (case.d + case.d))


GRADCHECK_RTOL = 1e-8  # float64: a correct tiled backward is off by ~1e-15 relative; every catalogued bug by > 1e-2


def check_gradcheck(student, case: AttnCase) -> None:
    """A float64 gradient check of FlashAttentionFunction on a tiny input: the analytical gradients of the
    replayed backward (for a random upstream gradient, i.e. all directional derivatives at once) against
    the exact derivative of the forward that ran (the judge's own float64 attention)."""
    assert case.dtype == "float64" and case.nq * case.nk <= 200, "test bug: the gradient check wants tiny float64 inputs"
    rp, q, k, v, do = replayed_function(student, case, via="apply")
    expected = reference_grads(q, k, v, do, case)[0]
    errs = []
    for name, exp in zip(("dq", "dk", "dv"), expected):
        got = rp.result[name]
        ok = got.shape == exp.shape and got.dtype == torch.float64 and bool(torch.isfinite(got).all())
        errs.append((got.double() - exp).abs().max().item() / (exp.abs().max().item() + 1) if ok else math.inf)
    worst = max(errs)
    check(worst <= GRADCHECK_RTOL,
          what="gradient check of FlashAttentionFunction (float64: analytical vs exact derivative)",
          detail=f"largest relative gradient error {worst:.3g} (dq {errs[0]:.3g}, dk {errs[1]:.3g}, dv {errs[2]:.3g}); "
                 f"allowed {GRADCHECK_RTOL:g}",
          hint=dg.HINT_BACKWARD, inputs=case.shown(q, k, v))
    check_function_backward(rp, case, case.shown(q, k, v, do=do))
