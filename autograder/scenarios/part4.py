"""Part 4 scenario (runs in the worker): FlashAttentionFunction / flash_attention, forward and
backward, recorded as ONE program for the judge to replay (autograder/engine/replay.py).

The Function's forward calls the student's part-2 flash_forward (`from .flash_forward import
flash_forward` in flash_backward.py, or `from . import flash_forward as f` and f.flash_forward).
So that part 4 is graded independently of part 2, this scenario replaces it, whatever the import
style and only for the duration of the call, by a correct forward that the recorder writes down as ONE op,
"judge::forward": the judge computes it itself (float64 reference math, cast to the input dtype).
flash_backward alone is recorded with tracing.call.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from course.reference import attention_reference

from .tracing import Recorder


def correct_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """flash_forward's contract with trusted math: (o, lse) in q's dtype."""
    o, lse = attention_reference(q.detach(), k.detach(), v.detach(), causal, scale)
    return o.to(q.dtype), lse.to(q.dtype)


@contextmanager
def _forward_replaced(student, forward) -> Iterator[None]:
    """Swap in `forward` for the student's flash_forward, whatever the import style:
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
        setattr(obj, name, forward)

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


def function(student, q, k, v, do, causal=False, block_q=64, block_k=64, scale=None,
             via: str = "apply") -> dict[str, Any]:
    """o = FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k, scale) (via="apply") or
    flash_attention(q, k, v, causal=causal) (via="flash_attention"), then o.backward(do), recorded.

    Returns the record (result {"o", "dq", "dk", "dv"}, mark "backward" where o.backward starts), or
    {"problem": why} when o is not a tensor connected to q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    rec = Recorder()
    rec.inputs(q, k, v, do)
    with _forward_replaced(student, rec.trusted("forward", correct_forward)):
        with rec:
            if via == "apply":
                o = student.function("flash_backward.FlashAttentionFunction").apply(q, k, v, causal, block_q,
                                                                                    block_k, scale)
            else:
                o = student.function("flash_backward.flash_attention")(q, k, v, causal=causal)
            if not isinstance(o, torch.Tensor) or o.grad_fn is None:
                return {"problem": "it returned a tensor that is not connected to q, k, v in the autograd graph"
                        if isinstance(o, torch.Tensor) else "it did not return a torch.Tensor"}
            rec.mark("backward")
            o.backward(do)
    return rec.record({"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad})
