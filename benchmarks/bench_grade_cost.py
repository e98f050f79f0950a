"""Where the CPU of one grade goes: per part, the judge's and the workers' CPU seconds, the requests
it sends to the worker, the recorded calls it replays and their ops.

The batch is CPU-bound (`make bench BENCH=autograde` reports the cores busy), so its rate is
cores · 60 / (CPU seconds per submission). This splits that figure for the solutions (public and
hidden tests, one judge in this process, workers forked from its fork server, no sandbox), after
one warm-up grade, as a judge of a batch grades its second submission:

- judge:   this process's CPU (pytest, the tests, references, check and replay of every record);
- workers: the CPU of its fork server and workers (the student code under the recorder, the
           protocol), from /proc (Linux);
- ops:     recorded torch ops the judge replayed (each runs three times: in the worker, in the
           judge's main pass and in its twin; `make bench BENCH=replay` prices one op in each stage).

Run: python -m benchmarks bench_grade_cost  (or make bench BENCH=grade_cost).
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.instrument import wrapped  # noqa: E402


def _descendants_cpu_s() -> float:
    """CPU seconds of this process's descendants (the fork server and its workers), each counted
    once: a live process's own time plus what its reaped children used (/proc/PID/stat fields 14-17),
    plus this process's reaped children (getrusage). Other work on the machine does not count."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent pid, ticks)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    mine, found = {os.getpid()}, True
    while found:
        found = False
        for pid, (ppid, _) in stats.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                found = True
    ticks = sum(stats[p][1] for p in mine if p != os.getpid())
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ticks / os.sysconf("SC_CLK_TCK") + reaped.ru_utime + reaped.ru_stime


def main() -> dict:
    from autograder.engine import judge, memory, replay
    from autograder.engine.rubric import load_rubric
    from autograder.engine.runner import grade

    seen = {"requests": 0, "replays": 0, "ops": 0}

    def count_requests(request):
        def counted(self, *a, **kw):
            seen["requests"] += 1
            return request(self, *a, **kw)
        return counted

    def count_replays(replay_record):
        def counted(*a, **kw):
            out = replay_record(*a, **kw)
            seen["replays"] += 1
            seen["ops"] += out[0].ops
            return out
        return counted

    sets = ("public", "hidden")
    rows = []
    with wrapped([(judge.Engine, "request", count_requests), (replay, "_replay_record", count_replays)]):
        grade("solutions", test_sets=sets)  # warm-up: imports, the fork server, first-use caches
        for part in load_rubric().numbers:
            seen.update(requests=0, replays=0, ops=0)
            workers0, cpu0, t0 = _descendants_cpu_s(), time.process_time(), time.perf_counter()
            report = grade("solutions", parts=[part], test_sets=sets)
            workers, cpu, wall = _descendants_cpu_s() - workers0, time.process_time() - cpu0, time.perf_counter() - t0
            rows.append({"part": part, "tests": sum(p["total"] for p in report["parts"]), **seen,
                         "judge_cpu_s": cpu, "worker_cpu_s": workers, "wall_s": wall,
                         "points": f"{report['total']:g}/{report['max_total']:g}"})
    head = f"{'part':>4} {'tests':>5} {'requests':>8} {'replays':>7} {'ops':>8} {'judge s':>8} {'worker s':>8} {'wall s':>7}  points"
    print("one grade of solutions/ (public + hidden), per part; CPU seconds:")
    print(head)
    for r in rows:
        print(f"{r['part']:>4} {r['tests']:>5} {r['requests']:>8} {r['replays']:>7} {r['ops']:>8,} {r['judge_cpu_s']:>8.2f} "
              f"{r['worker_cpu_s']:>8.2f} {r['wall_s']:>7.2f}  {r['points']}")
    tot = {k: sum(r[k] for r in rows) for k in ("tests", "requests", "replays", "ops", "judge_cpu_s", "worker_cpu_s",
                                               "wall_s")}
    cpu = tot["judge_cpu_s"] + tot["worker_cpu_s"]
    print(f"{'all':>4} {tot['tests']:>5} {tot['requests']:>8} {tot['replays']:>7} {tot['ops']:>8,} {tot['judge_cpu_s']:>8.2f} "
          f"{tot['worker_cpu_s']:>8.2f} {tot['wall_s']:>7.2f}")
    cores = os.cpu_count() or 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10  # KiB on Linux
    print(f"the judge's peak resident memory: {peak / 2**30:.2f} GB (the judge's bound, judge_memory_mb: "
          f"{memory.bound() / 2**30:.1f} GB)")
    print(f"{cpu:.2f} CPU-s per submission: at most {cores * 60 / cpu:.1f} such submissions per minute on {cores} "
          f"cores; 60 per minute on 2 cores needs 2.0 CPU-s, 80 needs 1.5")
    return {"rows": rows, "cpu_s": cpu, "judge_peak_bytes": peak}


if __name__ == "__main__":
    main()
