"""Batch autograder: grade a folder of submissions with the public AND hidden tests, sandboxed.

    python -m instructor.batch SUBMISSIONS --out DIR [--jobs N] [--shard i/n] [--parts 1,2]
    python -m instructor.batch merge DIR1 DIR2 ... --out DIR      (join the shards' results)

Each entry of SUBMISSIONS (a folder or a .zip) is one student, graded by instructor.grading.grade_one
(the function every channel calls) in one of `--jobs` judge processes: intake (instructor/intake.py)
copies only the graded files into a private temp folder; the engine (autograder.engine.grade, the
same one `make grade` uses) grades that copy, the student code in worker processes inside the
sandbox (instructor/sandbox.py); the result comes back to this process on the judge's pipe, and
this process only renders it. One row per entry, always, with a reason on every row that is not
"graded". Writes:

    DIR/grades.csv                  one row per submission: source (the upload), status, parts, total
    DIR/<student>/feedback.md       what `make grade` shows, hidden tests named but not revealed
    DIR/<student>/feedback.json     the same as JSON (+ intake notes, hashes, sandbox mode)
    DIR/<student>/results.json      Gradescope's results format
    DIR/summary.json                graded / failed to grade / time, sandbox, environment hashes

Regrading the same folder gives the same grades.csv byte for byte (no times in it; rows sorted).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from autograder.engine import sanitize
from autograder.engine.runner import student_view  # noqa: F401 -- re-exported (tests, tools)

from . import intake
from .grading import (DEFAULT_GRADER, UID_BASE, Graded, Options, environment, failed, grade_one,  # noqa: F401
                      resolve, run_engine, sandbox_info, sweep, write_outputs)
from .sandbox import SandboxError, require

ROOT = Path(__file__).resolve().parent.parent
RESERVED = {"grades.csv", "summary.json"}


# ---------------------------------------------------------------------------------------------
# judges: long-lived processes that import the engine once and grade one submission at a time


@dataclass
class Task:
    name: str
    entry: str  # the submission as uploaded (folder or .zip)
    work: str  # a fresh folder for its intake copy


def _judge_main(conn, slot: int, options: Options) -> None:
    """A judge process: receives Tasks, grades each with grade_one (intake, engine, view) and sends
    the result back on its pipe: the result never passes through a file that a worker could write.
    Before the Tasks it may get ("calibrate", parts): grade the reference on those parts and send
    back its longest call per target, then ("limits", call_timeouts) for every later Task."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    grade = resolve(options.grader)
    env = environment()
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        if type(task) is tuple and task[0] == "limits":
            options.limits = {**(options.limits or {}), "call_timeouts": task[1]}
            continue
        if type(task) is tuple and task[0] == "calibrate":
            try:
                conn.send(("ok", reference_call_times(replace(options, parts=task[1]), slot, grade)))
            except BaseException as e:  # noqa: BLE001 -- no scaling then (the batch decides)
                conn.send(("error", sanitize.line(f"{type(e).__name__}: {e}", 300)))
            continue
        t0 = time.perf_counter()
        try:
            graded = grade_one(Path(task.entry), Path(task.work), options, name=task.name, slot=slot, env=env,
                               grade=grade)
            conn.send(("ok", graded.to_json(), time.perf_counter() - t0))
        except BaseException as e:  # noqa: BLE001 -- a grading failure must not stop the batch
            conn.send(("error", sanitize.line(f"{type(e).__name__}: {e}", 300), traceback.format_exc()[-3000:]))


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
    name: str  # unique, folder-safe student id
    path: Path
    source: str  # the entry's name as uploaded, printable (maps the id back to the upload)


