"""Grade ONE submission: intake, then the engine, then the student's view. Every channel calls this.

    graded = grade_one(entry, work, options)             # batch judges, Gradescope
    graded = grade_one(None, work, options, take=...)    # nbgrader (the notebook's cells as intake)

The batch (instructor/batch.py), Gradescope (instructor/gradescope/) and nbgrader
(instructor/nbgrader_channel.py) only render the returned `Graded`; `make grade` calls the thin
engine-level autograder.engine.grade_for_student that this builds on. Nothing here raises for
anything a submission controls: intake problems and engine failures land in the result, with a
reason, and every result records the sandbox mode it was graded in.

Renderers: `feedback_markdown` (feedback.md), gradescope.results.results_json (results.json),
`write_outputs` (a student's folder of the batch). Every string a submission chose is sanitized
at intake and in the judge (autograder/engine/sanitize.py); the markdown renderer escapes it.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

from autograder.engine import sanitize
from autograder.engine.reuse import PartResults
from autograder.engine.runner import student_view

from . import intake
from .sandbox import UID_BASE, claim_uid  # judge slot i: uid UID_BASE + i, or the next free one

DEFAULT_GRADER = "autograder.engine:grade"
STATUSES = ("graded", "failed to grade", "rejected")
# What a student is told when grading failed (the reason and the traceback are the instructor's: a
# judge that hung, died or raised is the grader's problem, and its reason could mislead).
NOT_GRADED = ("Not graded: grading failed on the grader's side, so this is not your grade. Your instructor "
              "has the details and will regrade this submission.")


@dataclass
class Options:
    """How to grade (the same for every submission of a run)."""

    parts: list[int] | None = None
    test_sets: tuple[str, ...] = ("public", "hidden")
    limits: dict = field(default_factory=dict)
    grader: str = DEFAULT_GRADER  # "module:function" with autograder.engine.grade's signature
    sandbox: Any = None  # instructor.sandbox.Sandbox, or None (no sandbox: debugging only)
    tests_dir: str | None = None  # another assignment-tests folder (default: autograder/tests)
    scale_timeouts: bool = True  # each call's time limit from the reference's own time (batch.scaled_call_timeouts)
    # a part whose reached files are byte-identical to those of a submission graded earlier in this
    # process, with the same settings, takes that result (autograder/engine/reuse.py)
    reuse: bool = True


@dataclass
class Graded:
    """One submission's result. `view` is what the student may see; `failure` is instructor-only
    (why grading failed, with the traceback)."""

    name: str
    source: str  # the entry as uploaded (sanitized: printable even when the name was not UTF-8)
    status: str  # graded | failed to grade | rejected
    reason: str  # why it is not "graded" (never empty then); "" when graded
    view: dict
    failure: dict | None = None
    timing: dict | None = None
    elapsed_s: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Graded":
        return cls(**d)


# ---------------------------------------------------------------------------------------------


def environment() -> dict:
    """Python version and the installed distributions (what `pip freeze` lists), hashed."""
    dists = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()
                    if d.metadata and d.metadata["Name"]}, key=str.lower)
    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": platform.machine(), "packages": len(dists),
            "pip_freeze_sha256": hashlib.sha256("\n".join(dists).encode()).hexdigest()}


def sandbox_info(options: Options) -> dict:
    return options.sandbox.describe() if options.sandbox else {
        "sandbox": "none (disabled with --sandbox off; for debugging only)", "process_limit": "none",
        "sandbox_kind": "none"}


def sweep(prefix: Any) -> None:
    """What the sandbox's uid left behind (scratch, /tmp, /dev/shm) goes before the next submission."""
    if prefix is not None and hasattr(prefix, "sweep"):
        prefix.sweep()


