"""Part 4 (flash_backward, FlashAttentionFunction, flash_attention): checks shared by public and hidden tests.

Part 4 is graded independently of part 2:
- flash_backward receives the judge's o and lse (float64 reference, cast to the input dtype);
- FlashAttentionFunction / flash_attention run in the worker with a correct forward in place of the
  student's flash_forward (scenarios/part4.py), so a part-2 bug costs points only in part 2.

(a) references: dq, dk, dv against torch autograd through course.reference.attention_reference
    (float64); the plain float32 autograd gradients set the tolerance (3× rule); gradcheck of the
    student's FlashAttentionFunction on tiny float64 shapes, in the worker.
    Gradients are tested on unit-scale inputs only: with peaked scores P = exp(S - L) amplifies the
    float32 rounding of S and of the given L beyond what the plain softmax (which renormalises) shows;
    the reference solution measured 3.1-4.5× the plain error at scores ×5 to ×20, 0.7-1.3× at ×1.
(b) conventions: fully masked rows (causal, Nq > Nk) have zero gradients, nothing is NaN;
    bottom-right alignment with Nq != Nk both ways.
(c) counters: backward matmul FLOPs exactly 2.5× the forward's (5 tile matmuls against 2, §7.5),
    no fused op, no Nq×Nk storage; the Function saves q, k, v, O and lse and no Nq×Nk tensor.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from autograder.engine import tolerances as tol
from autograder.engine.checks import check, unpack
from course.reference import attention_plain, attention_reference

from . import diagnose as dg
from .cases_part2 import AttnCase, check_trace_common, close_or_diagnose, forward_flops

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
    out = []
    for fn, dtype in ((attention_reference, torch.float64), (attention_plain, q.dtype)):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        o, _ = fn(*leaves, case.causal, case.scale)
        out.append(list(torch.autograd.grad(o, leaves, do.to(dtype))))
    return out[0], out[1]


def _check_grads(grads: Any, q, k, v, o64, lse64, do, case: AttnCase, *, fn: str, hidden: bool,
                 student: Any = None, hint: str | None = None) -> None:
    """dq, dk, dv against float64 autograd (3× rule). The hint: the backward probes and recognisers, and `hint`
    first when the gradients come through the Function (whose flash_backward the probes check on its own)."""
    dq, dk, dv = unpack(grads, 3, what=f"{fn} returns (dq, dk, dv)")
    expected, plain = reference_grads(q, k, v, do, case)
    inputs = case.shown(q, k, v, do=do)
    diag = dict(causal=case.causal, block_q=case.block_q, block_k=case.block_k, scale=case.scale, where=not hidden,
                student=student)
    for name, actual, exp, pl in zip(("dq", "dk", "dv"), (dq, dk, dv), expected, plain):
        close_or_diagnose(
            actual, exp, what=f"{name} of {fn} against torch autograd of float64 attention", inputs=inputs,
            plain=pl, factor=tol.GRADIENT_FACTOR,
            diagnose=lambda bound, a=actual, n=name: dg._compose(
                hint, dg.diagnose_backward(a, n, q, k, v, o64, lse64, do, tol=bound, **diag)))


def check_backward_values(student, case: AttnCase, *, hidden: bool = False) -> None:
    """flash_backward(q, k, v, o, lse, dO) with the judge's o and lse -> dq, dk, dv against autograd (3× rule)."""
    q, k, v = case.qkv()
    do = _do(case)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    o, lse = o64.to(q.dtype), lse64.to(q.dtype)
    grads = student.call("flash_backward.flash_backward", q, k, v, o, lse, do, **case.kwargs())
    _check_grads(grads, q, k, v, o64, lse64, do, case, fn="flash_backward", hidden=hidden, student=student)


def check_masked_rows_grads(student, case: AttnCase) -> None:
    """Causal with Nq > Nk: no NaN in any gradient, and dq = 0 in the rows that attend no key."""
    assert case.causal and case.nq > case.nk, "test bug: needs causal with Nq > Nk"
    q, k, v = case.qkv()
    do = _do(case)
    o64, lse64 = attention_reference(q, k, v, True, case.scale)
    grads = student.call("flash_backward.flash_backward", q, k, v, o64.to(q.dtype), lse64.to(q.dtype), do,
                         **case.kwargs())
    dq, dk, dv = unpack(grads, 3, what="flash_backward returns (dq, dk, dv)")
    inputs = case.shown(q, k, v, do=do)
    for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        check(type(t) is torch.Tensor, what=f"{name} is a tensor", detail=f"got {type(t).__name__}", inputs=inputs)
        check(not bool(torch.isnan(t).any()), what=f"no NaN in {name} when some rows can attend to no key (lse = -inf)",
              detail=f"{int(torch.isnan(t).sum())} NaN", hint=dg.HINT_BACKWARD_NAN, inputs=inputs)
    masked = dg.fully_masked_rows(case.nq, case.nk, True)
    check(tuple(dq.shape) == tuple(q.shape), what="dq has q's shape", detail=f"got {tuple(dq.shape)}", inputs=inputs)
    check(bool((dq[..., masked, :] == 0).all()), what=f"dq = 0 in the fully masked rows 0..{masked[-1]}",
          detail=f"max |dq| there {dq[..., masked, :].abs().max().item():.3g}", hint=dg.HINT_BACKWARD_NAN,
          inputs=inputs)


