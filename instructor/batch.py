"""Batch autograder: grade a folder of submissions with the public AND hidden tests, sandboxed.

    python -m instructor.batch SUBMISSIONS --out DIR [--jobs N] [--shard i/n] [--parts 1,2]
    python -m instructor.batch merge DIR1 DIR2 ... --out DIR      (join the shards' results)

Each entry of SUBMISSIONS (a folder or a .zip) is one student. Intake (instructor/intake.py) copies
only the graded files into a private temp folder; the engine (autograder.engine.grade, the same one
`make grade` uses) grades that copy, its judge in one of `--jobs` judge processes, the student code
in worker processes inside the sandbox (instructor/sandbox.py). Writes:

    DIR/grades.csv                  one row per submission: one column per part, total, status
    DIR/<student>/feedback.md       what `make grade` shows, hidden tests named but not revealed
    DIR/<student>/feedback.json     the same as JSON (+ intake notes, hashes, sandbox mode)
    DIR/<student>/results.json      Gradescope's results format
    DIR/summary.json                graded / failed to grade / time, sandbox, environment hashes

Regrading the same folder gives the same grades.csv byte for byte (no times in it; rows sorted).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import io
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from . import intake
from .sandbox import Sandbox, SandboxError, require

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GRADER = "autograder.engine:grade"
UID_BASE = 64000  # judge slot i runs its workers as uid UID_BASE + i (bubblewrap mode, as root)
OUTPUT_SHOWN = 2000  # characters of a test's student output kept in the feedback
OUTPUT_TOTAL = 20000  # characters of student output in one feedback, all tests together
RESERVED = {"grades.csv", "summary.json"}


# ---------------------------------------------------------------------------------------------
# environment fingerprint (recorded with every result)


def environment() -> dict:
    """Python version and the installed distributions (what `pip freeze` lists), hashed."""
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()
                    if d.metadata and d.metadata["Name"]}, key=str.lower)
    freeze = "\n".join(dists)
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": platform.machine(), "packages": len(dists),
            "pip_freeze_sha256": hashlib.sha256(freeze.encode()).hexdigest()}


# ---------------------------------------------------------------------------------------------
# judges: long-lived processes that import the engine once and grade one submission at a time


@dataclass
class Task:
    name: str
    impl_dir: str
    out_json: str


@dataclass
class Options:
    parts: list[int] | None = None
    test_sets: tuple[str, ...] = ("public", "hidden")
    limits: dict = field(default_factory=dict)
    grader: str = DEFAULT_GRADER  # "module:function" with autograder.engine.grade's signature
    sandbox: Sandbox | None = None
    tests_dir: str | None = None  # another assignment-tests folder (default: autograder/tests)
    scale_timeouts: bool = True  # each call's time limit from the reference's own time (scaled_call_timeouts)


def _resolve(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _judge_main(conn, slot: int, options: Options) -> None:
    """A judge process: receives Tasks, grades each, writes the report JSON, answers 'done'."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    grade = _resolve(options.grader)
    prefix = options.sandbox.with_uid(UID_BASE + slot) if options.sandbox else None
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        t0 = time.perf_counter()
        try:
            extra = {"tests_dir": options.tests_dir} if options.tests_dir else {}
            try:
                report = grade(task.impl_dir, parts=options.parts, test_sets=options.test_sets,
                               worker_prefix=prefix, limits=options.limits or None, **extra)
            finally:
                _sweep(prefix)
            Path(task.out_json).write_text(json.dumps(report))
            conn.send(("ok", time.perf_counter() - t0))
        except BaseException as e:  # noqa: BLE001 -- a grading failure must not stop the batch
            conn.send(("error", f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc()[-3000:]))