def resolve(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


_REUSE = PartResults()  # this process's earlier part results (a batch judge's: its whole batch)


def run_engine(impl_dir: Path, options: Options, slot: int = 0, grade: Callable | None = None,
               store: PartResults | None = None, not_taken: dict[str, str] | None = None) -> dict:
    """The engine (options.grader) on a folder of graded files, workers in options.sandbox as
    uid UID_BASE + slot (or the next free one: sandbox.claim_uid). Returns the engine's full report (hidden
    tests already redacted). store: the part results to take from and add to (default: this process's
    own when options.reuse, else none)."""
    grade = grade or resolve(options.grader)
    prefix = options.sandbox.with_uid(claim_uid(UID_BASE + slot)) if options.sandbox else None
    extra = {"tests_dir": options.tests_dir} if options.tests_dir else {}
    store = store if store is not None else (_REUSE if options.reuse else None)
    if store is not None and "reuse" in inspect.signature(grade).parameters:
        extra["reuse"] = store
    if not_taken and "not_taken" in inspect.signature(grade).parameters:
        extra["not_taken"] = not_taken
    try:
        report = grade(impl_dir, parts=options.parts, test_sets=options.test_sets, worker_prefix=prefix,
                       limits=options.limits or None, **extra)
    finally:
        sweep(prefix)
    if prefix is not None and callable(getattr(prefix, "mode_used", None)):
        # the mode with how this submission's workers started (bubblewrap: forked inside the sandbox or not)
        report = {**report, "sandbox": prefix.mode_used()}
    return json.loads(json.dumps(report))  # plain JSON from here on


def seed_reuse(options: Options, entries: Sequence[dict], solutions: Path) -> int:
    """Put the reference's part results (batch.reference_run's `entries`, graded before the call time
    limits were scaled) in this process's store, under the keys a submission with the reference's files
    gets with `options` (the scaled limits). Sound because the limits are at least TIMEOUT_FACTOR times
    the reference's longest call to each target, and each part's budget PART_BUDGET_FACTOR times its time
    for the part, and nothing else in the settings changed: no call of it would be lost under them, so
    its result there is the same. The batch grades the reference anyway
    (to scale the limits and check the set-up), so a student's part that has the reference's files then
    costs nothing. Returns how many were put (none with --no-reuse or another grader)."""
    if not options.reuse or options.grader != DEFAULT_GRADER or not entries:
        return 0
    from autograder.engine.runner import reuse_keys
    from autograder.engine.transcripts import is_transcript

    # the reference's passed tests: their keys leave out the per-call time limits (engine/transcripts.py)
    put = sum(_REUSE.put(e["key"], e, shared=True) for e in entries if is_transcript(e))
    by_part = {int(e["row"]["part"]): e for e in entries if not is_transcript(e)}
    kwargs = {"tests_dir": options.tests_dir} if options.tests_dir else {}
    keys = reuse_keys(solutions, parts=sorted(by_part), test_sets=options.test_sets, worker_prefix=options.sandbox,
                      limits=options.limits or None, **kwargs)
    return put + sum(_REUSE.put(keys[n], e, shared=True) for n, e in by_part.items())


def take_new_results() -> dict[str, dict]:
    """What this process's grades added to its store since the last call (a batch judge sends it to the
    batch, which passes it on to the other judges: share_results)."""
    return _REUSE.take_new()


def share_results(entries: dict[str, dict]) -> None:
    """Put another judge's new part results (take_new_results) in this process's store. They are keyed
    by that judge with the same settings, and judges are trusted processes: no worker reaches them."""
    for key, entry in entries.items():
        _REUSE.put(key, entry, shared=True)


def grade_one(entry: Path | None, work: Path, options: Options, *, name: str | None = None, slot: int = 0,
              take: Callable[[Path], intake.Submission] | None = None, env: dict | None = None,
              grade: Callable | None = None) -> Graded:
    """Intake `entry` (a folder or a .zip; or `take(dest)`, which returns a Submission) into
    work/files, grade the accepted files, and return the result. Never raises for anything the
    submission controls; an engine failure becomes status "failed to grade" with its reason."""
    t0 = time.perf_counter()
    work = Path(work)
    sub = take(work / "files") if take else intake.take_for_parts(Path(entry), work / "files", options.parts)
    if name:
        sub.name = name
    report = failure = None
    if not sub.error and sub.files:
        try:
            report = run_engine(sub.dir, options, slot, grade, not_taken=not_taken(sub))
        except Exception as e:  # noqa: BLE001 -- a grading failure is a result, not a crash
            failure = {"reason": sanitize.line(f"{type(e).__name__}: {e}", 300), "traceback": traceback.format_exc()}
    return result(sub, report, failure, options, env, time.perf_counter() - t0)


def not_taken(sub: intake.Submission) -> dict[str, str]:
    """{graded file name: why the intake rejected it} for graded files the intake did not take (the
    engine says so in each part that needs the file, rather than "missing")."""
    taken = {os.path.basename(f) for f in sub.files}
    graded = set(intake.all_graded_files())
    return {name: why for path, why in sub.rejected
            if (name := os.path.basename(path.replace("\\", "/"))) in graded and name not in taken}


def failed(entry: Path, work: Path, options: Options, name: str, reason: str, detail: str = "",
           env: dict | None = None, elapsed: float | None = None) -> Graded:
    """The result for a submission whose judge died or hung: intake again (for the notes), no engine."""
    try:
        sub = intake.take_for_parts(Path(entry), Path(work) / "files-again", options.parts)
    except Exception as e:  # noqa: BLE001
        sub = intake.Submission(name=name, source=str(entry), error=f"intake failed ({type(e).__name__})")
    sub.name = name
    return result(sub, None, {"reason": sanitize.line(reason, 300), "traceback": detail}, options, env, elapsed)


def _rubric_parts() -> list[dict]:
    from autograder.engine import load_rubric

    return [{"part": p.number, "name": p.name, "max_points": float(p.points)} for p in load_rubric().parts]


def zero_report(reason: str, parts: Sequence[int] | None) -> dict:
    """A report with every part at 0 and `reason` as each part's failure (nothing was run)."""
    rows = [{"part": p["part"], "name": p["name"], "points": 0.0, "max_points": p["max_points"], "passed": 0,
             "total": 0, "status": "error", "first_failure": {"test": None, "message": reason, "kind": "rejected"}}
            for p in _rubric_parts() if not parts or p["part"] in parts]
    return {"parts": rows, "total": 0.0, "max_total": float(sum(r["max_points"] for r in rows)), "tests": [],
            "errors": [reason], "hashes": {}, "test_sets": []}


def judge_error_failure(report: dict) -> dict:
    """The failure of a grade in which some test raised an error of its own (the engine's report
    lists them as judge_errors): those tests' 0 is the tests' fault, not the submission's, so the row
    is not graded and goes to the instructor (grading-error.txt, the regrade list), never a silent 0."""
    ids = report["judge_errors"]
    return {"reason": f"{len(ids)} test(s) raised an error of their own, not the submission's (first: "
                      f"{sanitize.line(ids[0], 200)}): fix the tests, then regrade",
            "traceback": "\n".join(report.get("errors", []))}


def _rejection(sub: intake.Submission, parts: Sequence[int] | None = None) -> str:
    """Why nothing of this submission could be graded (never empty)."""
    if sub.error:
        return f"submission rejected: {sub.error}"
    if sub.rejected:
        shown = "; ".join(f"{p}: {why}" for p, why in sub.rejected[:3])
        return f"no graded file was accepted ({shown}{' ...' if len(sub.rejected) > 3 else ''})"
    expected = sub.wanted or intake.files_for_parts(list(parts) if parts else None)
    return f"no graded files found (expected {', '.join(expected)})"


def result(sub: intake.Submission, report: dict | None, failure: dict | None, options: Options,
           env: dict | None = None, elapsed: float | None = None) -> Graded:
    """A Graded from the intake, the engine's report (or None) and a failure (or None)."""
    env = env or environment()
    info = sandbox_info(options)
    if failure is None and report is not None and report.get("judge_errors"):
        failure = judge_error_failure(report)
    if failure is not None:
        status, reason = "failed to grade", f"failed to grade: {failure['reason']}"
    elif report is None:
        status, reason = "rejected", _rejection(sub, options.parts)
    else:
        status, reason = "graded", ""
    full = report if report is not None else zero_report(NOT_GRADED if failure is not None else reason, options.parts)
    view = student_view(full)
    if failure is not None:  # no points a student could read as the grade: there is none yet
        view["total"] = None
        for row in view["parts"]:
            row["points"], row["status"] = None, "not graded"
        view["not_graded"] = NOT_GRADED
    if report is not None:  # what the engine ran (a grader plug-in may not say: the options')
        view.setdefault("test_sets", list(options.test_sets))
    view["student"] = sub.name
    view["status"] = status
    view["intake"] = {"notes": sub.notes(), "files": sub.files, "sha256": sub.sha256}
    view["sandbox"] = full.get("sandbox") or info["sandbox"]  # run_engine's: how its workers started
    view["hashes"] = {**full.get("hashes", {}), "intake_sha256": sub.sha256,
                      "pip_freeze_sha256": env["pip_freeze_sha256"], "python": env["python"]}
    return Graded(name=sub.name, source=sanitize.name(sub.source, 500), status=status, reason=reason, view=view,
                  failure=failure, timing=(report or {}).get("timing"), elapsed_s=elapsed)


# ---------------------------------------------------------------------------------------------
# renderers


def hidden_summary(view: dict) -> list[tuple[str, int, int]]:
    """(hidden test function, passed, run) per hidden test function, in order."""
    return [(t["id"], int(t.get("passed", t["outcome"] == "passed")), int(t.get("cases", 1)))
            for t in view.get("tests", []) if t.get("set") == "hidden"]  # (student_view folded the cases)


def feedback_markdown(graded: Graded) -> str:
    """The feedback a student reads: intake notes, then what `make grade` shows (the engine's own
    renderer: per-part table, first failure of each part), then the hidden tests by name. Every
    line a submission could have influenced is escaped (sanitize.markdown), in code (sanitize.code: the
    student's id and the intake notes, which hold the submission's file names) or fenced."""
    from autograder.engine.feedback import render_text

    view = graded.view
    lines = [f"# Feedback for {sanitize.code(graded.name)}", ""]
    notes = view.get("intake", {}).get("notes", [])
    if notes:
        lines += ["## Your submission", ""] + [f"- {sanitize.code(n)}" for n in notes] + [""]
    if graded.status == "failed to grade":
        return "\n".join(lines + ["## Not graded", "", NOT_GRADED, ""])
    lines += ["## Grade", "", render_text(view).rstrip("\n")]
    hidden = hidden_summary(view)
    if hidden:
        lines += ["", "## Hidden tests", "", "Named, not revealed: their inputs and expected values are not shown.", ""]
        lines += [f"- `{name}`: {ok}/{n} passed" for name, ok, n in hidden]
    sets = view.get("test_sets")  # a rejected submission ran none: say so, never a default
    ran = f"Graded with the test sets {', '.join(sets)}." if sets else "Nothing of this submission was run."
    lines += ["", "---", f"{ran} Sandbox: {sanitize.markdown(view.get('sandbox', '?'))}.", ""]
    return "\n".join(lines)


def not_graded_results(view: dict, notes: list[str] | None = None) -> dict:
    """results.json (Gradescope's format) for a submission that could not be graded: it says so, and
    that the instructor will regrade it. No top-level score (an importer that needs one imports
    nothing for it rather than a 0), top level hidden, and one visible entry of 0/0 points with the
    note; the reason (a time-out, a dead judge) is the instructor's."""
    text = NOT_GRADED + ("\n\nYour submission:\n" + "\n".join(f"- {n}" for n in notes) if notes else "")
    return {
        "output": NOT_GRADED, "output_format": "text", "visibility": "hidden", "stdout_visibility": "hidden",
        "tests": [{"name": "Not graded: your instructor will regrade this submission", "number": "0", "score": 0.0,
                   "max_score": 0.0, "status": "failed", "visibility": "visible", "output": text,
                   "tags": ["not graded"]}],
        "extra_data": {"status": "failed to grade", "regrade": True, "hashes": view.get("hashes", {}),
                       "sandbox": view.get("sandbox")},
    }


def write_outputs(folder: Path, graded: Graded, private: Path | None = None) -> None:
    """A student's folder: feedback.md, feedback.json, results.json (Gradescope's format), all of it
    fit to hand to the student. When grading failed, the instructor's grading-error.txt (reason and
    traceback) goes to `private`, a folder apart from the student's (never into theirs; without
    `private` it is not written)."""
    from .gradescope.results import results_json

    def write(where: Path, name: str, text: str) -> None:  # JSON is ASCII; text is sanitized (the escape handler is a backstop)
        (where / name).write_text(text, encoding="utf-8", errors="backslashreplace")

    folder.mkdir(parents=True, exist_ok=True)
    notes = graded.view["intake"]["notes"]
    write(folder, "feedback.json", json.dumps(graded.view, indent=2, sort_keys=True) + "\n")
    write(folder, "feedback.md", feedback_markdown(graded))
    res = not_graded_results(graded.view, notes) if graded.status == "failed to grade" else \
        results_json(graded.view, notes=notes)
    write(folder, "results.json", json.dumps(res, indent=2) + "\n")
    if graded.failure and private is not None:
        private.mkdir(parents=True, exist_ok=True)
        write(private, "grading-error.txt", graded.failure["reason"] + "\n\n"
              + sanitize.block(graded.failure.get("traceback", ""), 20000, 400))
