"""The grading engine: tests run in a judge process and reach student code only through a proxy
that runs it in a worker process and moves plain data over pipes (see autograder/README.md).

    from autograder.engine import grade, StudentError, CheckFailure, check_close, check

Attributes are imported lazily so that the worker, which imports autograder.engine.worker from a
private copy, never loads the judge side.
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {
    "grade": "runner", "GradingPlugin": "runner", "student_view": "runner", "grade_for_student": "runner",
    "StudentError": "errors", "Limits": "limits", "StudentProxy": "judge",
    "CheckFailure": "checks", "check_close": "checks", "check": "checks", "unpack": "checks",
    "judge_settings": "checks", "FLOAT64_ATOL": "checks",
    "load_rubric": "rubric", "Rubric": "rubric", "RubricError": "rubric",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autograder.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
