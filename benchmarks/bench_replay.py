"""What trusted measurement costs per recorded torch op: record (worker), check, main pass, twin pass.

A grade is CPU-bound (`make bench BENCH=autograde` reports the machine's busy fraction), and most of
its CPU is the record-and-replay of the students' calls: this prices one op in each stage, beside
the op run bare, on part 1's column-by-column online_summary of a (3, 1024) float32 row (the
solutions'; ~12,000 small ops, the shape of the costliest part-1 calls).

- bare:   the function run plainly (no recording);
- record: the same under the worker's Recorder (TorchDispatchMode), op list encoded to JSON;
- check:  the judge's check_record (JSON decoded, every op resolved, validated, prepared);
- main:   the judge's main pass: every op bounded before it runs (shapes, bytes, FLOPs), run, and
          measured (storage, FLOPs, broadcast products, views checked against the record's claims);
- twin:   the twin pass on other inputs of the same shapes (only run and shape-checked).

The garbage collector is paused, as in the engine (replay_record, the worker's Recorder).
Run: python -m benchmarks bench_replay  (or make bench BENCH=replay). Median of 5 repetitions.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median_s(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> dict:
    import torch

    from autograder.engine import replay
    from autograder.scenarios.tracing import paused_gc, record_call
    from solutions.online_softmax import online_summary

    torch.set_num_threads(1)
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(0))
    twin_x = x + 0.05 * torch.randn(3, 1024, generator=torch.Generator().manual_seed(1))
    budget = replay.DEFAULT_BUDGET
    with paused_gc():
        record = record_call(online_summary, [x], x)
        ops = replay.check_record(record, 1, 1, budget)
        main_rp = replay._real_pass(ops, replay._base(record, [x], {}), record, set(), {}, budget=budget)
        stages = {
            "bare": lambda: online_summary(x),
            "record": lambda: record_call(online_summary, [x], x),
            "check": lambda: replay.check_record(record, 1, 1, budget),
            "main": lambda: replay._real_pass(ops, replay._base(record, [x], {}), record, set(), {}, budget=budget),
            "twin": lambda: replay._twin_pass(main_rp, replay._base(record, [twin_x], {}), record, {}),
        }
        seconds = {name: _median_s(fn) for name, fn in stages.items()}
    n = len(ops)
    us = {name: 1e6 * s / n for name, s in seconds.items()}
    judge = us["check"] + us["main"] + us["twin"]
    print(f"online_summary on a (3, 1024) row: {n:,} recorded ops; microseconds per op (median of 5):")
    for name, v in us.items():
        print(f"  {name:<7} {v:6.1f}")
    print(f"  worker (record) {us['record']:.1f} + judge (check + main + twin) {judge:.1f} = "
          f"{us['record'] + judge:.1f} us per op, {(us['record'] + judge) / us['bare']:.0f}x the bare op")
    return {"ops": n, "us_per_op": {k: round(v, 2) for k, v in us.items()}}


if __name__ == "__main__":
    main()