def backward_flops_ok(actual: int, case: AttnCase) -> tuple[bool, int]:
    """(actual is 2.5 × the forward's matmul FLOPs, that expected count).

    D_i = dO_i · O_i written as a matmul (einsum, or a batched (1×d)·(d×1) product) adds 2·Nq·d per
    (batch, head) to the tile matmuls; it is the same computation as rowsum(dO ∘ O), so it is allowed."""
    expected = 5 * forward_flops(case) // 2
    d_as_matmul = 2 * math.prod(case.lead) * case.nq * case.d
    return actual in (expected, expected + d_as_matmul), expected


def backward_flops_hint(actual: int, expected: int, full: int) -> str:
    if actual == full and expected < full:
        return HINT_BWD_NO_SKIP
    return HINT_BWD_FEWER if actual < expected else HINT_BWD_MORE


def check_backward_trace(student, case: AttnCase) -> None:
    """flash_backward traced: no fused op, no Nq×Nk storage, matmul FLOPs exactly 2.5× the forward's."""
    q, k, v = case.qkv()
    do = _do(case)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    itemsize = q.element_size()
    legit = itemsize * math.prod(case.lead) * max(case.nq * case.d, case.nk * case.d, case.block_q * case.block_k)
    assert 2 * legit <= case.nq * case.nk * itemsize, f"test bug: {case.id} cannot separate tiled from naive"
    out = student.scenario("part4.trace_backward", q=q, k=k, v=v, o=o64.to(q.dtype), lse=lse64.to(q.dtype), do=do,
                           **case.kwargs())
    trace, inputs = out["trace"], case.shown(q, k, v, do=do)
    check_trace_common(trace, fn="flash_backward", nq=case.nq, nk=case.nk, itemsize=itemsize, inputs=inputs,
                       fused_hint="flash_backward must compute the tiles itself with torch matmuls, no fused "
                                  "attention kernel (§7.2)",
                       nxn_hint="recompute P one B_r × B_c tile at a time (§7.2): never build an Nq × Nk tensor")
    fwd = forward_flops(case)
    ok, expected = backward_flops_ok(trace["matmul_flops"], case)
    full = 5 * forward_flops(case, causal=False) // 2
    check(ok, what="matmul FLOPs of flash_backward = 2.5 × the forward's (§7.5)",
          detail=f"counted {trace['matmul_flops']:,} = {trace['matmul_flops'] / fwd:.3g} × the forward's {fwd:,}; "
                 f"expected {expected:,}",
          hint=backward_flops_hint(trace["matmul_flops"], expected, full), inputs=inputs)
    _check_grads(out["result"], q, k, v, o64, lse64, do, case, fn="the traced flash_backward", hidden=True,
                 student=student)


