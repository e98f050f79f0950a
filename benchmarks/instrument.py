"""Wrap the engine's functions for a benchmark, in place and for one block only.

bench_judge_cost times the judge's stages and bench_grade_cost counts requests and replayed ops; both
replace a few functions of the engine by wrappers while one grade runs, and must put the originals
back even when the grade raises.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]


@contextmanager
def wrapped(targets: Iterable[tuple[Any, str, Wrapper]]) -> Iterator[None]:
    """While the block runs, owner.name is wrap(the original) for every (owner, name, wrap) of targets
    (a module or a class and an attribute name); the originals are restored after it, whatever happens."""
    saved = []
    try:
        for owner, name, wrap in targets:
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, wrap(original))
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
