"""Part 3 scenario (runs in the worker): the student's kernel on the simulated GPU.

The counters the judge checks are taken from the simulator itself (course.gpusim.capture
records every launch made during the call), not from the stats dict the student returns.
"""
from __future__ import annotations

from typing import Any

import torch

from course import gpusim


def flash_kernel(student, q, k, v, causal=False, block_rows=64, block_cols=64) -> dict[str, Any]:
    """run_flash_kernel(q, k, v, ...) -> {"o", "lse" (tensors or None), "result_type", "stats"}.

    stats: the captured launches merged (gpusim.merge_stats) without the per-line breakdown:
    totals, per-buffer counters and race reports, all plain data."""
    fn = student.function("flash_kernel.run_flash_kernel")
    with gpusim.capture() as launches:
        result = fn(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols)
    ok = isinstance(result, (tuple, list)) and len(result) == 3
    o, lse = (result[0], result[1]) if ok else (None, None)
    stats = gpusim.merge_stats(launches)
    stats.pop("lines", None)
    return {
        "result_type": type(result).__name__ + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""),
        "o": o if isinstance(o, torch.Tensor) else None,
        "o_type": type(o).__name__,
        "lse": lse if isinstance(lse, torch.Tensor) else None,
        "lse_type": type(lse).__name__,
        "stats": stats,
    }