def list_entries(folder: Path) -> list[Entry]:
    """Submissions in `folder`, sorted, with unique folder-safe names (alice, alice-2, ...).
    Names are unique whatever the uploads are called: `dup/`, `dup-2/` and `dup.zip` become
    dup, dup-2 and dup-3."""
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is not a folder; pass the folder that holds one entry per submission")
    out = []
    paths = sorted((p for p in folder.iterdir() if not p.name.startswith(".")),
                   key=lambda p: os.fsencode(p.name))
    bases = {p: _base_name(p) for p in paths}
    # names that are already unique keep them; the others get the first free -k suffix, in order
    counts: dict[str, int] = {}
    for base in bases.values():
        counts[base] = counts.get(base, 0) + 1
    taken = {b for b, n in counts.items() if n == 1}
    for p in paths:
        base = bases[p]
        name = base
        if counts[base] > 1:
            k = 1
            while name in taken:
                k += 1
                name = f"{base}-{k}"
        taken.add(name)
        out.append(Entry(name, p, sanitize.name(p.name, 300)))
    return out


def _base_name(p: Path) -> str:
    base = intake.student_name(p)
    if base.lower() in RESERVED:  # would collide with the batch's own files in --out
        base += "-student"
    return base


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
    """Grade every entry of `submissions` (or one shard of them) into `out`. Returns the summary.
    One row per entry, always: a submission that breaks its judge is a row "failed to grade".
    The sandbox mode asked for must be available, or the batch refuses (choose_sandbox)."""
    t_start = time.perf_counter()
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    if out == submissions or out.is_relative_to(submissions):
        raise SystemExit("error: the output folder must not be inside the submissions folder; choose another --out")
    options = options or Options()
    info = choose_sandbox(options, sandbox, allow_weak)
    entries = shard_of(list_entries(submissions), shard)
    inline = jobs == 0  # grade in this process, one at a time (debugging; tests)
    jobs = 1 if inline else max(1, min(jobs or os.cpu_count() or 1, len(entries) or 1))
    out.mkdir(parents=True, exist_ok=True)
    if options.sandbox is not None and options.sandbox.kind == "uid":
        os.chmod(out, out.stat().st_mode & 0o770)  # the results: closed to the sandbox's uids
    calibrate = bool(entries) and options.scale_timeouts and options.grader == DEFAULT_GRADER
    if calibrate and (inline or jobs == 1):
        info["call_time_limits"] = scaled_call_timeouts(options)
    env = environment()
    work = Path(tempfile.mkdtemp(prefix="autograde-"))  # intake copies: never in the instructor's tree
    results: dict[str, Graded] = {}
    try:
        if inline:
            grade = resolve(options.grader)
            for e in entries:
                t0 = time.perf_counter()
                try:
                    graded = grade_one(e.path, work / e.name, options, name=e.name, env=env, grade=grade)
                except Exception as ex:  # noqa: BLE001 -- as a dead judge would: a row, not a crash
                    graded = failed(e.path, work / e.name, options, e.name, f"{type(ex).__name__}: {ex}",
                                    traceback.format_exc(), env, time.perf_counter() - t0)
                results[e.name] = _finish(out, e, graded)
        else:
            _grade_all(entries, work, out, jobs, options, timeout_s, progress, results, env,
                       info if calibrate and jobs > 1 else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _write_summary(out, entries, results, time.perf_counter() - t_start, jobs, shard, info, env, options)


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
    if options.sandbox is None and not allow_weak and options.grader == DEFAULT_GRADER:
        raise SystemExit("error: refusing to grade with --sandbox off (no sandbox at all); "
                         "pass --allow-weak-sandbox to accept that (debugging only)")
    return sandbox_info(options)


def reference_call_times(options: Options, slot: int = 0, grade: Callable | None = None) -> dict[str, float]:
    """Grade the reference (solutions/) on options' parts and test sets, in options' sandbox as judge
    `slot`'s uid: {call target: its longest call in seconds}. Raises when grading fails."""
    report = run_engine(ROOT / "solutions", options, slot, grade)
    longest = report.get("timing", {}).get("longest_call_s")
    if not isinstance(longest, dict):
        raise RuntimeError("the grader's report gives no call times")
    return {str(t): float(v) for t, v in longest.items()}


def call_time_limits(longest: dict[str, float], options: Options, t0: float, factor: float = TIMEOUT_FACTOR,
                     floor: float = TIMEOUT_FLOOR_S) -> dict:
    """Limit every call target to max(floor, factor x the reference's longest call to it) seconds
    (capped by the configured limit in the engine): a hanging submission then costs seconds per call,
    not the 20 s default. Sets options.limits["call_timeouts"]; returns what the summary records."""
    limits = {t: round(max(floor, factor * s), 2) for t, s in sorted(longest.items())}
    options.limits = {**(options.limits or {}), "call_timeouts": limits}
    return {"scaled": True, "factor": factor, "floor_s": floor, "targets": len(limits),
            "at_floor": sum(v == floor for v in limits.values()), "calibration_s": round(time.perf_counter() - t0, 2),
            "limits_s": limits}


def _not_scaled(e: BaseException | str) -> dict:
    why = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    return {"scaled": False, "reason": sanitize.line(f"grading the reference failed: {why}", 300)}


def scaled_call_timeouts(options: Options) -> dict:
    """Measure the reference's call times in this process (one part after the other) and scale the
    limits from them (call_time_limits). A batch with several judges measures in the judges instead,
    each on some of the parts (_calibrate_in_judges)."""
    t0 = time.perf_counter()
    try:
        longest = reference_call_times(options)
    except Exception as e:  # noqa: BLE001 -- no scaling then: the configured limits hold
        return _not_scaled(e)
    return call_time_limits(longest, options, t0)


def _calibrate_in_judges(judges: list["Judge"], options: Options, timeout_s: float) -> dict:
    """scaled_call_timeouts, with the parts shared out among the judges (the costliest first, each to
    the judge with the least so far), so that calibrating takes the slowest share, not the sum. Every
    judge then gets the limits."""
    from autograder.engine.rubric import load_rubric

    t0 = time.perf_counter()
    rubric = load_rubric()
    numbers = options.parts or rubric.numbers
    shares: list[list[int]] = [[] for _ in judges]
    load = [0.0] * len(judges)
    for n in sorted(numbers, key=lambda n: -rubric.part(n).cost):
        i = load.index(min(load))
        shares[i].append(n)
        load[i] += rubric.part(n).cost
    asked = [(j, share) for j, share in zip(judges, shares) if share]
    for j, share in asked:
        j.conn.send(("calibrate", sorted(share)))
    longest: dict[str, float] = {}
    failure = None
    for j, _ in asked:
        try:
            reply = j.conn.recv() if j.conn.poll(timeout_s) else ("error", "it took too long")
        except (EOFError, OSError):
            reply = ("error", "its judge process died")
        if reply[0] != "ok":
            failure = failure or reply[1]
            continue
        for t, v in reply[1].items():
            longest[t] = max(longest.get(t, 0.0), v)
    if failure is not None:
        return _not_scaled(failure)
    info = call_time_limits(longest, options, t0)
    for j in judges:
        try:
            j.conn.send(("limits", options.limits["call_timeouts"]))
        except OSError:  # a dead judge: _grade_all replaces it (with options, which hold the limits)
            pass
    return info


def _grade_all(entries: list[Entry], work: Path, out: Path, jobs: int, options: Options, timeout_s: float,
               progress: bool, results: dict, env: dict, calibrate_into: dict | None = None) -> None:
    """Grade `entries` in `jobs` judges. calibrate_into: first scale the call time limits in the
    judges (_calibrate_in_judges) and record how into this dict (the summary's info)."""
    if not entries:
        return
    ctx = mp.get_context("spawn")  # a clean interpreter per judge; never fork a process with threads
    judges: list[Judge] = []
    queue = list(entries)
    by_name = {e.name: e for e in entries}
    bar = _Progress(len(entries), progress)
    try:
        judges = [Judge(ctx, slot, options) for slot in range(min(jobs, len(entries)))]
        if calibrate_into is not None:
            calibrate_into["call_time_limits"] = _calibrate_in_judges(judges, options, timeout_s)
            for i, j in enumerate(judges):  # one that died calibrating grades nothing: a fresh one does
                if not j.proc.is_alive():
                    j.kill()
                    judges[i] = Judge(ctx, j.slot, options)
        idle = list(judges)
        busy: list[Judge] = []
        while queue or busy:
            while idle and queue:
                j = idle.pop(0)
                e = queue.pop(0)
                j.submit(Task(e.name, str(e.path), str(work / e.name)), timeout_s)
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
                e = by_name[task.name]
                elapsed = now - j.started
                if replace:  # a judge that died or hung is replaced (its workers die with it)
                    j.kill()
                    judges.remove(j)
                    j = Judge(ctx, j.slot, options)
                    judges.append(j)
                if outcome[0] == "ok":
                    graded = Graded.from_json(outcome[1])
                    graded.elapsed_s = elapsed
                else:
                    graded = failed(e.path, work / e.name, options, e.name, outcome[1], outcome[2], env, elapsed)
                results[e.name] = _finish(out, e, graded)
                bar.advance(e.name, graded.status != "failed to grade")
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
                              TextColumn("{task.fields[last]}", markup=False), console=Console(stderr=True))
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