def check_function_grads(student, case: AttnCase, *, hidden: bool = False) -> None:
    """flash_attention(q, k, v, causal) forward and backward (o.backward(dO)) against float64 autograd."""
    assert case.block_q == case.block_k == 64 and case.scale is None, "test bug: flash_attention uses the defaults"
    q, k, v = case.qkv()
    do = _do(case)
    out = student.scenario("part4.function_grads", q=q, k=k, v=v, do=do, causal=case.causal)
    inputs = case.shown(q, k, v, do=do)
    check("problem" not in out, what="flash_attention returns a differentiable o", detail=str(out.get("problem")),
          hint="return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)", inputs=inputs)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, _ = attention_plain(q, k, v, case.causal, case.scale)
    close_or_diagnose(out["o"], o64, what="o of flash_attention (forward through the autograd.Function)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR, diagnose=lambda bound: HINT_FUNCTION)
    _check_grads((out["dq"], out["dk"], out["dv"]), q, k, v, o64, lse64, do, case,
                 fn="flash_attention(...).backward(dO)", hidden=hidden, student=student)


def check_function_apply(student, case: AttnCase, *, hidden: bool = False) -> None:
    """FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, scale) forward and backward against float64
    autograd: every argument, the scale included, must reach the forward and the backward."""
    q, k, v = case.qkv()
    do = _do(case)
    out = student.scenario("part4.function_apply_grads", q=q, k=k, v=v, do=do, causal=case.causal,
                           block_q=case.block_q, block_k=case.block_k, scale=case.scale)
    inputs = case.shown(q, k, v, do=do)
    check("problem" not in out, what="FlashAttentionFunction.apply returns a differentiable o",
          detail=str(out.get("problem")), hint=HINT_FUNCTION, inputs=inputs)
    o64, lse64 = attention_reference(q, k, v, case.causal, case.scale)
    plain_o, _ = attention_plain(q, k, v, case.causal, case.scale)
    close_or_diagnose(out["o"], o64, what="o of FlashAttentionFunction.apply (with its scale argument)",
                      inputs=inputs, plain=plain_o, factor=tol.FORWARD_FACTOR, diagnose=lambda bound: HINT_FUNCTION)
    _check_grads((out["dq"], out["dk"], out["dv"]), q, k, v, o64, lse64, do, case,
                 fn="FlashAttentionFunction.apply(..., scale).backward(dO)", hidden=hidden, student=student,
                 hint=HINT_FUNCTION_ARGS)


def check_function_saves(student, case: AttnCase) -> None:
    """FlashAttentionFunction saves q, k, v, O and lse, nothing of size Nq × Nk per head, and its backward
    recomputes (2.5× the forward's matmul FLOPs)."""
    q, k, v = case.qkv()
    do = _do(case)
    nxn = case.nq * case.nk
    legit = math.prod(case.lead) * max(case.nq, case.nk) * case.d
    assert 2 * legit <= nxn, f"test bug: {case.id} cannot tell saved q, k, v from a saved P"
    out = student.scenario("part4.function_saved", q=q, k=k, v=v, do=do, causal=case.causal,
                           block_q=case.block_q, block_k=case.block_k)
    inputs = case.shown(q, k, v, do=do)
    check("problem" not in out, what="FlashAttentionFunction.apply returns a differentiable o",
          detail=str(out.get("problem")), hint=HINT_FUNCTION, inputs=inputs)
    saved, on_ctx = out["saved_shapes"], out["ctx_tensor_shapes"]
    big = [s for s in saved + on_ctx if math.prod(s) >= nxn]
    check(not big, what="FlashAttentionFunction keeps no tensor of Nq × Nk or more per head for backward",
          detail=f"saved {saved}" + (f", on ctx {on_ctx}" if on_ctx else "") + f"; Nq × Nk = {nxn:,} elements",
          hint=HINT_SAVES_P, inputs=inputs)
    o_shape, lse_shape = [*case.lead, case.nq, case.d], [*case.lead, case.nq]
    check(o_shape in saved and lse_shape in saved,
          what="FlashAttentionFunction saves O and lse with ctx.save_for_backward",
          detail=f"saved shapes {saved}; O is {o_shape}, lse is {lse_shape}", hint=HINT_SAVES_O_LSE, inputs=inputs)
    fwd = forward_flops(case)
    got = out["backward"]["matmul_flops"]
    ok, expected = backward_flops_ok(got, case)
    check(ok,
          what="the Function's backward does 2.5 × the forward's matmul FLOPs (recomputation, §7.5)",
          detail=f"counted {got:,} = {got / fwd:.3g} × the forward's {fwd:,}",
          hint=HINT_SAVES_P if got < expected else HINT_BWD_MORE, inputs=inputs)


def check_gradcheck(student, case: AttnCase) -> None:
    """torch.autograd.gradcheck of FlashAttentionFunction on a tiny float64 input (in the worker)."""
    assert case.dtype == "float64" and case.nq * case.nk <= 200, "test bug: gradcheck wants tiny float64 inputs"
    q, k, v = case.qkv()
    out = student.with_timeout(60).scenario("part4.gradcheck", q=q, k=k, v=v, causal=case.causal,
                                            block_q=case.block_q, block_k=case.block_k)
    # Central differences with eps = 1e-6 on O(1) float64 values are accurate to ~1e-9; the solution
    # measures ≤ 1e-9, and every gradient bug of the catalogue is off by more than 1e-2.
    check(out["ok"] is True and out["max_err"] <= tol.GRADCHECK_MAX_ERR,
          what="torch.autograd.gradcheck of FlashAttentionFunction (float64, numerical vs analytical Jacobian)",
          detail=f"gradcheck {'passed' if out['ok'] else 'failed'}; largest directional-derivative error "
                 f"{out['max_err']:.3g} (allowed 1e-6)",
          hint=dg.HINT_BACKWARD, inputs=case.shown(q, k, v))
