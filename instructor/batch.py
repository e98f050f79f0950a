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
    DIR/<student>/results.json      Gradescope's results format (failed to grade: "not graded, will regrade")
    DIR/_instructor/<student>/grading-error.txt   the instructor's only: why grading failed
    DIR/_instructor/written.json    the student folders batch runs wrote into DIR (replaced on a rerun)
    DIR/summary.json                graded / failed to grade / time, sandbox, environment hashes

Regrading the same folder gives the same grades.csv byte for byte (no times in it; rows sorted),
as long as the submissions themselves are deterministic.

Before grading anyone, the batch checks its own set-up: the options (parts, test sets, limits,
folders) up front, then that the reference (solutions/) scores full marks with them.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import itertools
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from autograder.engine import memory, sanitize
from autograder.grade import Parser, UsageError, positive_int, run_cli, writable_folder
from autograder.engine.limits import CALIBRATED, Limits, check_overrides
from autograder.engine.reuse import PartResults
from autograder.engine.runner import DEFAULT_HIDDEN_DIR, DEFAULT_TESTS_DIR, TEST_SETS
from autograder.engine.runner import student_view  # noqa: F401 -- re-exported (tests, tools)

from . import intake
from .grading import (DEFAULT_GRADER, STATUSES, UID_BASE, Graded, Options, environment, failed,  # noqa: F401
                      grade_one, resolve, run_engine, sandbox_info, seed_reuse, share_results, sweep,
                      take_new_results, write_outputs)
from .sandbox import SandboxError, require

ROOT = Path(__file__).resolve().parent.parent
RESERVED = {"grades.csv", "summary.json"}
# Instructor-only material under --out, apart from the student folders (which are handed out whole):
# PRIVATE/<student>/grading-error.txt, and the manifest of the student folders batch runs wrote there.
# No student id starts with "_" (SAFE_ID), so no student folder is ever this one.
PRIVATE = "_instructor"
MANIFEST = "written.json"
STUDENT_FILES = ("feedback.md", "feedback.json", "results.json")  # what the batch writes in a student's folder
PRIVATE_FILES = ("grading-error.txt",)  # ... and in PRIVATE/<student>/
OLD_STUDENT_FILES = ("grading-error.txt",)  # what earlier versions also wrote in a student's folder
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")  # what intake.student_name makes (and merge accepts)
HIDDEN_REASON = "hidden entry (its name starts with a dot): not graded"


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
    back its longest call per target and its time per part, then ("limits", {"call_timeouts": ...,
    "part_budgets": ...}) for every later Task."""
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
            options.limits = {**(options.limits or {}), **task[1]}
            continue
        if type(task) is tuple and task[0] == "seed":  # the reference's parts, under the limits just set
            try:
                seed_reuse(options, task[1], ROOT / "solutions")
            except Exception:  # noqa: BLE001 -- reuse saves time; without it every part is graded
                pass
            continue
        if type(task) is tuple and task[0] == "share":  # what the other judges graded
            share_results(task[1])
            continue
        if type(task) is tuple and task[0] == "calibrate":
            try:
                conn.send(("ok", *reference_run(replace(options, parts=task[1]), slot, grade)))
            except BaseException as e:  # noqa: BLE001 -- no scaling then (the batch decides)
                conn.send(("error", sanitize.line(f"{type(e).__name__}: {e}", 300)))
            continue
        t0 = time.perf_counter()
        try:
            graded = grade_one(Path(task.entry), Path(task.work), options, name=task.name, slot=slot, env=env,
                               grade=grade)
            # A judge still over its memory bound after the grade gave back what it could (a replay or a
            # reply of this submission left it there, engine/memory.py) asks to be replaced: the next
            # submission starts in a fresh one instead of inheriting that memory.
            memory.set_bound(Limits().updated(**(options.limits or {})).judge_memory_mb)
            retire = memory.over_bound() is not None
            conn.send(("ok", graded.to_json(), time.perf_counter() - t0, take_new_results(), retire))
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

    def send_quietly(self, message: tuple) -> None:
        """A message between submissions (limits, results to reuse): a judge that died is replaced
        when its next submission finds it dead."""
        try:
            self.conn.send(message)
        except OSError:
            pass

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
    dup, dup-2 and dup-3.
    Ids are unique ignoring case too (`Alice/` and `alice.zip` become Alice and alice-2): --out may
    be on a case-insensitive file system. Hidden entries (a name starting with a dot: .DS_Store, .git)
    are not submissions: see hidden_entries."""
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is not a folder; pass the folder that holds one entry per submission")
    out = []
    paths = sorted((p for p in folder.iterdir() if not p.name.startswith(".")),
                   key=lambda p: os.fsencode(p.name))
    bases = {p: _base_name(p) for p in paths}
    # names that are already unique keep them; the others get the first free -k suffix, in order
    counts: dict[str, int] = {}
    for base in bases.values():
        counts[base.lower()] = counts.get(base.lower(), 0) + 1
    taken = {b for b, n in counts.items() if n == 1}
    for p in paths:
        base = bases[p]
        name = base
        if counts[base.lower()] > 1:
            k = 1
            while name.lower() in taken:
                k += 1
                name = f"{base}-{k}"
        taken.add(name.lower())
        out.append(Entry(name, p, sanitize.name(p.name, 300)))
    return out