def _finish(out: Path, e: Entry, graded: Graded) -> Graded:
    """Write one student's folder (grading.write_outputs); the entry's upload name is its source."""
    graded.name, graded.source = e.name, e.source
    graded.view["student"] = e.name
    write_outputs(out / e.name, graded)
    return graded


CSV_HEAD = ["student", "source", "status"]


def write_grades_csv(path: Path, rows: list[Graded]) -> None:
    """grades.csv: student, source (the upload it came from), status, part1..partN, total, max_total,
    submission_sha256, reason (why a row is not "graded"; never empty then). Sorted by student."""
    parts = sorted({p["part"] for r in rows for p in r.view["parts"]})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*CSV_HEAD, *[f"part{n}" for n in parts], "total", "max_total", "submission_sha256", "reason"])
    for r in sorted(rows, key=lambda r: r.name):
        by = {p["part"]: p["points"] for p in r.view["parts"]}
        failed_ = r.status == "failed to grade"
        w.writerow([r.name, _cell(r.source), r.status, *["" if failed_ else f"{by.get(n, 0):g}" for n in parts],
                    "" if failed_ else f"{r.view['total']:g}", f"{r.view['max_total']:g}",
                    r.view.get("intake", {}).get("sha256", ""), sanitize.line(r.reason, 300)])
    path.write_text(buf.getvalue(), encoding="utf-8")


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet shows as text: one that starts like a formula gets a leading quote."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _write_summary(out: Path, entries: list[Entry], results: dict, wall: float, jobs: int, shard, info: dict,
                   env: dict, options: Options) -> dict:
    rows = [results[e.name] for e in entries if e.name in results]
    write_grades_csv(out / "grades.csv", rows)
    counts = {s: sum(r.status == s for r in rows) for s in ("graded", "failed to grade", "rejected")}
    hashes = [r.view.get("hashes", {}) for r in rows]
    summary = {
        "submissions": len(rows), "graded": counts["graded"], "failed_to_grade": counts["failed to grade"],
        "rejected": counts["rejected"], "wall_s": round(wall, 2), "jobs": jobs,
        "submissions_per_minute": round(60 * len(rows) / wall, 2) if wall > 0 else None,
        "shard": list(shard) if shard else None, "test_sets": list(options.test_sets), "parts": options.parts,
        **info, "environment": env,
        # the mode string of each feedback (bubblewrap: were its workers forked inside the sandbox?)
        "sandbox_used": {m: sum(str(r.view.get("sandbox")) == m for r in rows)
                         for m in sorted({str(r.view.get("sandbox")) for r in rows})},
        "tests_sha256": sorted({h.get("tests") for h in hashes if h.get("tests")}),
        "failed": {r.name: r.reason for r in rows if r.status == "failed to grade"},
        "per_submission_s": {r.name: round(r.elapsed_s, 2) for r in rows if r.elapsed_s},
        "engine_timing": {r.name: r.timing for r in rows if r.timing},  # worker starts, call time
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


def print_summary(summary: dict, out: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="autograde summary", show_header=False)
    t.add_row("submissions", str(summary["submissions"]))
    t.add_row("graded", str(summary["graded"]))
    t.add_row("failed to grade", str(summary["failed_to_grade"]))
    t.add_row("rejected at intake", str(summary["rejected"]))
    t.add_row("time", f"{summary['wall_s']:.1f} s with {summary['jobs']} judge(s)"
              f" ({summary['submissions_per_minute']} submissions/minute)")
    t.add_row("sandbox", escape(summary["sandbox"]))
    t.add_row("process limit", escape(summary["process_limit"]))
    t.add_row("grades", escape(str(out / "grades.csv")))
    Console(stderr=True).print(t)
    for name, why in summary["failed"].items():
        Console(stderr=True).print(f"[red]failed to grade[/red] {escape(name)}: {escape(why)} "
                                   f"(see {escape(str(out / name / 'grading-error.txt'))})")


# ---------------------------------------------------------------------------------------------
# merge (shards -> one folder)


def _check_shards(dirs: list[Path], summaries: list[dict]) -> None:
    """Refuse anything but a complete set of shards 1/n .. n/n, each once (names the missing ones)."""
    given = [s.get("shard") for s in summaries]
    if any(g is None for g in given):
        if len(dirs) > 1:
            d = dirs[given.index(None)]
            raise SystemExit(f"error: {d} was not graded with --shard i/n; merge joins the shards of one run")
        return
    ns = {g[1] for g in given}
    if len(ns) > 1:
        raise SystemExit(f"error: the shards were cut differently (--shard i/{' and i/'.join(map(str, sorted(ns)))}); "
                         "merge the shards of one run")
    n = ns.pop()
    seen: dict[int, Path] = {}
    for d, (i, _) in zip(dirs, given):
        if i in seen:
            raise SystemExit(f"error: shard {i}/{n} appears twice ({seen[i]} and {d}); did two shards get the same "
                             "--shard i/n?")
        seen[i] = d
    missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in seen]
    if missing:
        raise SystemExit(f"error: missing shard(s) {', '.join(missing)} of {n}; grade them (--shard) and pass all "
                         f"{n} --out folders")


