"""Part 3 scenario (runs in the worker): the student's kernel on the simulated GPU, RECORDED.

Nothing measured here is trusted. course.gpusim.record() notes, as plain data, every GPU, buffer
and launch made during the call, each kernel's memory instructions and the numpy arithmetic on the
values they load. The judge (autograder/tests/cases_part3.py) replays that program on its own
simulated GPU with its own inputs and measures the counters and o, lse there. What the student's
function returns (o, lse, stats) is not used, beyond checking that it is a triple.
"""
from __future__ import annotations

from typing import Any

from course import gpusim


def flash_kernel(student, q, k, v, causal=False, block_rows=64, block_cols=64) -> dict[str, Any]:
    """run_flash_kernel(q, k, v, ...) recorded -> {"returns_triple": bool, "program": plain data}."""
    fn = student.function("flash_kernel.run_flash_kernel")
    with gpusim.record(counting=False) as rec:  # the judge counts in its replay: nothing to count here
        result = fn(q, k, v, causal=causal, block_rows=block_rows, block_cols=block_cols)
    return {"returns_triple": isinstance(result, (tuple, list)) and len(result) == 3, "program": rec.program()}
