"""The grading engine's costs: `make grade` wall time, worker start, calls per second.

1. `python -m autograder.grade --impl solutions` end to end (a fresh interpreter, as `make grade
   IMPL=solutions` runs it), with the public tests (the student's `make grade`) in one process and
   with the parts split over 2 processes (--jobs 2), and with public + hidden tests (--jobs 2).
2. Worker start: until a worker answers, started directly (`python -I -S`, imports torch: what
   every worker costs under a sandbox prefix) and forked from the pre-imported fork server (the
   default without a prefix).
3. Calls per second through the proxy (judge -> worker -> judge, plain-data encoding both ways)
   for a call with no tensor, and with a (4, 256, 64) float32 tensor in and out.

Side by side: `BENCH_BASELINE=<git revision>` (default d604769, the engine before trace-and-replay)
also times `make grade IMPL=solutions` in a temporary worktree of that revision, interleaved with this
tree (median of BENCH_REPEAT runs, default 3), and prints both and their ratio. BENCH_BASELINE=none
skips it.

Run: python -m benchmarks bench_grading  (or make bench BENCH=grading). Timings on a shared machine
are noisy; each figure is the median of several repetitions.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]

PROBE = """
def noop(x=None):
    return 1

def echo(t):
    return t * 2
"""


DEFAULT_BASELINE = "d604769"  # the engine before trace-and-replay (issue 9's "today")


def grade_wall(tests: str, jobs: int, repo: Path = REPO) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "autograder.grade", "--impl", "solutions", "--tests", tests,
                              "--jobs", str(jobs), "--json", str(out)], cwd=repo, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        report = json.loads(out.read_text()) if out.exists() else {"total": None, "timing": {}}
    if run.returncode not in (0, 1):
        print(run.stderr[-2000:])
    return wall, report


def side_by_side(console, baseline: str, repeat: int) -> None:
    """make grade IMPL=solutions at `baseline` and here, interleaved: medians and their ratio."""
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        add = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), baseline],
                             capture_output=True, text=True)
        if add.returncode != 0:
            console.print(f"side by side skipped: no revision {baseline} here ({add.stderr.strip()[:120]})")
            return
        try:
            table = Table(title=f"make grade IMPL=solutions: {baseline} and this tree (median of {repeat})")
            for col in ("tests", "jobs", f"{baseline} s", "this tree s", "ratio"):
                table.add_column(col, justify="right")
            for tests, jobs in (("public", 1), ("all", 1), ("all", 2)):
                before, after = [], []
                for _ in range(repeat):
                    before.append(grade_wall(tests, jobs, tree)[0])
                    after.append(grade_wall(tests, jobs)[0])
                b, a = statistics.median(before), statistics.median(after)
                table.add_row(tests, str(jobs), f"{b:.1f}", f"{a:.1f}", f"{a / b:.2f}x")
            console.print(table)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main() -> None:
    import os

    from rich.console import Console
    from rich.table import Table

    import torch

    from autograder.engine.judge import Limits, WorkerPool, prepare_submission
    from autograder.engine.processes import _Output

    console = Console()
    baseline = os.environ.get("BENCH_BASELINE", DEFAULT_BASELINE)
    if baseline != "none":
        side_by_side(console, baseline, int(os.environ.get("BENCH_REPEAT", "3")))
    table = Table(title="make grade IMPL=solutions (fresh interpreter)")
    for col in ("tests", "jobs", "wall s", "engine s", "tests run", "calls", "points"):
        table.add_column(col, justify="right")
    for tests, jobs in (("public", 1), ("public", 2), ("all", 2)):
        wall, report = grade_wall(tests, jobs)
        table.add_row(tests, str(jobs), f"{wall:.1f}", f"{report['timing'].get('wall_s', float('nan')):.1f}",
                      str(len(report.get("tests", []))), str(report["timing"].get("calls")),
                      f"{report['total']}/{report.get('max_total')}")
    console.print(table)

    with tempfile.TemporaryDirectory() as tmp:
        impl = Path(tmp) / "impl"
        impl.mkdir()
        (impl / "probe.py").write_text(PROBE)
        starts = Table(title="worker start (median of 5)")
        starts.add_column("how")
        starts.add_column("seconds", justify="right")
        for label, fork in (("direct: python -I -S + import torch", False), ("forked from the fork server", True)):
            times = []
            for i in range(6 if fork else 5):
                sub = prepare_submission(impl, ["probe.py"], Path(tmp) / f"w{int(fork)}{i}")
                pool = WorkerPool(sub, ["probe"], Limits(fork_server=fork), None)
                t0 = time.perf_counter()
                pool.request("call", "probe.noop", (), {}, 60, _Output(100, 1 << 20), ["probe.py"])
                times.append(time.perf_counter() - t0)
                pool.close()
            if fork:
                times = times[1:]  # the first fork also waits for the fork server's own start
            starts.add_row(label, f"{statistics.median(times):.3f}")
        console.print(starts)

        rates = Table(title="calls per second through the proxy (median of 3 x 300 calls)")
        rates.add_column("call")
        rates.add_column("calls/s", justify="right")
        sub = prepare_submission(impl, ["probe.py"], Path(tmp) / "rate")
        pool = WorkerPool(sub, ["probe"], Limits(), None)
        sink = _Output(100, 1 << 30)
        t = torch.randn(4, 256, 64)
        for label, target, args in (("no tensor", "probe.noop", ()), ("(4, 256, 64) float32 in and out",
                                                                       "probe.echo", (t,))):
            pool.request("call", target, args, {}, 60, sink, ["probe.py"])
            rounds = []
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(300):
                    pool.request("call", target, args, {}, 60, sink, ["probe.py"])
                rounds.append(300 / (time.perf_counter() - t0))
            rates.add_row(label, f"{statistics.median(rounds):.0f}")
        pool.close()
        console.print(rates)


if __name__ == "__main__":
    main()
