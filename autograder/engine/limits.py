"""Limits: per-call and per-worker limits of the engine (rubric [limits], per part, or grade(limits=))."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Limits:
    """Per-call and per-worker limits. All can be set per part in the rubric."""

    call_timeout_s: float = 20.0  # wall time of one call, then the worker is killed and replaced
    startup_timeout_s: float = 120.0  # worker start (imports torch); generous on a loaded machine
    memory_mb: int = 4096  # RLIMIT_AS of the worker (torch itself maps ~0.7 GB)
    cpu_s: int = 600  # RLIMIT_CPU of the worker, a backstop behind the wall-clock limit
    file_size_mb: int = 64  # RLIMIT_FSIZE: the largest file the worker may write
    output_cap_bytes: int = 4 << 20  # more output than this in one call kills the call
    output_keep_bytes: int = 10_000  # output kept per test for the feedback
    max_losses: int = 3  # after this many timeouts/crashes/out-of-memory calls in one part, the rest are not run
    threads: int = 1  # torch threads in the worker: deterministic, and fair in parallel batch grading
    fork_server: bool = True  # fork workers from a pre-imported zygote (zygote.py), sandboxed ones too where the sandbox allows
    reply_cap_mb: int = 256  # a reply larger than this (plain data + tensor bytes) costs the call, unread
    # the judge's own resident memory (memory.py): a reply or a replay that leaves it holding more
    # costs the call, so that what a submission sends can never exhaust the grading machine
    judge_memory_mb: int = 3072
    # a worker serves one part only (then a fresh one is forked): whatever one part's files do to the
    # interpreter (torch.set_default_dtype at import, a patched function) never reaches another part,
    # so a part's result depends on the files it reaches alone (what runner.grade's reuse relies on)
    worker_per_part: bool = True
    # wall time of the whole grade (0: none): calls after it are not run, and no call may run past it,
    # so that a channel with a hard limit of its own (Gradescope's) always gets the engine's report
    grade_budget_s: float = 0.0
    # {call target: seconds}: a call's time limit is at most this (the batch measures the reference's
    # own time for each call and scales it, see instructor/batch.py scaled_call_timeouts)
    call_timeouts: dict = field(default_factory=dict)
    # {part number as a string: seconds}: the most wall time one part's tests and diagnoses may take in
    # one grade, its calls and the judge's checks of them together; calls after it are not run (the
    # batch scales it from the reference's own time for the part, see instructor/batch.py part_budgets)
    part_budgets: dict = field(default_factory=dict)

    def updated(self, **overrides: Any) -> "Limits":
        known = {k: v for k, v in overrides.items() if k in self.__dataclass_fields__}
        return Limits(**{**self.__dict__, **known})



# The limits a batch measures on its machine (from the reference's own times), not set by a person: left
# out of the checks of a person's overrides, of a shard's fingerprint and of a transcript's settings.
CALIBRATED = ("call_timeouts", "part_budgets")


# the smallest value that makes sense for a numeric limit (0 where "none" is meaningful)
# (judge_memory_mb: the judge itself holds 0.3-0.6 GB while it grades the reference, `make bench
# BENCH=grade_cost`; under 1 GB every call of a correct submission would cost it its points)
MINIMUM: dict[str, float] = {"output_keep_bytes": 0, "grade_budget_s": 0, "judge_memory_mb": 1024}


def check_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Limit overrides given by a person (the batch's --limit): the same keys with values of the
    field's type, or ValueError saying what is wrong. `updated` drops unknown keys (the rubric may
    be newer than the engine); a person's typo must not silently grade with the default instead."""
    by_name = {f.name: f for f in fields(Limits) if f.name not in CALIBRATED}
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        f = by_name.get(key)
        if f is None:
            raise ValueError(f"unknown limit {key!r}; the limits are {', '.join(sorted(by_name))}")
        kind = type(getattr(Limits(), key))
        if kind is bool:
            if value not in (0, 1, True, False):
                raise ValueError(f"limit {key} is on or off: give 1 or 0, not {value!r}")
            out[key] = bool(value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"limit {key} needs a finite number, not {value!r}")
        if kind is int and value != int(value):
            raise ValueError(f"limit {key} needs a whole number, not {value!r}")
        low = MINIMUM.get(key)
        if (low is None and value <= 0) or (low is not None and value < low):
            need = "positive" if low is None else f"at least {low:g}"
            raise ValueError(f"limit {key} must be {need}, not {value!r}")
        out[key] = int(value) if kind is int else float(value)
    return out