class Judge:
    def __init__(self, ctx, slot: int, options: Options) -> None:
        self.slot = slot
        self.conn, child = ctx.Pipe()
        # not daemonic: a judge may itself start processes (the engine's jobs option); it exits when the
        # batch closes its pipe, and the batch kills it when it hangs
        self.proc = ctx.Process(target=_judge_main, args=(child, slot, options), name=f"judge-{slot}")
        self.proc.start()
        child.close()
        self.task: Task | None = None
        self.deadline = 0.0
        self.started = 0.0

    def submit(self, task: Task, timeout: float) -> None:
        self.task, self.started = task, time.perf_counter()
        self.deadline = self.started + timeout
        self.conn.send(task)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


# ---------------------------------------------------------------------------------------------
# the batch


@dataclass
class Entry:
    name: str
    path: Path


def list_entries(folder: Path) -> list[Entry]:
    """Submissions in `folder`, sorted, with unique folder-safe names (alice, alice-2, ...)."""
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is not a folder; pass the folder that holds one entry per submission")
    seen: dict[str, int] = {}
    out = []
    for p in sorted(folder.iterdir(), key=lambda p: p.name):
        if p.name.startswith("."):
            continue
        base = intake.student_name(p)
        if base in RESERVED:  # would collide with the batch's own files in --out
            base += "-student"
        seen[base] = seen.get(base, 0) + 1
        out.append(Entry(base if seen[base] == 1 else f"{base}-{seen[base]}", p))
    return out


