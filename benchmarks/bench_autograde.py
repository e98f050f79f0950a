"""Batch autograding throughput: 40 submissions (correct, buggy, hostile), public + hidden tests,
sandboxed, one judge per core (2 here). Reports submissions per minute, before and after.

    python -m benchmarks.bench_autograde [--n 40] [--jobs 2] [--parts 1,2,...] [--sets public,hidden]
                                         [--sandbox auto|bubblewrap|uid] [--runs after,clean,no_reuse,before]

The mix: a quarter correct (solutions/), half buggy (the mutation catalogue instructor/mutations/*.toml
applied to solutions/, cycling through it), a quarter hostile (the red-team corpus, cycling). Limits
are the rubric's (20 s per call, ...), as in a real batch. Four runs, on the same submissions:
- after:    the batch as it is (call time limits scaled from the reference's own time; sandboxed
            workers forked from a fork server: the judge's in the uid mode, one inside the
            submission's sandbox under bubblewrap; a part whose reached files an earlier submission
            of the batch, or the reference graded to calibrate, had too takes that result, whichever
            judge graded it: engine/reuse.py; a test whose calls get a stored pass's replies stops
            there, passed: engine/transcripts.py, counted as tests_reused);
- clean:    the same without the hostile quarter;
- no_reuse: `after` with every part and test of every submission graded (--no-reuse): what the mix costs
            when no two submissions share a file (the mix's copies of solutions/ and of the starter
            favour reuse: 10 identical correct submissions, 20 that differ from them in one file);
- before:   fixed 20 s call limits, every sandboxed worker started afresh (imports torch), one
            worker for all parts, no reuse, i.e. the engine's behaviour before those changes.
The machine's load average is printed before and after each run (the machine may be shared).

Sandbox overhead per worker start: the time to start `python -I -S -c pass` through the sandbox
prefix minus without it (20 interleaved repetitions; minima, and the median of the differences).
"""
from __future__ import annotations

import argparse
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from instructor import redteam  # noqa: E402
from instructor.batch import Options, run_batch  # noqa: E402
from instructor.intake import all_graded_files  # noqa: E402
from instructor.sandbox import Sandbox, require  # noqa: E402


def make_submissions(dest: Path, n: int) -> dict[str, str]:
    """n submissions in dest: {name: kind}. Kinds: correct, buggy:<mutation>, hostile:<attack>."""
    files = all_graded_files()
    mutations = sorted((ROOT / "instructor" / "mutations").glob("*.toml"))
    corpus_dir = dest.parent / "corpus"
    attacks = [a for a in redteam.assemble(corpus_dir, honest=False)]
    n_correct, n_hostile = n // 4, n // 4
    n_buggy = n - n_correct - n_hostile
    kinds: dict[str, str] = {}
    for i in range(n_correct):
        d = dest / f"correct_{i:02d}"
        d.mkdir(parents=True)
        for f in files:
            shutil.copy(ROOT / "solutions" / f, d / f)
        kinds[d.name] = "correct"
    for i, m in zip(range(n_buggy), itertools.cycle(mutations)):
        d = dest / f"buggy_{i:02d}"
        d.mkdir(parents=True)
        for f in files:
            shutil.copy(ROOT / "solutions" / f, d / f)
        redteam._apply_mutation(d, m.stem)
        kinds[d.name] = f"buggy:{m.stem}"
    for i, a in zip(range(n_hostile), itertools.cycle(attacks)):
        shutil.copytree(corpus_dir / a, dest / f"hostile_{i:02d}")
        kinds[f"hostile_{i:02d}"] = f"hostile:{a}"
    return kinds


def worker_start_overhead(box: Sandbox, reps: int = 20) -> dict:
    """Extra seconds to start a process through the sandbox prefix (launcher + bubblewrap + setpriv),
    on a bare `python -I -S -c pass` so that the load of the machine blurs it least: interleaved
    repetitions, the minimum of each (the least disturbed run) and the medians."""
    box = box.with_uid(64010)
    cmd = [sys.executable, "-I", "-S", "-c", "pass"]
    bare, boxed = [], []
    for _ in range(reps):
        for boxed_run, out in ((False, bare), (True, boxed)):
            pre = box.prefix([sys.prefix, sys.base_prefix]) if boxed_run else []
            t0 = time.perf_counter()
            subprocess.run(pre + cmd, check=True, capture_output=True)
            out.append(time.perf_counter() - t0)
    box.sweep()
    return {"sandbox": box.mode, "bare_min_s": min(bare), "sandboxed_min_s": min(boxed),
            "overhead_s": min(boxed) - min(bare),
            "overhead_median_s": statistics.median(b - a for a, b in zip(bare, boxed))}


def machine_cpu_s() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, from /proc/stat (Linux)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz  # idle and iowait are not busy