def merge(shard_dirs: Sequence[Path], out: Path) -> Path:
    """Join shard outputs: copies each student's folder into `out` and writes one grades.csv.
    Refuses an incomplete or repeated set of shards, and shards graded with different tests or
    environments (their grades would not compare)."""
    dirs = [Path(d) for d in shard_dirs]
    summaries = []
    for d in dirs:
        if not (d / "grades.csv").is_file() or not (d / "summary.json").is_file():
            raise SystemExit(f"error: {d} has no grades.csv and summary.json; pass the --out folders of the shards")
        summaries.append(json.loads((d / "summary.json").read_text()))
    _check_shards(dirs, summaries)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    header: list[str] | None = None
    rows: dict[str, list[str]] = {}
    fingerprints = set()
    for d, s in zip(dirs, summaries):
        csv_path = d / "grades.csv"
        with csv_path.open(newline="", encoding="utf-8") as f:
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
        fingerprints.add((tuple(s.get("tests_sha256", [])), s.get("environment", {}).get("pip_freeze_sha256")))
    if len({f for f in fingerprints if f[0]}) > 1:
        raise SystemExit("error: the shards were graded with different tests or environments; regrade them alike")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header or [])
    for name in sorted(rows):
        w.writerow(rows[name])
    (out / "grades.csv").write_text(buf.getvalue(), encoding="utf-8")
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
