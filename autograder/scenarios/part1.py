"""Part 1 scenarios (run in the worker): the *_counted softmaxes on a course.counting.ReadCounter.

The counter has to live next to the student's code; the judge gets back plain numbers (the
student's result, the reads counted, the length) and recomputes every expected value itself.
"""
from __future__ import annotations

from typing import Any

from course.counting import ReadCounter

COUNTED = {"naive": "naive_softmax_counted", "safe": "safe_softmax_counted", "online": "online_softmax_counted"}


def counted(student, values: list[float], which: str) -> dict[str, Any]:
    """Run <which>_softmax_counted on ReadCounter(values): {"result", "reads", "n"}."""
    fn = student.function(f"online_softmax.{COUNTED[which]}")
    counter = ReadCounter(values)
    result = fn(counter)
    return {"result": result, "reads": counter.reads, "n": len(counter)}