def shard_of(entries: list[Entry], shard: tuple[int, int] | None) -> list[Entry]:
    """Shard i of n (1-based): every n-th entry of the sorted list, starting at the i-th."""
    if not shard:
        return entries
    i, n = shard
    return [e for k, e in enumerate(entries) if k % n == i - 1]


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes i/n, e.g. 2/8, not {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--shard {text}: need 1 <= i <= n")
    return i, n


def run_batch(submissions: Path, out: Path, *, jobs: int | None = None, shard: tuple[int, int] | None = None,
              options: Options | None = None, timeout_s: float = 1800.0, progress: bool = True,
              sandbox: str = "auto", allow_weak: bool = False) -> dict:
    """Grade every entry of `submissions` (or one shard of them) into `out`. Returns the summary."""
    t_start = time.perf_counter()
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    if out == submissions or out.is_relative_to(submissions):
        raise SystemExit("error: the output folder must not be inside the submissions folder; choose another --out")
    options = options or Options()
    sandbox_info = choose_sandbox(options, sandbox, allow_weak)
    entries = shard_of(list_entries(submissions), shard)
    inline = jobs == 0  # grade in this process, one at a time (debugging; tests)
    jobs = 1 if inline else max(1, min(jobs or os.cpu_count() or 1, len(entries) or 1))
    out.mkdir(parents=True, exist_ok=True)
    if options.sandbox is not None and options.sandbox.kind == "uid":
        os.chmod(out, out.stat().st_mode & 0o770)  # the results: closed to the sandbox's uids
    env = environment()
    work = Path(tempfile.mkdtemp(prefix="autograde-"))  # intake copies: never in the instructor's tree
    results: dict[str, dict] = {}
    try:
        pending: list[tuple[Entry, intake.Submission]] = []
        for e in entries:
            sub = intake.take(e.path, work / e.name / "files")
            sub.name = e.name
            if sub.error or not sub.files:
                results[e.name] = _finish(out, e, sub, None, None, sandbox_info, env, options)
            else:
                pending.append((e, sub))
        if pending and options.scale_timeouts and options.grader == DEFAULT_GRADER:
            sandbox_info["call_time_limits"] = scaled_call_timeouts(options)
        if inline:
            _grade_inline(pending, out, options, results, sandbox_info, env)
        else:
            _grade_all(pending, work, out, jobs, options, timeout_s, progress, results, sandbox_info, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = _write_summary(out, entries, results, time.perf_counter() - t_start, jobs, shard, sandbox_info,
                             env, options)
    return summary


# ---------------------------------------------------------------------------------------------
# sandbox mode (fail closed) and call time limits scaled from the reference

# A call may take this many times the reference's own time for it (measured once per batch, in the
# same sandbox, on this machine), but never less than the floor, nor more than the configured limit.
# Generous on purpose: a correct but slow algorithm (Python loops where the reference uses tensor
# ops) must still pass; what the scaling removes is the 20 s wait on calls that take milliseconds.
TIMEOUT_FACTOR = 50.0
TIMEOUT_FLOOR_S = 5.0


def choose_sandbox(options: Options, mode: str, allow_weak: bool) -> dict:
    """Sets options.sandbox to the mode asked for (instructor/sandbox.py require: bubblewrap, uid,
    auto = the strongest of the two), or refuses with SystemExit (one line, non-zero) when that
    mode is not available and the instructor did not accept a weaker one (allow_weak). "off" (no
    sandbox at all, for debugging) needs allow_weak too. Returns what every result records."""
    if options.sandbox is None and mode != "off":
        try:
            options.sandbox = require(mode, allow_weak)
        except SandboxError as e:
            raise SystemExit(f"error: {e}") from None
    if options.sandbox is None:
        if not allow_weak and options.grader == DEFAULT_GRADER:
            raise SystemExit("error: refusing to grade with --sandbox off (no sandbox at all); "
                             "pass --allow-weak-sandbox to accept that (debugging only)")
        return {"sandbox": "none (disabled with --sandbox off; for debugging only)", "process_limit": "none",
                "sandbox_kind": "none"}
    return options.sandbox.describe()


def _sweep(prefix) -> None:
    """What the sandbox's uid left behind (scratch, /tmp, /dev/shm) goes before the next submission."""
    if prefix is not None and hasattr(prefix, "sweep"):
        prefix.sweep()


def scaled_call_timeouts(options: Options, factor: float = TIMEOUT_FACTOR, floor: float = TIMEOUT_FLOOR_S) -> dict:
    """Grade the reference (solutions/) once, in the batch's sandbox, and limit every call target to
    max(floor, factor x the reference's longest call to it) seconds (capped by the configured limit
    in the engine): a hanging submission then costs seconds per call, not the 20 s default. Sets
    options.limits["call_timeouts"]; returns what the summary records."""
    from autograder.engine.processes import record_call_times

    grade = _resolve(options.grader)
    prefix = options.sandbox.with_uid(UID_BASE) if options.sandbox else None
    extra = {"tests_dir": options.tests_dir} if options.tests_dir else {}
    t0 = time.perf_counter()
    try:
        with record_call_times() as times:
            grade(str(ROOT / "solutions"), parts=options.parts, test_sets=options.test_sets, worker_prefix=prefix,
                  limits=options.limits or None, **extra)
    except Exception as e:  # noqa: BLE001 -- no scaling then: the configured limits hold
        return {"scaled": False, "reason": f"grading the reference failed: {type(e).__name__}: {e}"[:300]}
    finally:
        _sweep(prefix)
    limits = {t: round(max(floor, factor * s), 2) for t, s in sorted(times.items())}
    options.limits = {**(options.limits or {}), "call_timeouts": limits}
    return {"scaled": True, "factor": factor, "floor_s": floor, "targets": len(limits),
            "at_floor": sum(v == floor for v in limits.values()), "calibration_s": round(time.perf_counter() - t0, 2)}


def _grade_inline(pending, out: Path, options: Options, results: dict, sandbox_info: dict, env: dict) -> None:
    """jobs=0: grade in this process, one submission after the other, no judge processes."""
    grade = _resolve(options.grader)
    prefix = options.sandbox.with_uid(UID_BASE) if options.sandbox else None
    extra = {"tests_dir": options.tests_dir} if options.tests_dir else {}
    for e, sub in pending:
        t0 = time.perf_counter()
        report = failure = None
        try:
            report = json.loads(json.dumps(grade(sub.dir, parts=options.parts, test_sets=options.test_sets,
                                                 worker_prefix=prefix, limits=options.limits or None, **extra)))
        except Exception as ex:  # noqa: BLE001
            failure = {"reason": f"{type(ex).__name__}: {ex}".splitlines()[0][:300], "traceback": traceback.format_exc()}
        _sweep(prefix)
        results[e.name] = _finish(out, e, sub, report, failure, sandbox_info, env, options, time.perf_counter() - t0)


def _grade_all(pending, work: Path, out: Path, jobs: int, options: Options, timeout_s: float, progress: bool,
               results: dict, sandbox_info: dict, env: dict) -> None:
    if not pending:
        return
    ctx = mp.get_context("spawn")  # a clean interpreter per judge; never fork a process with threads
    judges: list[Judge] = []
    queue = list(pending)
    by_name = {e.name: (e, sub) for e, sub in pending}
    bar = _Progress(len(pending), progress)
    try:
        judges = [Judge(ctx, slot, options) for slot in range(min(jobs, len(pending)))]
        idle = list(judges)
        busy: list[Judge] = []
        while queue or busy:
            while idle and queue:
                j = idle.pop(0)
                e, sub = queue.pop(0)
                j.submit(Task(e.name, str(sub.dir), str(work / e.name / "report.json")), timeout_s)
                busy.append(j)
            ready = mp.connection.wait([j.conn for j in busy] + [j.proc.sentinel for j in busy], timeout=0.5)
            now = time.perf_counter()
            for j in list(busy):
                task, outcome, replace = j.task, None, False
                if j.conn in ready or j.conn.poll():
                    try:
                        outcome = j.conn.recv()
                    except (EOFError, OSError):
                        outcome, replace = ("error", "the judge process died", ""), True
                elif not j.proc.is_alive():
                    outcome, replace = ("error", f"the judge process died (exit code {j.proc.exitcode})", ""), True
                elif now > j.deadline:
                    outcome, replace = ("error", f"grading took longer than {timeout_s:g} s and was stopped", ""), True
                if outcome is None:
                    continue
                busy.remove(j)
                e, sub = by_name[task.name]
                report = failure = None
                if outcome[0] == "ok":
                    report = json.loads(Path(task.out_json).read_text())
                else:
                    failure = {"reason": outcome[1], "traceback": outcome[2] if len(outcome) > 2 else ""}
                results[e.name] = _finish(out, e, sub, report, failure, sandbox_info, env, options, now - j.started)
                bar.advance(e.name, failure is None)
                if replace:  # a judge that died or hung is replaced (its workers die with it)
                    j.kill()
                    judges.remove(j)
                    j = Judge(ctx, j.slot, options)
                    judges.append(j)
                idle.append(j)
    finally:
        bar.close()
        for j in judges:
            try:
                j.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for j in judges:
            j.proc.join(10)
            j.kill()


class _Progress:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.p = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                              TextColumn("{task.fields[last]}"), console=Console(stderr=True))
            self.p.start()
            self.task = self.p.add_task("grading", total=total, last="")

    def advance(self, name: str, ok: bool) -> None:
        if self.p:
            self.p.update(self.task, advance=1, last=name if ok else f"{name} (failed to grade)")

    def close(self) -> None:
        if self.p:
            self.p.stop()


# ---------------------------------------------------------------------------------------------
# results


def _rubric_parts() -> list[dict]:
    from autograder.engine import load_rubric

    return [{"part": p.number, "name": p.name, "max_points": float(p.points), "files": p.files}
            for p in load_rubric().parts]


def zero_report(reason: str, parts: Sequence[int] | None) -> dict:
    """A report with every part at 0 and `reason` as each part's failure (nothing was run)."""
    rows = []
    for p in _rubric_parts():
        if parts and p["part"] not in parts:
            continue
        rows.append({"part": p["part"], "name": p["name"], "points": 0.0, "max_points": p["max_points"],
                     "passed": 0, "total": 0, "status": "error",
                     "first_failure": {"test": None, "message": reason, "kind": "rejected"}})
    return {"parts": rows, "total": 0.0, "max_total": float(sum(r["max_points"] for r in rows)), "tests": [],
            "errors": [reason], "hashes": {}}


def student_view(report: dict) -> dict:
    """The report as a student may see it: hidden tests already redacted by the engine; here the
    error list loses lines about hidden tests and student output is truncated."""
    view = json.loads(json.dumps(report))
    view["errors"] = [("a hidden test could not run (the instructor has the details)" if "hidden" in e else e)
                      for e in view.get("errors", [])]
    budget = OUTPUT_TOTAL
    for t in view.get("tests", []):
        if t.get("set") == "hidden":
            t.pop("output", None)
            continue
        text = t.get("output")
        if text:
            keep = max(0, min(OUTPUT_SHOWN, budget))
            budget -= keep
            t["output"] = text[:keep] + (f"\n[... output truncated: {len(text)} characters in all]" if len(text) > keep else "")
    view.pop("timing", None)
    return view


def feedback_markdown(name: str, view: dict, notes: list[str], sandbox: str) -> str:
    """The feedback a student reads: intake notes, then exactly what `make grade` shows (the engine's
    own renderer: per-part table, first failure of each part), then the hidden tests by name."""
    from autograder.engine.feedback import render_text

    lines = [f"# Feedback for {name}", ""]
    if notes:
        lines += ["## Your submission", ""] + [f"- {n}" for n in notes] + [""]
    lines += ["## Grade", "", render_text(view).rstrip("\n")]
    hidden = [t for t in view.get("tests", []) if t.get("set") == "hidden"]
    if hidden:
        groups: dict[str, list[bool]] = {}
        for t in hidden:  # one line per hidden test function: passed / run
            groups.setdefault(t["id"].split("[", 1)[0], []).append(t["outcome"] == "passed")
        lines += ["", "## Hidden tests", "", "Named, not revealed: their inputs and expected values are not shown.", ""]
        lines += [f"- `{name}`: {sum(ok)}/{len(ok)} passed" for name, ok in groups.items()]
    lines += ["", "---", f"Graded with the test sets {', '.join(view.get('test_sets') or ['public'])}. "
              f"Sandbox: {sandbox}.", ""]
    return "\n".join(lines)


def make_view(name: str, sub: intake.Submission, report: dict | None, failure: dict | None, sandbox_info: dict,
              env: dict, parts: Sequence[int] | None) -> tuple[dict, str]:
    """(student view of the report, status) for one submission; a zero report when nothing ran."""
    if report is None:
        reason = (f"submission rejected: {sub.error}" if sub.error else
                  f"failed to grade: {failure['reason']}" if failure else "no graded files found")
        if not sub.error and not failure:
            reason += f" (expected {', '.join(intake.all_graded_files())})"
        report = zero_report(reason, parts)
    status = "graded" if failure is None and not sub.error and sub.files else \
        ("failed to grade" if failure else "rejected")
    view = student_view(report)
    view["student"] = name
    view["status"] = status
    view["intake"] = {"notes": sub.notes(), "files": sub.files, "sha256": sub.sha256}
    view["sandbox"] = sandbox_info["sandbox"]
    view["hashes"] = {**report.get("hashes", {}), "intake_sha256": sub.sha256,
                      "pip_freeze_sha256": env["pip_freeze_sha256"], "python": env["python"]}
    return view, status


def _finish(out: Path, e: Entry, sub: intake.Submission, report: dict | None, failure: dict | None,
            sandbox_info: dict, env: dict, options: Options, elapsed: float | None = None) -> dict:
    """Write one student's feedback.{md,json} and results.json; return the row data."""
    from .gradescope.results import results_json

    view, status = make_view(e.name, sub, report, failure, sandbox_info, env, options.parts)
    notes = view["intake"]["notes"]
    d = out / e.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "feedback.json").write_text(json.dumps(view, indent=2, sort_keys=True) + "\n")
    (d / "feedback.md").write_text(feedback_markdown(e.name, view, notes, sandbox_info["sandbox"]))
    (d / "results.json").write_text(json.dumps(results_json(view, notes=notes), indent=2) + "\n")
    if failure:  # instructor-only: why grading failed (never inside feedback.*)
        (d / "grading-error.txt").write_text(failure["reason"] + "\n\n" + failure.get("traceback", ""))
    return {"name": e.name, "status": status, "report": view, "timing": (report or {}).get("timing"),
            "reason": failure["reason"] if failure else sub.error, "elapsed_s": elapsed}