def hidden_entries(folder: Path) -> list[str]:
    """The entries list_entries leaves out (names starting with a dot), printable and sorted: the
    summary and stderr list them, so that nothing in SUBMISSIONS is left out silently."""
    return sorted(sanitize.name(p.name, 300) for p in folder.iterdir() if p.name.startswith("."))


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
    """--shard i/n as (i, n), or an argparse error saying what is wrong."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes i/n, e.g. 2/8, not {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--shard {text}: need 1 <= i <= n")
    return i, n


def check_setup(submissions: Path, out: Path, jobs: int | None, options: Options, timeout_s: float) -> None:
    """Refuse options that cannot grade anyone fairly, in one line each (SystemExit), before any
    judge starts or any file is written: the folders, the judges, the time limit, the parts and test
    sets (against the rubric), the limit overrides (known keys, sensible values), the tests folder."""
    from autograder.engine.rubric import load_rubric

    def no(msg: str) -> None:
        raise SystemExit(f"error: {msg}")

    if out.exists() and not out.is_dir():
        no(f"--out {out} is a file; pass a folder (it is created if missing)")
    try:  # before anyone is graded: a batch that cannot write its results grades nobody
        writable_folder(out, "--out")
    except UsageError as e:
        no(str(e))
    if out == submissions or out.is_relative_to(submissions):
        no("the output folder must not be inside the submissions folder; choose another --out")
    if submissions.is_relative_to(out):
        no("the submissions folder must not be inside the output folder (a student's folder could take its "
           "place); choose another --out")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0):
        no(f"--jobs must be a positive number of judges, not {jobs!r}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        no(f"--timeout must be a positive number of seconds, not {timeout_s!r}")
    numbers = load_rubric().numbers
    if options.parts is not None:
        bad = [n for n in options.parts if n not in numbers]
        if not options.parts or bad or len(set(options.parts)) != len(options.parts):
            no(f"--parts {','.join(map(str, options.parts)) or '(none)'}: give distinct part numbers of the rubric, "
               f"comma-separated ({','.join(map(str, numbers))})")
    bad_sets = [t for t in options.test_sets if t not in TEST_SETS]
    if not options.test_sets or bad_sets or len(set(options.test_sets)) != len(options.test_sets):
        no(f"--sets {','.join(options.test_sets) or '(none)'}: give distinct test sets among {','.join(TEST_SETS)}")
    try:
        check_overrides({k: v for k, v in (options.limits or {}).items() if k not in CALIBRATED})
    except ValueError as e:
        no(f"--limit: {e}")
    if options.tests_dir is not None and not Path(options.tests_dir).is_dir():
        no(f"--tests-dir {options.tests_dir} is not a folder; pass the assignment's tests folder")


def run_batch(submissions: Path, out: Path, *, jobs: int | None = None, shard: tuple[int, int] | None = None,
              options: Options | None = None, timeout_s: float = 1800.0, progress: bool = True,
              sandbox: str = "auto", allow_weak: bool = False) -> dict:
    """Grade every entry of `submissions` (or one shard of them) into `out`. Returns the summary.
    One row per entry, always: a submission that breaks its judge is a row "failed to grade".
    The sandbox mode asked for must be available, or the batch refuses (choose_sandbox); so must
    the options (check_setup), and the reference must score full marks with them (check_reference).
    jobs=0 grades in this process (debugging, tests; the command line needs at least 1)."""
    t_start = time.perf_counter()
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    options = options or Options()
    check_setup(submissions, out, jobs, options, timeout_s)
    everyone = list_entries(submissions)  # a wrong folder is named before the machine's sandbox
    info = choose_sandbox(options, sandbox, allow_weak)
    entries = shard_of(everyone, shard)
    created = not out.exists()
    claim = claim_out(out)  # one batch at a time per --out: another one's files are not ours to judge
    try:
        return _run_claimed(submissions, out, jobs, shard, options, timeout_s, progress, everyone, entries, info,
                            t_start)
    except SystemExit:  # refused before anyone was graded: leave no empty --out
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        os.close(claim)


def claim_out(out: Path) -> int:
    """Create `out` if need be and lock it (flock on the folder, released when the returned descriptor
    is closed or the process ends): a second batch into the same --out while one runs would mix its
    folders with the first's, which neither run's record then accounts for. SystemExit in one line."""
    import fcntl

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise SystemExit(f"error: --out {out} cannot be used ({e.strerror or e}); choose another folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SystemExit(f"error: another batch is writing into --out {out} now; wait for it to finish, "
                         "or choose another --out") from None
    return fd


def _run_claimed(submissions: Path, out: Path, jobs: int | None, shard: tuple[int, int] | None, options: Options,
                 timeout_s: float, progress: bool, everyone: list, entries: list, info: dict,
                 t_start: float) -> dict:
    """run_batch once --out is this run's (claim_out)."""
    previous = previous_outputs(out)  # before anyone is graded: refuse an --out we cannot account for
    check_out_folders(out, [e.name for e in entries], previous)
    inline = jobs == 0  # grade in this process, one at a time (debugging; tests)
    jobs = 1 if inline else max(1, min(jobs or os.cpu_count() or 1, len(entries) or 1))
    calibrate = bool(entries) and options.scale_timeouts and options.grader == DEFAULT_GRADER
    if entries and not calibrate:  # the check calibrating would have made
        info["reference"] = check_reference(reference_score(options), options)
    seeds: list[dict] = []  # the reference's part results, for the judges' stores (grading.seed_reuse)
    if calibrate and (inline or jobs == 1):
        info["call_time_limits"] = scaled_call_timeouts(options)  # inline: seeds this process's store
        info["reference"] = check_reference(info["call_time_limits"].pop("reference"), options)
        seeds = info["call_time_limits"].pop("seeds", [])
    if options.sandbox is not None and options.sandbox.kind == "uid":
        os.chmod(out, out.stat().st_mode & 0o770)  # the results: closed to the sandbox's uids
    env = environment()
    work = Path(tempfile.mkdtemp(prefix="autograde-"))  # intake copies: never in the instructor's tree
    results: dict[str, Graded] = {}
    info["judges_replaced"] = {}  # by why: died, hung, memory (over its bound after a grade)

    def prepare() -> None:  # once the set-up is checked, before the first student folder is written
        clear_previous(out, previous, {e.name for e in entries})

    try:
        if inline or not entries:
            prepare()
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
                       info if calibrate and jobs > 1 else None, prepare, seeds, info["judges_replaced"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _write_summary(out, everyone, entries, results, time.perf_counter() - t_start, jobs, shard, info, env,
                          options, hidden_entries(submissions))


# ---------------------------------------------------------------------------------------------
# sandbox mode (fail closed) and call time limits scaled from the reference

# A call may take this many times the reference's own time for it (measured once per batch, in the
# same sandbox, on this machine), but never less than the floor, nor more than the configured limit.
# Generous on purpose: a correct but slow algorithm (Python loops where the reference uses tensor
# ops) must still pass; what the scaling removes is the 20 s wait on calls that take milliseconds.
TIMEOUT_FACTOR = 50.0
TIMEOUT_FLOOR_S = 5.0
# A part (its tests, diagnoses and the judge's checks of its calls together) may take this many times the
# reference's own time for it, and at least the floor: calls that each stay under their limit (a sleep just
# below it in every call, dead ops the judge must replay) would otherwise cost the batch up to the
# submission's whole timeout. The slowest correct variants measured (instructor/equivalents and an outside
# tester's 23) take 16 and 12 times the reference's time for their part (a per-key online update and
# row-vector matmuls in part 2: one op per key or row, each replayed by the judge): 50 leaves them 3x.
PART_BUDGET_FACTOR = 50.0
PART_BUDGET_FLOOR_S = 60.0


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


def _score(report: dict) -> dict:
    """What check_reference needs of a report: points, max points, tests run, the first error."""
    errors = report.get("errors") or []
    return {"points": float(report.get("total") or 0), "max_points": float(report.get("max_total") or 0),
            "tests": len(report.get("tests") or []), "first_error": sanitize.line(errors[0], 200) if errors else ""}


def reference_run(options: Options, slot: int = 0,
                  grade: Callable | None = None) -> tuple[dict[str, float], dict, list[dict], dict[str, float]]:
    """Grade the reference (solutions/) on options' parts and test sets, in options' sandbox as judge
    `slot`'s uid: ({call target: its longest call in seconds}, its score, its parts' results for the
    batch's store: grading.seed_reuse, none with --no-reuse, {part: its wall time in seconds}). Raises
    when grading fails.
    Never a reused result: it measures the calls' times, and checks the set-up afresh (an empty store)."""
    store = PartResults() if options.reuse else None
    with _reference_taken(options) as folder:
        report = run_engine(folder, replace(options, reuse=False), slot, grade, store=store)
    longest = report.get("timing", {}).get("longest_call_s")
    if not isinstance(longest, dict):
        raise RuntimeError("the grader's report gives no call times")
    part_s = report.get("timing", {}).get("part_s")
    part_s = {str(p): float(t) for p, t in part_s.items()} if isinstance(part_s, dict) else {}
    return ({str(t): float(v) for t, v in longest.items()}, _score(report), store.entries() if store else [],
            part_s)


@contextlib.contextmanager
def _reference_taken(options: Options):
    """solutions/ as a student's upload of it reaches the engine: through the intake, for options' parts
    (intake.take_for_parts). The reference check then covers the intake too: an intake that left out a
    file some part needs (flash_forward.py, which part 4 imports) failed every student, the reference
    check none."""
    with tempfile.TemporaryDirectory(prefix="reference-") as tmp:
        taken = intake.take_for_parts(ROOT / "solutions", Path(tmp) / "files", options.parts)
        if taken.error or taken.dir is None:
            raise RuntimeError(f"the intake refused solutions/: {taken.error or 'no graded file taken'}")
        yield taken.dir


def reference_call_times(options: Options, slot: int = 0, grade: Callable | None = None) -> dict[str, float]:
    """reference_run's call times only."""
    return reference_run(options, slot, grade)[0]


def reference_score(options: Options) -> dict:
    """The reference's score with `options`, graded in this process: for a batch that does not
    calibrate (fixed limits, another grader), so that its set-up is checked all the same."""
    try:
        with _reference_taken(options) as folder:
            return _score(run_engine(folder, replace(options, reuse=False)))
    except Exception as e:  # noqa: BLE001 -- check_reference refuses, naming it
        return {"error": sanitize.line(f"{type(e).__name__}: {e}", 300)}


def _options_text(options: Options) -> str:
    overrides = {k: v for k, v in (options.limits or {}).items() if k not in CALIBRATED}
    return (f"parts {','.join(map(str, options.parts)) if options.parts else 'all'}; "
            f"sets {','.join(options.test_sets) or '(none)'}; tests {options.tests_dir or 'autograder/tests'}; "
            f"limits {', '.join(f'{k}={v}' for k, v in sorted(overrides.items())) or 'the rubric'}"
            f"{'; fixed time limits' if not options.scale_timeouts else ''}")


def check_reference(score: dict, options: Options) -> dict:
    """The batch's own set-up, checked before it grades anyone: the reference must score full marks
    on the parts and test sets graded, with the limits given; else every student would lose points
    for the instructor's mistake (a wrong --tests-dir, --sets, --limit). Refuses in one line
    (SystemExit); returns the score for the summary."""
    if "error" in score:
        raise SystemExit(f"error: grading the reference solutions failed with these options ({_options_text(options)})"
                         f": {score['error']}; fix the options before grading students")
    if score["tests"] == 0 or score["max_points"] <= 0 or score["points"] < score["max_points"] - 1e-6:
        why = f" (first error: {score['first_error']})" if score.get("first_error") else ""
        raise SystemExit(f"error: the reference solutions score {score['points']:g}/{score['max_points']:g} "
                         f"({score['tests']} tests run) with these options: {_options_text(options)}{why}; "
                         "fix the options (or the tests) before grading students")
    return score


def call_time_limits(longest: dict[str, float], options: Options, t0: float, factor: float = TIMEOUT_FACTOR,
                     floor: float = TIMEOUT_FLOOR_S, part_s: dict[str, float] | None = None) -> dict:
    """Limit every call target to max(floor, factor x the reference's longest call to it) seconds
    (capped by the configured limit in the engine): a hanging submission then costs seconds per call,
    not the 20 s default. With the reference's time per part (`part_s`), every part also gets a budget
    of max(PART_BUDGET_FLOOR_S, PART_BUDGET_FACTOR x that time) for its tests, diagnoses and their checks
    (Limits.part_budgets): calls that each stay under their limit cannot add up to the submission's
    whole timeout. Sets options.limits["call_timeouts"] (and "part_budgets"); returns what the summary
    records."""
    limits = {t: round(max(floor, factor * s), 2) for t, s in sorted(longest.items())}
    budgets = {p: round(max(PART_BUDGET_FLOOR_S, PART_BUDGET_FACTOR * s), 1) for p, s in sorted((part_s or {}).items())}
    options.limits = {**(options.limits or {}), "call_timeouts": limits, **({"part_budgets": budgets} if budgets else {})}
    return {"scaled": True, "factor": factor, "floor_s": floor, "targets": len(limits),
            "at_floor": sum(v == floor for v in limits.values()), "calibration_s": round(time.perf_counter() - t0, 2),
            "limits_s": limits, "part_budget_factor": PART_BUDGET_FACTOR, "part_budget_floor_s": PART_BUDGET_FLOOR_S,
            "part_budgets_s": budgets}


def _not_scaled(e: BaseException | str) -> dict:
    why = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    return {"scaled": False, "reason": sanitize.line(f"grading the reference failed: {why}", 300)}


def scaled_call_timeouts(options: Options) -> dict:
    """Measure the reference's call times in this process (one part after the other) and scale the
    limits from them (call_time_limits). A batch with several judges measures in the judges instead,
    each on some of the parts (_calibrate_in_judges)."""
    t0 = time.perf_counter()
    try:
        longest, score, entries, part_s = reference_run(options)
    except Exception as e:  # noqa: BLE001 -- no scaling then; check_reference refuses
        return {**_not_scaled(e), "reference": {"error": sanitize.line(f"{type(e).__name__}: {e}", 300)}}
    info = call_time_limits(longest, options, t0, part_s=part_s)
    if score["points"] >= score["max_points"] - 1e-6:  # (check_reference refuses the batch otherwise)
        seed_reuse(options, entries, ROOT / "solutions")  # this process's store: a batch graded here
    return {**info, "reference": score, "seeds": entries}


def share_out(costs: dict[int, float], n: int) -> list[list[int]]:
    """The parts ({number: cost}) shared out among n judges so that the costliest share is as cheap as
    it can be: every assignment is tried while there are few (a course has a handful of parts: 6 parts
    and 2 judges are 64), else the costliest part first to the judge with the least so far. With this
    kit's part costs (rubric.toml) the greedy rule's slowest share is 7.2 s, the best split's 6.9 s."""
    order = sorted(costs, key=lambda p: (-costs[p], p))
    if n <= 1 or len(order) <= 1:
        return [order] + [[] for _ in range(n - 1)] if n >= 1 else []
    best: tuple[float, list[list[int]]] | None = None
    if n ** len(order) <= 5000:
        for pick in itertools.product(range(n), repeat=len(order)):
            load = [0.0] * n
            for p, i in zip(order, pick):
                load[i] += costs[p]
            if best is None or max(load) < best[0] - 1e-9:
                best = (max(load), [[p for p, i in zip(order, pick) if i == j] for j in range(n)])
        return best[1]
    shares: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    for p in order:
        i = load.index(min(load))
        shares[i].append(p)
        load[i] += costs[p]
    return shares


def _calibrate_in_judges(judges: list["Judge"], options: Options, timeout_s: float) -> dict:
    """scaled_call_timeouts, with the parts shared out among the judges by the rubric's costs
    (share_out), so that calibrating takes the slowest share, not the sum. Every judge then gets the
    limits."""
    from autograder.engine.rubric import load_rubric

    t0 = time.perf_counter()
    rubric = load_rubric()
    numbers = options.parts or rubric.numbers
    shares = share_out({n: rubric.part(n).cost for n in numbers}, len(judges))
    asked = [(j, share) for j, share in zip(judges, shares) if share]
    for j, share in asked:
        j.conn.send(("calibrate", sorted(share)))
    longest: dict[str, float] = {}
    part_s: dict[str, float] = {}
    failure = None
    score = {"points": 0.0, "max_points": 0.0, "tests": 0, "first_error": ""}
    seeds: list[dict] = []
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
        for k in ("points", "max_points", "tests"):
            score[k] += reply[2][k]
        score["first_error"] = score["first_error"] or reply[2].get("first_error", "")
        seeds += reply[3]
        part_s.update(reply[4] if len(reply) > 4 else {})
    if failure is not None:
        return {**_not_scaled(failure), "reference": {"error": sanitize.line(failure, 300)}}
    info = {**call_time_limits(longest, options, t0, part_s=part_s), "reference": score, "seeds": seeds}
    calibrated = {k: options.limits[k] for k in CALIBRATED if k in options.limits}
    for j in judges:
        try:
            j.conn.send(("limits", calibrated))
        except OSError:  # a dead judge: _grade_all replaces it (with options, which hold the limits)
            pass
    return info


def _grade_all(entries: list[Entry], work: Path, out: Path, jobs: int, options: Options, timeout_s: float,
               progress: bool, results: dict, env: dict, calibrate_into: dict | None = None,
               prepare: Callable[[], None] | None = None, seeds: Sequence[dict] = (),
               replaced: dict[str, int] | None = None) -> None:
    """Grade `entries` in `jobs` judges. calibrate_into: first scale the call time limits in the
    judges (_calibrate_in_judges) and record how into this dict (the summary's info). prepare: called
    once the reference passed, before the first submission is graded (clear_previous). seeds: the
    reference's part results for every judge's store (calibrating gives its own). replaced: counts
    the judges replaced, by why ("died", "hung", "memory": over its memory bound after a grade).

    The judges share one store of part results (engine/reuse.py): each reply brings the parts that
    judge graded, and every other judge gets them before its next submission (never while it grades:
    a judge reads its pipe only between submissions), so a part graded once is graded once per batch,
    not once per judge. A judge that replaces another gets everything shared so far."""
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
            calibrate_into["reference"] = check_reference(calibrate_into["call_time_limits"].pop("reference"), options)
            seeds = calibrate_into["call_time_limits"].pop("seeds", [])
            for i, j in enumerate(judges):  # one that died calibrating grades nothing: a fresh one does
                if not j.proc.is_alive():
                    j.kill()
                    judges[i] = Judge(ctx, j.slot, options)
        shares = {j.slot: _Share() for j in judges}  # per judge slot: results it has yet to get
        shared = _Share()  # every result shared so far (bounded like a share): for a judge that replaces one
        replaced = replaced if replaced is not None else {}
        if seeds:
            for j in judges:
                j.send_quietly(("seed", list(seeds)))
        if prepare is not None:
            prepare()
        idle = list(judges)
        busy: list[Judge] = []
        while queue or busy:
            while idle and queue:
                j = idle.pop(0)
                e = queue.pop(0)
                if shares[j.slot].entries:
                    j.send_quietly(("share", shares[j.slot].take()))
                j.submit(Task(e.name, str(e.path), str(work / e.name)), timeout_s)
                busy.append(j)
            ready = mp.connection.wait([j.conn for j in busy] + [j.proc.sentinel for j in busy], timeout=0.5)
            now = time.perf_counter()
            for j in list(busy):
                task, outcome, replace = j.task, None, ""
                if j.conn in ready or j.conn.poll():
                    try:
                        outcome = j.conn.recv()
                    except (EOFError, OSError):
                        outcome, replace = ("error", "the judge process died", ""), "died"
                elif not j.proc.is_alive():
                    outcome, replace = ("error", f"the judge process died (exit code {j.proc.exitcode})", ""), "died"
                elif now > j.deadline:
                    outcome, replace = ("error", f"grading took longer than {timeout_s:g} s and was stopped", ""), "hung"
                if outcome is None:
                    continue
                retiring = outcome[0] == "ok" and len(outcome) > 4 and outcome[4] is True
                if retiring:  # its result stands; it holds more memory than its bound (_judge_main)
                    replace = "memory"
                    j.send_quietly(None)  # idle: it exits by itself, closing its workers
                    j.proc.join(10)
                busy.remove(j)
                e = by_name[task.name]
                elapsed = now - j.started
                if replace:  # a judge that died or hung is replaced (its workers die with it)
                    replaced[replace] = replaced.get(replace, 0) + 1
                    j.kill()
                    judges.remove(j)
                    j = Judge(ctx, j.slot, options)
                    judges.append(j)
                    if seeds:
                        j.send_quietly(("seed", list(seeds)))
                    shares[j.slot] = _Share()
                    shares[j.slot].add(shared.entries)  # what the one it replaces had been given
                if outcome[0] == "ok":
                    graded = Graded.from_json(outcome[1])
                    graded.elapsed_s = elapsed
                    new = outcome[3] if len(outcome) > 3 else {}
                    shared.add(new)
                    for other in judges:  # the results it graded, for the others (bounded: SHARE_BYTES)
                        if other.slot != j.slot or replace:
                            shares[other.slot].add(new)
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


SHARE_BYTES = 32 << 20  # results waiting for one judge: beyond this, it grades those parts itself


@dataclass
class _Share:
    """Part results another judge graded, waiting for this judge's next submission."""

    entries: dict = field(default_factory=dict)
    size: int = 0

    def add(self, new: dict) -> None:
        for key, entry in new.items():
            n = len(json.dumps(entry))
            if self.size + n <= SHARE_BYTES:
                self.entries[key], self.size = entry, self.size + n

    def take(self) -> dict:
        entries, self.entries, self.size = self.entries, {}, 0
        return entries


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
    write_outputs(out / e.name, graded, private=out / PRIVATE / e.name)
    return graded


# ---------------------------------------------------------------------------------------------
# the output folder: what earlier runs wrote there, and nothing else, is replaced


def _manifest_names(path: Path) -> set[str]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
        names = data["student_folders"]
        if not (isinstance(names, list) and all(isinstance(n, str) and SAFE_ID.fullmatch(n) for n in names)):
            raise ValueError("not a list of student ids")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise SystemExit(f"error: {path} is not the batch's record of what it wrote ({sanitize.line(type(e).__name__, 40)}); "
                         "remove it, or choose an empty --out") from None
    return set(names)


def previous_outputs(out: Path) -> set[str]:
    """The student folders earlier batch runs (or merges) wrote into `out`, from the manifest they
    keep (PRIVATE/written.json); for an output folder of an earlier version without one, the
    students of its grades.csv. Empty when `out` holds no batch output."""
    manifest = out / PRIVATE / MANIFEST
    if os.path.lexists(manifest):
        return _manifest_names(manifest)
    grades = out / "grades.csv"
    if (out / "summary.json").is_file() and grades.is_file() and not grades.is_symlink():
        try:
            rows = list(csv.reader(io.StringIO(grades.read_bytes().decode("utf-8"), newline="")))
        except (OSError, UnicodeDecodeError, csv.Error):
            return set()
        return {r[0] for r in rows[1:] if r and SAFE_ID.fullmatch(r[0])}
    return set()


def check_out_folders(out: Path, names: Sequence[str], previous: set[str]) -> None:
    """Refuse (one line, before anyone is graded) an --out where a student folder of this run, or the
    instructor folder, is something no batch run wrote: the batch would write into it, or have to
    delete it. A link is refused wherever it is: it is never followed."""
    private = out / PRIVATE
    if os.path.lexists(private) and (private.is_symlink() or not private.is_dir()):
        raise SystemExit(f"error: {private} is not a folder the batch wrote; remove it, or choose an empty --out")
    for n in names:
        for p in (out / n, private / n):
            if p.is_symlink() or (os.path.lexists(p) and (n not in previous or not p.is_dir())):
                raise SystemExit(f"error: --out {out} already holds {p.name if p.parent == out else p}, which no batch "
                                 "run wrote there; choose an empty --out (or remove it)")


def _write_manifest(out: Path, names: set[str]) -> None:
    private = out / PRIVATE
    private.mkdir(exist_ok=True)
    tmp = private / f".{MANIFEST}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.write_text(json.dumps({"student_folders": sorted(names)}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, private / MANIFEST)


def clear_previous(out: Path, previous: set[str], names: set[str], keep_off: Sequence[Path] = ()) -> None:
    """Before the first student folder of a run is written: record every folder this run may write
    (the manifest: earlier runs' and this one's, so that an interrupted run is accounted for too),
    then remove what earlier runs wrote: the batch's own files in their student folders and in their
    instructor folders, and each folder left empty. So no feedback from an earlier run stays where
    it could be uploaded. Nothing the batch did not write is deleted: a folder that holds other
    files stays (a warning names it), and nothing inside `keep_off` (the folders a merge reads)."""
    out.mkdir(parents=True, exist_ok=True)
    had_output = bool(previous) or os.path.lexists(out / PRIVATE / MANIFEST)
    _write_manifest(out, previous | names)
    if had_output:  # an earlier run's table and summary: rewritten at the end; never left to stand for this run
        for f in ("grades.csv", "summary.json"):
            if (out / f).is_file() and not (out / f).is_symlink():
                (out / f).unlink()
    kept = set()
    for n in sorted(previous):
        for folder, files in ((out / n, STUDENT_FILES + OLD_STUDENT_FILES), (out / PRIVATE / n, PRIVATE_FILES)):
            if folder.is_symlink() or not folder.is_dir():
                continue
            if any(_overlaps(folder, k) for k in keep_off):
                kept.add(n)
                continue
            for f in files:
                if (folder / f).is_file() and not (folder / f).is_symlink():
                    (folder / f).unlink()
            try:
                folder.rmdir()
            except OSError:  # it holds files the batch did not write: they stay
                kept.add(n)
                print(f"warning: {folder} holds files no batch run wrote; they were left there", file=sys.stderr)
    _write_manifest(out, names | kept)


def _overlaps(a: Path, b: Path) -> bool:
    """One of the two paths is the other or inside it (after resolving links)."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


CSV_HEAD = ["student", "source", "status"]
CSV_TAIL = ["total", "max_total", "submission_sha256", "reason"]


def graded_parts(options: Options) -> list[int]:
    """The part numbers a run grades (its grades.csv columns), from the options and the rubric:
    never from the rows, so that every shard of a run, even an empty one, has the same header."""
    from autograder.engine.rubric import load_rubric

    return sorted(set(options.parts)) if options.parts else load_rubric().numbers


def csv_header(parts: Sequence[int]) -> list[str]:
    return [*CSV_HEAD, *[f"part{n}" for n in parts], *CSV_TAIL]


def write_grades_csv(path: Path, rows: list[Graded], parts: Sequence[int]) -> None:
    """grades.csv: student, source (the upload it came from), status, part1..partN, total, max_total,
    submission_sha256, reason (why a row is not "graded"; never empty then). Sorted by student.
    Every cell a submission can influence goes through _cell (no spreadsheet formulas)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(csv_header(parts))
    for r in sorted(rows, key=lambda r: r.name):
        by = {p["part"]: p["points"] for p in r.view["parts"]}
        failed_ = r.status == "failed to grade"
        w.writerow([_cell(r.name), _cell(r.source), r.status, *["" if failed_ else f"{by.get(n, 0):g}" for n in parts],
                    "" if failed_ else f"{r.view['total']:g}", f"{r.view['max_total']:g}",
                    r.view.get("intake", {}).get("sha256", ""), _cell(sanitize.line(r.reason, 300))])
    path.write_text(buf.getvalue(), encoding="utf-8")


# what a spreadsheet (Excel, LibreOffice, Google Sheets) may read as the start of a formula or a
# command, also after leading spaces; the full-width forms too (some import them as the ASCII ones)
FORMULA_START = tuple("=+-@\t\r\n|%") + tuple("\uff1d\uff0b\uff0d\uff20")


def _cell(text: str) -> str:
    """A CSV cell a spreadsheet shows as text, whatever a submission made of it: one that starts
    like a formula gets a leading quote. The one function for every text cell a submission sets."""
    text = str(text)
    return "'" + text if text.lstrip(" ").startswith(FORMULA_START) else text


def _tree_sha256(*folders: Path) -> str:
    """One hash of the files (names and bytes) of these folders, __pycache__ left out."""
    h = hashlib.sha256()
    for folder in folders:
        if not folder.is_dir():
            h.update(f"missing {folder.name}\n".encode())
            continue
        for f in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(f"{f.relative_to(folder).as_posix()}\0".encode() + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def fingerprint(options: Options, info: dict, env: dict) -> dict:
    """What shards must share for their grades to compare (merge refuses others): the test sets, the
    parts, the limits after the rubric's defaults (not the calibrated per-call times: measured per
    machine), how call times are limited, the sandbox kind, the grader, and hashes of the rubric, the
    tests (public and hidden) and the environment."""
    from autograder.engine.rubric import DEFAULT_RUBRIC, load_rubric

    overrides = {k: v for k, v in (options.limits or {}).items() if k not in CALIBRATED}
    limits = Limits().updated(**load_rubric().defaults).updated(**overrides).__dict__
    return {
        "test_sets": sorted(options.test_sets), "parts": graded_parts(options),
        "limits": {k: v for k, v in sorted(limits.items()) if k not in CALIBRATED},
        "scale_timeouts": bool(options.scale_timeouts), "sandbox_kind": str(info.get("sandbox_kind")),
        "grader": options.grader,
        "rubric_sha256": hashlib.sha256(DEFAULT_RUBRIC.read_bytes()).hexdigest(),
        "tests_sha256": _tree_sha256(Path(options.tests_dir or DEFAULT_TESTS_DIR), DEFAULT_HIDDEN_DIR),
        "python": env.get("python"), "pip_freeze_sha256": env.get("pip_freeze_sha256"),
    }


def entries_sha256(names: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def _write_summary(out: Path, everyone: list[Entry], entries: list[Entry], results: dict, wall: float, jobs: int,
                   shard, info: dict, env: dict, options: Options, hidden: list[str]) -> dict:
    rows = [results[e.name] for e in entries if e.name in results]
    write_grades_csv(out / "grades.csv", rows, graded_parts(options))
    counts = {s: sum(r.status == s for r in rows) for s in ("graded", "failed to grade", "rejected")}
    hashes = [r.view.get("hashes", {}) for r in rows]
    names = [e.name for e in everyone]
    summary = {
        "submissions": len(rows), "graded": counts["graded"], "failed_to_grade": counts["failed to grade"],
        "rejected": counts["rejected"], "wall_s": round(wall, 2), "jobs": jobs,
        "submissions_per_minute": round(60 * len(rows) / wall, 2) if wall > 0 else None,
        "shard": list(shard) if shard else None, "test_sets": list(options.test_sets), "parts": options.parts,
        **info, "environment": env,
        # the whole folder's ids (every shard records them all): merge refuses shards cut from other lists
        "entries": names, "entries_count": len(names), "entries_sha256": entries_sha256(names),
        "skipped": [{"source": h, "reason": HIDDEN_REASON} for h in hidden],
        "fingerprint": fingerprint(options, info, env),
        # the mode string of each feedback (bubblewrap: were its workers forked inside the sandbox?)
        "sandbox_used": {m: sum(str(r.view.get("sandbox")) == m for r in rows)
                         for m in sorted({str(r.view.get("sandbox")) for r in rows})},
        "tests_sha256": sorted({h.get("tests") for h in hashes if h.get("tests")}),
        "failed": {r.name: r.reason for r in rows if r.status == "failed to grade"},
        "student_folders": sorted(r.name for r in rows), "instructor_folder": PRIVATE,
        "per_submission_s": {r.name: round(r.elapsed_s, 2) for r in rows if r.elapsed_s},
        "engine_timing": {r.name: r.timing for r in rows if r.timing},  # worker starts, call time
        # parts taken from an earlier submission of this batch with the same reached files (--no-reuse: none)
        "reuse": bool(options.reuse),
        "parts_reused": sum(len((r.timing or {}).get("reused_parts") or []) for r in rows),
        # tests of the parts graded whose replies were a stored pass's, reply for reply (engine/transcripts.py)
        "tests_reused": sum(int((r.timing or {}).get("reused_tests") or 0) for r in rows),
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
    t.add_row("parts reused", f"{summary.get('parts_reused', 0)} (same files as an earlier submission)"
              if summary.get("reuse") else "none (--no-reuse)")
    if summary.get("reuse"):
        t.add_row("tests reused", f"{summary.get('tests_reused', 0)} (the same replies as a test passed earlier)")
    replaced = summary.get("judges_replaced") or {}
    if any(replaced.values()):
        t.add_row("judges replaced", ", ".join(f"{n} ({why})" for why, n in sorted(replaced.items()) if n))
    t.add_row("sandbox", escape(summary["sandbox"]))
    if summary.get("passed_over"):
        t.add_row("not used", escape(summary["passed_over"]))
    t.add_row("process limit", escape(summary["process_limit"]))
    t.add_row("grades", escape(str(out / "grades.csv")))
    Console(stderr=True).print(t)
    skipped = summary.get("skipped") or []
    if skipped:
        shown = ", ".join(k["source"] for k in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        Console(stderr=True).print(f"skipped {len(skipped)} hidden entr{'y' if len(skipped) == 1 else 'ies'} "
                                   f"(name starts with a dot; not graded, no row): {shown}", markup=False)
    for name, why in summary["failed"].items():
        Console(stderr=True).print(f"[red]failed to grade[/red] {escape(name)}: {escape(why)} "
                                   f"(see {escape(str(out / PRIVATE / name / 'grading-error.txt'))})")


# ---------------------------------------------------------------------------------------------
# merge (shards -> one folder)


@dataclass
class Shard:
    """One shard's output folder, read and checked (merge validates every shard before it copies)."""

    dir: Path
    summary: dict
    header: list[str]
    rows: list[list[str]]


def _read_shard(d: Path) -> Shard:
    """Read one shard's summary.json and grades.csv, or refuse in one line naming the file."""
    def no(path: Path, what: str) -> None:
        raise SystemExit(f"error: {path}: {what}; pass the --out folders of the shards of one run (or regrade it)")

    if not d.is_dir() or not (d / "grades.csv").is_file() or not (d / "summary.json").is_file():
        raise SystemExit(f"error: {d} has no grades.csv and summary.json; pass the --out folders of the shards")
    sp, gp = d / "summary.json", d / "grades.csv"
    try:
        summary = json.loads(sp.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        no(sp, f"not valid JSON ({sanitize.line(type(e).__name__, 40)})")
    except OSError as e:
        no(sp, f"cannot be read ({e.strerror})")
    if not isinstance(summary, dict):
        no(sp, f"holds a {type(summary).__name__}, not the summary object")
    shard = summary.get("shard")
    if shard is not None:
        if not (isinstance(shard, list) and len(shard) == 2 and all(type(x) is int for x in shard)):
            no(sp, f'"shard" is {sanitize.line(json.dumps(shard), 60)}, not [i, n]')
        if not 1 <= shard[0] <= shard[1]:
            no(sp, f'"shard" {shard[0]}/{shard[1]} is out of range (1 <= i <= n)')
    entries, fp = summary.get("entries"), summary.get("fingerprint")
    if not (isinstance(entries, list) and all(isinstance(x, str) for x in entries)) or not isinstance(fp, dict):
        no(sp, "has no entry list or fingerprint (an older batch wrote it, or it was edited)")
    if summary.get("entries_sha256") != entries_sha256(entries) or len(set(entries)) != len(entries):
        no(sp, "its entry list does not match its entries_sha256")
    try:
        text = gp.read_bytes().decode("utf-8")
        table = list(csv.reader(io.StringIO(text, newline="")))
    except UnicodeDecodeError as e:
        no(gp, f"not UTF-8 (byte {e.start})")
    except (csv.Error, OSError) as e:
        no(gp, f"not a readable CSV file ({sanitize.line(e, 80)})")
    if not table:
        no(gp, "empty (no header)")
    header = table[0]
    parts = fp.get("parts")
    if not isinstance(parts, list) or header != csv_header(parts):
        no(gp, "its columns are not the ones its summary's parts give")
    known = set(entries)
    for k, row in enumerate(table[1:], start=2):
        if len(row) != len(header):
            no(gp, f"row {k} has {len(row)} cells, not {len(header)}")
        if not SAFE_ID.fullmatch(row[0]) or row[0] not in known:
            no(gp, f"row {k}: {sanitize.name(row[0], 60)} is not one of the run's student ids")
        if row[2] not in STATUSES:
            no(gp, f"row {k}: status {sanitize.name(row[2], 40)} is not one of {', '.join(STATUSES)}")
    return Shard(d, summary, header, table[1:])


def _check_shards(shards: list[Shard]) -> None:
    """Refuse anything but a complete set of shards 1/n .. n/n, each once (names the missing ones),
    cut from the same entry list and graded alike (the same fingerprint)."""
    dirs = [s.dir for s in shards]
    given = [s.summary.get("shard") for s in shards]
    if any(g is None for g in given) and len(shards) > 1:
        d = dirs[given.index(None)]
        raise SystemExit(f"error: {d} was not graded with --shard i/n; merge joins the shards of one run")
    first = shards[0]
    for s in shards[1:]:
        if s.summary["entries_sha256"] != first.summary["entries_sha256"]:
            a, b = set(first.summary["entries"]), set(s.summary["entries"])
            diff = sorted(a ^ b)[:5]
            raise SystemExit(f"error: {s.dir} and {first.dir} were cut from different submission folders "
                             f"({len(b)} vs {len(a)} entries; differ in {', '.join(diff) or 'order'}); "
                             "grade every shard from the same folder")
        if s.summary["fingerprint"] != first.summary["fingerprint"]:
            keys = sorted(k for k in set(s.summary["fingerprint"]) | set(first.summary["fingerprint"])
                          if s.summary["fingerprint"].get(k) != first.summary["fingerprint"].get(k))
            raise SystemExit(f"error: {s.dir} and {first.dir} were graded differently (they differ in "
                             f"{', '.join(keys)}); regrade them with the same options, tests and environment")
    if given[0] is None:
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


def _check_merge_targets(out: Path, dirs: list[Path], names: list[str], where: dict[str, Path]) -> None:
    """Refuse, before anything is written, a merge that would write on, into or around a folder it
    reads: each student's folder and instructor folder, and the merged files, against every shard."""
    def refuse(what: str, path: Path, d: Path) -> None:
        raise SystemExit(f"error: {what} would be written to {path}, which is, holds or lies inside the shard folder "
                         f"{d} that merge reads; merge into a folder of its own (e.g. {out / 'all'})")

    for name in names:
        for t in (out / name, out / PRIVATE / name):
            d = next((d for d in dirs if _overlaps(t, d)), None)
            if d is not None:
                refuse(f"the feedback of student {name}", t, d)
        src = where[name] / name  # read from its own shard: never from (or around) another one
        d = next((d for d in dirs if d != where[name] and _overlaps(src, d)), None)
        if d is not None:
            raise SystemExit(f"error: student {name}'s folder {src} is, holds or lies inside the shard folder {d}; "
                             "pass shard folders that do not nest")
    for t in (out / "grades.csv", out / "summary.json", out / PRIVATE):
        d = next((d for d in dirs if _overlaps(t, d)), None)
        if d is not None:
            refuse(f"merge's {t.name}", t, d)


def _copy_student(shard: Path, out: Path, name: str) -> None:
    """Copy one student's files from a shard: the batch's own files, as regular files (a link is not
    followed), the student's into out/<name>, the instructor's into out/PRIVATE/<name> (also from a
    shard an earlier version wrote, with grading-error.txt in the student's folder)."""
    def regular(p: Path) -> bool:
        return p.is_file() and not p.is_symlink()

    src = shard / name
    if src.is_symlink() or not src.is_dir():
        return
    for f in STUDENT_FILES:
        if regular(src / f):
            (out / name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / f, out / name / f)
    for f in PRIVATE_FILES:
        found = next((p for p in (shard / PRIVATE / name / f, src / f) if regular(p)), None)
        if found is not None:
            (out / PRIVATE / name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, out / PRIVATE / name / f)


def merge(shard_dirs: Sequence[Path], out: Path) -> Path:
    """Join shard outputs: copies each student's folder into `out` and writes one grades.csv.
    Everything is checked before anything is copied: each shard's files (_read_shard), the set of
    shards (_check_shards: complete, cut from one entry list, graded alike), and that the rows are
    exactly the run's students, each once; and the output folder: `out` may not be a shard's folder or
    inside one, and nothing merge writes (a student's folder, its instructor folder, grades.csv, ...)
    may be, hold or lie inside a folder it reads (a shard's), e.g. a student named `shard-2` merged into
    the parent of `shard-2/`. What earlier runs wrote into `out` is replaced (clear_previous)."""
    dirs = [Path(d) for d in shard_dirs]
    out = Path(out)
    target = out.resolve()
    for d in dirs:
        if target == d.resolve() or target.is_relative_to(d.resolve()):
            raise SystemExit(f"error: --out {out} is inside the shard folder {d}; choose a folder of its own")
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out} is a file; pass a folder (it is created if missing)")
    try:
        writable_folder(out, "--out")
    except UsageError as e:
        raise SystemExit(f"error: {e}") from None
    shards = [_read_shard(d) for d in dirs]
    _check_shards(shards)
    rows: dict[str, list[str]] = {}
    where: dict[str, Path] = {}
    for s in shards:
        for row in s.rows:
            if row[0] in rows:
                raise SystemExit(f"error: {row[0]} appears in two shards ({where[row[0]]} and {s.dir}); "
                                 "did two shards get the same --shard i/n?")
            rows[row[0]], where[row[0]] = row, s.dir
    expected = shards[0].summary["entries"]
    missing = [n for n in expected if n not in rows]
    if missing:
        raise SystemExit(f"error: no shard has a row for {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''} ({len(missing)} of {len(expected)}); regrade them")
    _check_merge_targets(out, dirs, sorted(rows), where)
    previous = previous_outputs(out)
    check_out_folders(out, sorted(rows), previous)
    clear_previous(out, previous, set(rows), keep_off=dirs)
    for name in sorted(rows):
        _copy_student(where[name], out, name)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(shards[0].header)
    for name in sorted(rows):
        w.writerow(rows[name])
    (out / "grades.csv").write_text(buf.getvalue(), encoding="utf-8")
    sums = [s.summary for s in shards]

    def total(key: str) -> int:
        return sum(v for v in (s.get(key, 0) for s in sums) if type(v) is int)

    merged = {"shards": len(sums), "submissions": len(rows), "graded": total("graded"),
              "failed_to_grade": total("failed_to_grade"), "rejected": total("rejected"),
              "sandbox": sorted({str(s.get("sandbox", "?")) for s in sums}),
              "entries": expected, "entries_count": len(expected), "entries_sha256": sums[0]["entries_sha256"],
              "fingerprint": sums[0]["fingerprint"], "shard": None, "skipped": sums[0].get("skipped", []),
              "student_folders": sorted(rows), "instructor_folder": PRIVATE}
    (out / "summary.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return out / "grades.csv"


# ---------------------------------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--timeout takes a positive number of seconds, not {text!r}")
    return value


def _parts(text: str) -> list[int]:
    items = [x.strip() for x in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", x) for x in items):
        raise argparse.ArgumentTypeError(f"--parts takes comma-separated part numbers, e.g. 1,2, not {text!r}")
    return [int(x) for x in items]


def _sets(text: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(","))
    if not all(items) or any(x not in TEST_SETS for x in items):
        raise argparse.ArgumentTypeError(f"--sets takes test sets among {','.join(TEST_SETS)}, comma-separated, "
                                         f"not {text!r}")
    return items


def _limit(text: str) -> tuple[str, float | int]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"--limit takes KEY=NUMBER, e.g. call_timeout_s=60, not {text!r}")
    try:
        number: float | int = int(value)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--limit {text}: the value must be a number") from None
    try:
        return key, check_overrides({key: number})[key]  # the field's type: fork_server=0 is False
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        ap = Parser(prog="python -m instructor.batch merge", description="Join the grades of several --shard runs.")
        ap.add_argument("shards", nargs="+", type=Path, help="the --out folders of the shards")
        ap.add_argument("--out", type=Path, required=True)
        a = ap.parse_args(argv[1:])
        print(merge(a.shards, a.out))
        return 0
    ap = Parser(prog="python -m instructor.batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("submissions", type=Path, help="folder with one entry (folder or .zip) per submission")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "autograde")
    ap.add_argument("--jobs", type=positive_int("--jobs"), default=None,
                    help="judges in parallel (default: one per core)")
    ap.add_argument("--shard", type=parse_shard, default=None, help="grade only shard i of n (1-based), e.g. 3/8")
    ap.add_argument("--parts", type=_parts, default=None, help="comma-separated part numbers (default: all)")
    ap.add_argument("--sets", type=_sets, default=("public", "hidden"), help="test sets (default: public,hidden)")
    ap.add_argument("--sandbox", choices=["auto", "bubblewrap", "uid", "rlimits", "off"], default="auto",
                    help="auto: bubblewrap if it passes its self-test, else the unprivileged-uid sandbox; "
                         "grading refuses when neither is available, unless --allow-weak-sandbox")
    ap.add_argument("--allow-weak-sandbox", action="store_true",
                    help="accept a sandbox weaker than asked (rlimits only, or off) instead of refusing")
    ap.add_argument("--fixed-time-limits", action="store_true",
                    help="do not scale each call's time limit from the reference's own time")
    ap.add_argument("--no-reuse", action="store_true",
                    help="grade every part of every submission, even where an earlier submission of the batch "
                         "had the same files for it (by default its result is reused)")
    ap.add_argument("--timeout", type=_seconds, default=1800.0, help="seconds per submission before it is stopped")
    ap.add_argument("--limit", type=_limit, action="append", default=[], metavar="KEY=VALUE",
                    help="engine limit override, e.g. call_timeout_s=5 or memory_mb=2048 (repeatable)")
    ap.add_argument("--tests-dir", default=None, help="another assignment-tests folder (default: autograder/tests)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    options = Options(parts=a.parts, test_sets=a.sets, limits=dict(a.limit), tests_dir=a.tests_dir,
                      scale_timeouts=not a.fixed_time_limits, reuse=not a.no_reuse)
    summary = run_batch(a.submissions, a.out, jobs=a.jobs, shard=a.shard, options=options, timeout_s=a.timeout,
                        progress=not a.quiet, sandbox=a.sandbox, allow_weak=a.allow_weak_sandbox)
    print_summary(summary, a.out)
    if not summary.get("entries_count"):  # most likely the wrong folder: say so, the empty run stands
        print(f"warning: {a.submissions} holds no submission (a folder or a .zip per student), so "
              "grades.csv has no rows; check the path", file=sys.stderr)
    return 0 if summary["failed_to_grade"] == 0 else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
