"""Where one part's grade spends its time and memory, for any submission: the judge's stages, timed.

    python -m benchmarks.bench_judge_cost [--impl DIR] [--part N] [--sets public,hidden]

Grades DIR (default solutions/) on one part in this process, as one judge of a batch would (public and
hidden tests, workers forked from the judge's fork server, no sandbox), after a warm-up grade of
solutions/ on the same part (imports, the fork server, first-use caches). Each stage's time is its own
(exclusive: a stage called inside another counts only in the inner one):

- worker calls:   Engine.request, the judge waiting on the worker (student code under the recorder,
                  the worker's start for the first call of the part, the protocol);
- meta check:     replay.check_record (the record's budget, on meta tensors);
- main replay:    replay._real_pass (every recorded op, on the judge's inputs);
- twin replay:    replay._twin_pass (the same ops on perturbed inputs);
- tag replay:     liveness.pair_keys (every element tagged with its query row and key, §5.1);
- live intervals: liveness.Lives (storages and their live intervals);
- the rest:       pytest, references, tolerances, the other rules of the tests.

Memory: the judge's peak resident memory (getrusage, the process's peak so far) and what it still holds
after the grade (resident anonymous memory, engine/memory.py), next to the judge's bound.

The figures in a closing note about a hostile part's cost come from this, for example
`--impl <red-team corpus>/backward_rows_via_number_offset --part 4` (assemble the corpus with
`python -m instructor.redteam assemble DEST`).
"""
from __future__ import annotations

import argparse
import functools
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.instrument import wrapped  # noqa: E402


class StageClock:
    """Exclusive wall time per stage of wrapped functions: time spent in a wrapped function called from
    another wrapped one counts for the inner stage only."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[float]] = []  # per active stage: [time spent in nested stages]

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                nested = self._stack.pop()[0]
                self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - nested
                self.calls[stage] = self.calls.get(stage, 0) + 1
                if self._stack:
                    self._stack[-1][0] += spent
        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def stages(clock: StageClock) -> list[tuple[Any, str, Callable]]:
    """The judge's stages, as targets of instrument.wrapped, each timed by `clock`."""
    from autograder.engine import judge, replay
    from autograder.tests import liveness

    targets = [("worker calls", judge.Engine, "request"), ("meta check", replay, "check_record"),
               ("main replay", replay, "_real_pass"), ("twin replay", replay, "_twin_pass"),
               ("tag replay", liveness, "pair_keys"), ("live intervals", liveness.Lives, "__init__")]
    return [(owner, name, functools.partial(clock.wrap, stage)) for stage, owner, name in targets]


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_judge_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default=str(ROOT / "solutions"), help="the submission's folder (default: solutions/)")
    ap.add_argument("--part", type=int, default=2)
    ap.add_argument("--sets", default="public,hidden")
    a = ap.parse_args(list(argv) if argv is not None else [])
    impl = Path(a.impl)
    if not impl.is_dir():
        raise SystemExit(f"bench_judge_cost: --impl {impl} is not a folder; give a submission's folder")

    from autograder.engine import memory
    from autograder.engine.runner import grade

    sets = tuple(s for s in a.sets.split(",") if s)
    grade(ROOT / "solutions", parts=[a.part], test_sets=sets)  # warm-up
    clock = StageClock()
    with wrapped(stages(clock)):
        t0 = time.perf_counter()
        report = grade(impl, parts=[a.part], test_sets=sets)
        wall = time.perf_counter() - t0
    memory.release()
    held, peak = memory.resident_anon(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    part = report["parts"][0] if report.get("parts") else {}
    print(f"{impl.name}, part {a.part} ({'+'.join(sets)}): {part.get('passed', '?')}/{part.get('total', '?')} tests, "
          f"{report['total']:g}/{report['max_total']:g} points, {wall:.2f} s wall in one judge")
    rest = wall - sum(clock.seconds.values())
    print(f"{'stage':<15} {'seconds':>8} {'share':>6} {'calls':>6}")
    for stage, s in sorted(clock.seconds.items(), key=lambda kv: -kv[1]):
        print(f"{stage:<15} {s:>8.2f} {s / wall:>6.0%} {clock.calls[stage]:>6}")
    print(f"{'the rest':<15} {rest:>8.2f} {rest / wall:>6.0%}")
    print(f"the judge's peak resident memory {peak / 2**30:.2f} GB, held after the grade {held / 2**30:.2f} GB "
          f"(its bound, judge_memory_mb: {memory.bound() / 2**30:.1f} GB)")
    return {"wall_s": wall, "stages_s": dict(clock.seconds), "rest_s": rest, "peak_bytes": peak, "held_bytes": held,
            "points": (report["total"], report["max_total"])}


if __name__ == "__main__":
    main(sys.argv[1:])