def _one_run(subs: Path, out: Path, kinds: dict, a, parts, limits: dict, scale: bool, reuse: bool) -> dict:
    load0 = os.getloadavg()
    busy0 = machine_cpu_s()
    ru0 = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    summary = run_batch(subs, out, jobs=a.jobs, progress=sys.stderr.isatty(), sandbox=a.sandbox,
                        options=Options(parts=parts, test_sets=tuple(a.sets.split(",")), limits=limits,
                                        scale_timeouts=scale, reuse=reuse))
    ru1 = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    busy1 = machine_cpu_s()
    rusage_cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(ru0, ru1))
    # CPU seconds of the batch: the machine's busy time over the run. getrusage(RUSAGE_CHILDREN) is
    # not enough: it counts only descendants waited for all the way up, and it misses most of the
    # processes inside the bubblewrap sandboxes (one run: 217 CPU-s by getrusage, 368 by /proc/stat;
    # in the uid mode the two agree).
    cpu = busy1[0] - busy0[0]
    starts = [t.get("worker_starts", 0) for t in summary["engine_timing"].values()]
    startup = [s for t in summary["engine_timing"].values() for s in t.get("worker_startup_s", [])]
    return {
        "submissions": summary["submissions"], "graded": summary["graded"],
        "failed_to_grade": summary["failed_to_grade"], "jobs": summary["jobs"], "wall_s": summary["wall_s"],
        "submissions_per_minute": summary["submissions_per_minute"],
        # CPU seconds of the batch (the machine's busy time: judges, fork servers, workers, and whatever
        # else ran, so on a quiet machine only): the rate that `cores` idle cores would allow is
        # submissions * 60 * cores / cpu_s; busy_fraction near 1 means the cores were kept busy
        "cpu_s": round(cpu, 1), "cpu_s_per_submission": round(cpu / max(summary["submissions"], 1), 2),
        "busy_fraction": round(cpu / max(busy1[1] - busy0[1], 1e-9), 3),
        "rusage_cpu_s": round(rusage_cpu, 1),
        "cpu_bound_submissions_per_minute": round(summary["submissions"] * 60 * (os.cpu_count() or 1) / cpu, 1)
        if cpu > 0 else None,
        "mix": {k: sum(v.startswith(k) for v in kinds.values()) for k in ("correct", "buggy", "hostile")},
        "call_time_limits": summary.get("call_time_limits", {"scaled": False}),
        "parts_reused": summary.get("parts_reused", 0),
        "tests_reused": summary.get("tests_reused", 0),
        "mean_worker_starts_per_submission": round(statistics.mean(starts), 2) if starts else 0.0,
        "mean_worker_startup_s": round(statistics.mean(startup), 3) if startup else None,
        "load_average_before_after": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "slowest": sorted(summary["per_submission_s"].items(), key=lambda kv: -kv[1])[:3],
    }


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_autograde", description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--parts", default=None, help="comma-separated parts (default: all)")
    ap.add_argument("--sets", default="public,hidden")
    ap.add_argument("--sandbox", default="auto", choices=["auto", "bubblewrap", "uid"])
    ap.add_argument("--runs", default="after,clean,no_reuse,before", help="which runs (after, clean, no_reuse, before)")
    # `make bench` calls main() with no arguments: the full run, unless BENCH_AUTOGRADE_ARGS says otherwise
    a = ap.parse_args(list(argv) if argv is not None else os.environ.get("BENCH_AUTOGRADE_ARGS", "").split())
    parts = [int(x) for x in a.parts.split(",")] if a.parts else None
    runs = [r for r in a.runs.split(",") if r]
    result: dict = {"cores": os.cpu_count(), "sandbox": None}
    with tempfile.TemporaryDirectory(prefix="bench-autograde-") as tmp:
        subs = Path(tmp) / "submissions"
        kinds = make_submissions(subs, a.n)
        clean = Path(tmp) / "clean"
        clean.mkdir()
        for name, kind in kinds.items():
            if not kind.startswith("hostile"):
                shutil.copytree(subs / name, clean / name)
        plans = {"after": (subs, kinds, {}, True, True),
                 "clean": (clean, {k: v for k, v in kinds.items() if not v.startswith("hostile")}, {}, True, True),
                 "no_reuse": (subs, kinds, {}, True, False),
                 "before": (subs, kinds, {"fork_server": False, "worker_per_part": False}, False, False)}
        for run in runs:
            folder, mix, limits, scale, reuse = plans[run]
            result[run] = _one_run(folder, Path(tmp) / f"out-{run}", mix, a, parts, limits, scale, reuse)
            print(f"{run}: {result[run]['submissions_per_minute']} submissions/min "
                  f"({result[run]['wall_s']} s, load {result[run]['load_average_before_after']})", flush=True)
    box = require(a.sandbox)
    result["sandbox"] = box.mode
    overhead = worker_start_overhead(box)
    result.update({k: round(v, 4) if isinstance(v, float) else v for k, v in overhead.items() if k != "sandbox"})
    width = max(map(len, result))
    for k, v in result.items():
        print(f"{k:<{width}}  {v}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
