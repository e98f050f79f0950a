"""Threads a worker makes at its start, before it refuses new ones (engine/confine.refuse_threads).

A worker computes on one torch thread and may start no thread once student code can run: starting
threads moves machine-wide counters (the next PID, the kernel's count of forks) that a later worker
could read, a channel out of a hidden test. A scenario that must run student code beside its own
(part1's counted softmaxes, suspended while the judge delivers values) takes one of these spares.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

_jobs: "queue.SimpleQueue[Callable[[], None]] | None" = None
_idle = 0
_lock = threading.Lock()


def start(n: int) -> None:
    """Start n spare threads (the worker, before refusing new threads)."""
    global _jobs, _idle
    _jobs = jobs = queue.SimpleQueue()
    for _ in range(n):
        threading.Thread(target=_serve, args=(jobs,), daemon=True).start()
    with _lock:
        _idle += n


def _serve(jobs: "queue.SimpleQueue[Callable[[], None]]") -> None:
    global _idle
    while True:
        job = jobs.get()
        try:
            job()
        except BaseException:  # noqa: BLE001 -- a job reports its own errors
            pass
        with _lock:
            _idle += 1


def run(job: Callable[[], None]) -> None:
    """Run job() in a spare thread (a new one outside a worker: the scenarios' own tests). A job that
    never returns keeps its thread: with none left, this raises, as starting a thread would."""
    global _idle
    if _jobs is None:
        threading.Thread(target=job, daemon=True).start()
        return
    with _lock:
        if not _idle:
            raise RuntimeError("can't start new thread: every spare thread of the worker is busy")
        _idle -= 1
    _jobs.put(job)