CSV_HEAD = ["student", "status"]


def write_grades_csv(path: Path, rows: list[dict]) -> None:
    """grades.csv: student, status, part1..partN, total, max_total, submission_sha256 (sorted by student)."""
    parts = sorted({p["part"] for r in rows for p in r["report"]["parts"]})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*CSV_HEAD, *[f"part{n}" for n in parts], "total", "max_total", "submission_sha256", "reason"])
    for r in sorted(rows, key=lambda r: r["name"]):
        by = {p["part"]: p["points"] for p in r["report"]["parts"]}
        failed = r["status"] == "failed to grade"
        w.writerow([r["name"], r["status"], *["" if failed else f"{by.get(n, 0):g}" for n in parts],
                    "" if failed else f"{r['report']['total']:g}", f"{r['report']['max_total']:g}",
                    r["report"].get("intake", {}).get("sha256", ""), (r.get("reason") or "")[:200]])
    path.write_text(buf.getvalue())


def _write_summary(out: Path, entries: list[Entry], results: dict, wall: float, jobs: int, shard, sandbox_info: dict,
                   env: dict, options: Options) -> dict:
    rows = [results[e.name] for e in entries if e.name in results]
    write_grades_csv(out / "grades.csv", rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("graded", "failed to grade", "rejected")}
    hashes = [r["report"].get("hashes", {}) for r in rows]
    summary = {
        "submissions": len(rows), "graded": counts["graded"], "failed_to_grade": counts["failed to grade"],
        "rejected": counts["rejected"], "wall_s": round(wall, 2), "jobs": jobs,
        "submissions_per_minute": round(60 * len(rows) / wall, 2) if wall > 0 else None,
        "shard": list(shard) if shard else None, "test_sets": list(options.test_sets), "parts": options.parts,
        **sandbox_info, "environment": env,
        "tests_sha256": sorted({h.get("tests") for h in hashes if h.get("tests")}),
        "failed": {r["name"]: r["reason"] for r in rows if r["status"] == "failed to grade"},
        "per_submission_s": {r["name"]: round(r["elapsed_s"], 2) for r in rows if r.get("elapsed_s")},
        "engine_timing": {r["name"]: r["timing"] for r in rows if r.get("timing")},  # worker starts, call time
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def print_summary(summary: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="autograde summary", show_header=False)
    t.add_row("submissions", str(summary["submissions"]))
    t.add_row("graded", str(summary["graded"]))
    t.add_row("failed to grade", str(summary["failed_to_grade"]))
    t.add_row("rejected at intake", str(summary["rejected"]))
    t.add_row("time", f"{summary['wall_s']:.1f} s with {summary['jobs']} judge(s)"
              f" ({summary['submissions_per_minute']} submissions/minute)")
    t.add_row("sandbox", summary["sandbox"])
    t.add_row("process limit", summary["process_limit"])
    t.add_row("grades", str(out / "grades.csv"))
    Console(stderr=True).print(t)
    for name, why in summary["failed"].items():
        Console(stderr=True).print(f"[red]failed to grade[/red] {name}: {why} (see {out / name / 'grading-error.txt'})")


# ---------------------------------------------------------------------------------------------
# merge (shards -> one folder)


def merge(shard_dirs: Sequence[Path], out: Path) -> Path:
    """Join shard outputs: copies each student's folder into `out` and writes one grades.csv.
    Refuses shards graded with different tests or environments (their grades would not compare)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    fingerprints = set()
    summaries = []
    for d in map(Path, shard_dirs):
        csv_path = d / "grades.csv"
        if not csv_path.is_file():
            raise SystemExit(f"error: {csv_path} not found; pass the --out folders of the shards")
        with csv_path.open(newline="") as f:
            r = list(csv.reader(f))
        if header is None:
            header = r[0]
        elif r[0] != header:
            raise SystemExit(f"error: {csv_path} has other columns than the first shard ({r[0]} vs {header})")
        for row in r[1:]:
            if row[0] in rows:
                raise SystemExit(f"error: {row[0]} appears in two shards; did two shards get the same --shard i/n?")
            rows[row[0]] = row
            if (d / row[0]).is_dir() and d.resolve() != out.resolve():
                shutil.copytree(d / row[0], out / row[0], dirs_exist_ok=True)
        s = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
        summaries.append(s)
        fingerprints.add((tuple(s.get("tests_sha256", [])), s.get("environment", {}).get("pip_freeze_sha256")))
    if len({f for f in fingerprints if f[0]}) > 1:
        raise SystemExit("error: the shards were graded with different tests or environments; regrade them alike")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header or [])
    for name in sorted(rows):
        w.writerow(rows[name])
    (out / "grades.csv").write_text(buf.getvalue())
    merged = {"shards": len(summaries), "submissions": len(rows),
              "graded": sum(s.get("graded", 0) for s in summaries),
              "failed_to_grade": sum(s.get("failed_to_grade", 0) for s in summaries),
              "rejected": sum(s.get("rejected", 0) for s in summaries),
              "sandbox": sorted({s.get("sandbox", "?") for s in summaries})}
    (out / "summary.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return out / "grades.csv"


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        ap = argparse.ArgumentParser(prog="python -m instructor.batch merge",
                                     description="Join the grades of several --shard runs.")
        ap.add_argument("shards", nargs="+", type=Path, help="the --out folders of the shards")
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args(argv[1:])
        print(merge(a.shards, a.out))
        return 0
    ap = argparse.ArgumentParser(prog="python -m instructor.batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("submissions", type=Path, help="folder with one entry (folder or .zip) per submission")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "autograde")
    ap.add_argument("--jobs", type=int, default=None,
                    help="judges in parallel (default: one per core; 0: grade in this process, for debugging)")
    ap.add_argument("--shard", type=parse_shard, default=None, help="grade only shard i of n (1-based), e.g. 3/8")
    ap.add_argument("--parts", default=None, help="comma-separated part numbers (default: all)")
    ap.add_argument("--sets", default="public,hidden", help="test sets (default: public,hidden)")
    ap.add_argument("--sandbox", choices=["auto", "bubblewrap", "uid", "rlimits", "off"], default="auto",
                    help="auto: bubblewrap if it passes its self-test, else the unprivileged-uid sandbox; "
                         "grading refuses when neither is available, unless --allow-weak-sandbox")
    ap.add_argument("--allow-weak-sandbox", action="store_true",
                    help="accept a sandbox weaker than asked (rlimits only, or off) instead of refusing")
    ap.add_argument("--fixed-time-limits", action="store_true",
                    help="do not scale each call's time limit from the reference's own time")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per submission before it is stopped")
    ap.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                    help="engine limit override, e.g. call_timeout_s=5 or memory_mb=2048 (repeatable)")
    ap.add_argument("--tests-dir", default=None, help="another assignment-tests folder (default: autograder/tests)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    limits = {}
    for item in a.limit:
        key, _, value = item.partition("=")
        try:
            limits[key] = float(value) if "." in value else int(value)
        except ValueError:
            ap.error(f"--limit {item}: expected KEY=NUMBER")
    parts = [int(x) for x in a.parts.split(",")] if a.parts else None
    options = Options(parts=parts, test_sets=tuple(s for s in a.sets.split(",") if s), limits=limits,
                      tests_dir=a.tests_dir, scale_timeouts=not a.fixed_time_limits)
    summary = run_batch(a.submissions, a.out, jobs=a.jobs, shard=a.shard, options=options, timeout_s=a.timeout,
                        progress=not a.quiet, sandbox=a.sandbox, allow_weak=a.allow_weak_sandbox)
    print_summary(summary, a.out)
    return 0 if summary["failed_to_grade"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
