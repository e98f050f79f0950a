"""Part 2 scenarios (run in the worker): flash_forward under the dispatch tracer."""
from __future__ import annotations

from typing import Any

from .tracing import trace_call


def trace_forward(student, q, k, v, causal=False, block_q=64, block_k=64, scale=None) -> dict[str, Any]:
    """flash_forward(q, k, v, ...) traced: {"result": its return value, "trace": tracing.trace_call's dict}."""
    fn = student.function("flash_forward.flash_forward")
    result, trace = trace_call(fn, q, k, v, causal=causal, block_q=block_q, block_k=block_k, scale=scale)
    return {"result": result, "trace": trace}
