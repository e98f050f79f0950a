"""Part 4 scenarios (run in the worker): flash_backward traced, the autograd.Function's saved tensors
and FLOPs, its gradients through flash_attention, and torch.autograd.gradcheck on tiny float64 shapes.

The Function's forward calls the student's part-2 flash_forward (`from .flash_forward import
flash_forward` in flash_backward.py, or `from . import flash_forward as f` and f.flash_forward).
So that part 4 is graded independently of part 2, these scenarios replace it, for the duration of
the scenario only, by a correct forward (float64 reference math, cast to the input dtype): in the
student's flash_backward module and on the student's flash_forward module object.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from course.reference import attention_reference

from .tracing import saved_tensor_shapes, trace, trace_call


def correct_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """flash_forward's contract with trusted math: (o, lse) in q's dtype."""
    o, lse = attention_reference(q.detach(), k.detach(), v.detach(), causal, scale)
    return o.to(q.dtype), lse.to(q.dtype)


@contextmanager
def _correct_forward(student) -> Iterator[None]:
    """Swap in correct_forward for the student's flash_forward, whatever the import style:
    `from .flash_forward import flash_forward [as name]` (every global of flash_backward bound to
    the student's function) and `from . import flash_forward as f` / `f.flash_forward(...)` (the
    attribute of the student's flash_forward module object in sys.modules). Restored on exit."""
    module = student.module("flash_backward")
    package = module.__name__.rpartition(".")[0]
    fwd_module = sys.modules.get(f"{package}.flash_forward")
    original = getattr(fwd_module, "flash_forward", None) if fwd_module is not None else None
    missing = object()
    undo: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str) -> None:
        undo.append((obj, name, obj.__dict__.get(name, missing)))
        setattr(obj, name, correct_forward)

    patch(module, "flash_forward")
    for name, value in list(module.__dict__.items()):
        if name != "flash_forward" and original is not None and value is original:
            patch(module, name)
    if fwd_module is not None and original is not None:
        patch(fwd_module, "flash_forward")
    try:
        yield
    finally:
        for obj, name, before in reversed(undo):
            if before is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, before)


def trace_backward(student, q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None) -> dict[str, Any]:
    """flash_backward(q, k, v, o, lse, do, ...) traced: {"result", "trace"}."""
    fn = student.function("flash_backward.flash_backward")
    result, tr = trace_call(fn, q, k, v, o, lse, do, causal=causal, block_q=block_q, block_k=block_k, scale=scale)
    return {"result": result, "trace": tr}


def _leaves(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(True) for t in ts]


def _not_in_graph(o: Any, what: str) -> str | None:
    if not isinstance(o, torch.Tensor):
        return f"{what} returned {type(o).__name__}, expected a torch.Tensor o"
    if o.grad_fn is None:
        return f"{what} returned a tensor that is not connected to q, k, v in the autograd graph"
    return None


def function_grads(student, q, k, v, do, causal=False) -> dict[str, Any]:
    """o = flash_attention(q, k, v, causal); o.backward(do): {"o", "dq", "dk", "dv"} or {"problem"}."""
    q, k, v = _leaves(q, k, v)
    with _correct_forward(student):
        o = student.function("flash_backward.flash_attention")(q, k, v, causal=causal)
    problem = _not_in_graph(o, "flash_attention")
    if problem:
        return {"problem": problem}
    o.backward(do)
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def function_apply_grads(student, q, k, v, do, causal=False, block_q=64, block_k=64, scale=None) -> dict[str, Any]:
    """o = FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, scale); o.backward(do):
    {"o", "dq", "dk", "dv"} or {"problem"}. Every argument reaches the Function, the scale included."""
    q, k, v = _leaves(q, k, v)
    fn = student.function("flash_backward.FlashAttentionFunction")
    with _correct_forward(student):
        o = fn.apply(q, k, v, causal, block_q, block_k, scale)
    problem = _not_in_graph(o, "FlashAttentionFunction.apply")
    if problem:
        return {"problem": problem}
    o.backward(do)
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def function_saved(student, q, k, v, do, causal=False, block_q=64, block_k=64) -> dict[str, Any]:
    """FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, None), then .backward(do).

    Returns the shapes of every tensor saved for backward (saved_tensors_hooks sees save_for_backward),
    the shapes of tensors stashed as attributes of ctx, and the traces of the forward and the backward."""
    q, k, v = _leaves(q, k, v)
    fn = student.function("flash_backward.FlashAttentionFunction")
    with _correct_forward(student):
        (o, fwd), saved = saved_tensor_shapes(trace_call, fn.apply, q, k, v, causal, block_q, block_k, None)
    problem = _not_in_graph(o, "FlashAttentionFunction.apply")
    if problem:
        return {"problem": problem}
    on_ctx: list[list[int]] = []
    for value in vars(o.grad_fn).values():  # the ctx of a custom Function is its grad_fn node
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor):
                on_ctx.append(list(t.shape))
    _, bwd = trace(o.backward, (do,), exclude=(q, k, v, o))
    return {"o": o.detach(), "saved_shapes": saved, "ctx_tensor_shapes": on_ctx, "forward": fwd, "backward": bwd,
            "dq": q.grad, "dk": k.grad, "dv": v.grad}


def gradcheck(student, q, k, v, causal=False, block_q=4, block_k=4, seed=0) -> dict[str, Any]:
    """torch.autograd.gradcheck of FlashAttentionFunction on tiny float64 inputs.

    Returns {"ok": gradcheck's verdict, "max_err": the largest |numerical - analytical| directional
    derivative over 4 random directions (central differences, eps 1e-6)}."""
    fn = student.function("flash_backward.FlashAttentionFunction")
    inputs = tuple(_leaves(q.double(), k.double(), v.double()))

    def f(q, k, v):
        return fn.apply(q, k, v, causal, block_q, block_k, None)

    with _correct_forward(student):
        ok = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=False)
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(f(*inputs).shape, generator=g, dtype=torch.float64)
        grads = torch.autograd.grad((f(*inputs) * w).sum(), inputs)
        max_err, eps = 0.0, 1e-6
        with torch.no_grad():
            for _ in range(4):
                dirs = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in inputs]
                plus = (f(*[t + eps * u for t, u in zip(inputs, dirs)]) * w).sum()
                minus = (f(*[t - eps * u for t, u in zip(inputs, dirs)]) * w).sum()
                numerical = (plus - minus).item() / (2 * eps)
                analytical = sum((gr * u).sum().item() for gr, u in zip(grads, dirs))
                max_err = max(max_err, abs(numerical - analytical))
    return {"ok": bool(ok), "max_err": float(max_err)}
