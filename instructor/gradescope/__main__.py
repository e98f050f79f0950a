"""python -m instructor.gradescope build --out ZIP | run [--root /autograder] [--parts 1,2] [--out JSON] | check

Bad input (an --out that cannot be written, --parts that are not part numbers, a --root that is no
folder, build run from the unpacked zip) is ONE line on stderr, "error: ... (what to do)", and a
non-zero exit status, never a traceback, through autograder.grade's run_cli and Parser; the zip
ships autograder/grade.py (CLI_HELPER) for that. `run` still writes a failing results.json when
it cannot grade: to --out (default ROOT/results/results.json) whenever that can be written; only an
--out that cannot be written, or the default --out of a --root that does not exist (this command
does not create a /autograder), gets the one line alone. run_autograder publishes a failing
results.json whenever this command exits non-zero."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Sequence

from autograder.grade import Parser, UsageError, run_cli, writable_file

from ..grading import Options, grade_one
from ..sandbox import SandboxError, detect, require
from .results import results_json

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent

# What the autograder zip holds (paths relative to the repository; folders recursively). Gradescope
# unpacks it into /autograder/source. No solutions: the engine grades the submission alone.
# - the grader as the student release ships it: the files of instructor.release.shipped_files()
#   under autograder.engine.paths.JUDGE_TREES (the engine, scenarios, checks, rubric, course);
# - the grading environment's pins (the instructor's requirements: setup.sh installs them);
# - the instructor-only code that grades (named here, once): the hidden cases and the channel.
ENVIRONMENT = ("requirements.txt", "requirements.lock")
GRADING_CODE = ("instructor/__init__.py", "instructor/hidden_tests", "instructor/intake.py", "instructor/sandbox.py",
                "instructor/batch.py", "instructor/grading.py", "instructor/gradescope")
# The command-line plumbing every CLI of the kit shares (one-line errors): shipped by the student
# release, outside JUDGE_TREES, and needed by this module's main() in the zip.
CLI_HELPER = ("autograder/grade.py",)
SKIP = {"__pycache__", ".pytest_cache", ".hypothesis"}
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # reproducible zip: same inputs, same bytes


def _files(rel: str) -> list[Path]:
    p = ROOT / rel
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise SystemExit(f"error: {p} is missing; the Gradescope zip needs it")
    return sorted(f for f in p.rglob("*") if f.is_file() and not SKIP & set(f.relative_to(ROOT).parts)
                  and f.suffix not in (".pyc", ".pyo"))


def _under(rel: str, trees: Sequence[str]) -> bool:
    return any(rel == t or rel.startswith(t + "/") for t in trees)


def contents() -> list[str]:
    """Every file of the zip's source tree (relative paths, sorted): see the comment above."""
    from autograder.engine.paths import JUDGE_TREES

    from ..release import shipped_files

    grader = [f for f in shipped_files() if _under(f, (*JUDGE_TREES, *CLI_HELPER))]
    missing = [t for t in (*JUDGE_TREES, *CLI_HELPER) if not any(_under(f, (t,)) for f in grader)]
    if missing:
        raise SystemExit(f"error: the release ships nothing of {missing}; the Gradescope zip needs it")
    own = [f.relative_to(ROOT).as_posix() for rel in (*ENVIRONMENT, *GRADING_CODE) for f in _files(rel)]
    _check_hidden_tests(own)
    return sorted(set(grader) | set(own))


def _check_hidden_tests(files: Sequence[str]) -> None:
    """Every part of the rubric has its hidden cases in the zip (the engine withholds a part's points
    when they are missing at grading time: better to refuse the build)."""
    from autograder.engine.rubric import load_rubric

    hidden = {Path(f).name for f in files if f.startswith("instructor/hidden_tests/")}
    missing = [n for n in load_rubric().numbers if not any(h.startswith(f"part{n}_") and h.endswith(".py")
                                                           for h in hidden)]
    if missing:
        raise SystemExit(f"error: instructor/hidden_tests/ has no cases for part(s) {missing}; the Gradescope zip "
                         "needs them (restore the files, e.g. git checkout instructor/hidden_tests)")


def build(out: Path) -> Path:
    """Write the autograder zip: setup.sh and run_autograder at its root, then the source tree.
    An --out that cannot be written is refused (UsageError) before anything is read or written."""
    if not (ROOT / "instructor" / "release.py").is_file():
        raise UsageError(f"build needs the course repository (instructor/release.py is missing under {ROOT}: "
                         "this looks like the unpacked autograder zip); run it in the course repository")
    out = Path(out)
    if out.name in ("", ".", "..") or out.is_dir():
        raise UsageError(f"--out {out} is not a file name; pass a zip file, e.g. build/gradescope-autograder.zip")
    writable_file(out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[str, bytes, int]] = [
        ("setup.sh", (HERE / "setup.sh").read_bytes(), 0o755),
        ("run_autograder", (HERE / "run_autograder").read_bytes(), 0o755),
    ]
    for rel in contents():
        entries.append((rel, (ROOT / rel).read_bytes(), 0o644))
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data, mode in sorted(entries, key=lambda e: e[0]):
                info = zipfile.ZipInfo(name, FIXED_TIME)
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


WEAK_OK = "AUTOGRADER_ALLOW_WEAK_SANDBOX"  # =1: the instructor accepts grading with rlimits only
# Gradescope stops an autograder at its timeout (10 minutes unless the assignment says otherwise) and
# then shows its own error, not our results.json. The engine's grade budget (Limits.grade_budget_s)
# keeps the grade inside it: calls after the budget are not run (they score 0, with that reason).
BUDGET_ENV = "AUTOGRADER_TIME_BUDGET_S"
DEFAULT_BUDGET_S = 480.0  # 8 of Gradescope's default 10 minutes: start-up, intake and the report need the rest


def time_budget_s() -> float:
    """The grade's time budget: $AUTOGRADER_TIME_BUDGET_S (set it in run_autograder when the
    assignment's timeout is not Gradescope's default), else DEFAULT_BUDGET_S."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        print(f"{BUDGET_ENV}={raw!r} is not a positive number of seconds; using {DEFAULT_BUDGET_S:g}")  # the log
        return DEFAULT_BUDGET_S
    return value


def sandbox_refusal(box) -> str | None:
    """Why this machine's sandbox is not good enough to grade on, or None. A mode that does not
    isolate (resource limits only, the uid mode without Landlock) is refused unless the instructor
    set AUTOGRADER_ALLOW_WEAK_SANDBOX=1. The reason is sandbox.require's, as in every channel: the
    mode that was asked for and why it is not here, GRADER_SANDBOX when that asked, and the mode
    the flag would give."""
    if box.isolating or os.environ.get(WEAK_OK) == "1":
        return None
    try:
        require("auto", False, to_accept=f"set {WEAK_OK}=1 in setup.sh and run_autograder")
    except SandboxError as e:
        return f"sandbox not available: {str(e).removeprefix('refusing to grade: ')}"
    return (f"sandbox not available: {box.mode}; the autograder refuses to grade without isolation "
            f"(set {WEAK_OK}=1 in setup.sh and run_autograder to accept a sandbox that does not isolate)")


def grading_box():
    """The sandbox this image grades in: the one `auto` (or GRADER_SANDBOX) finds, or, where that one
    does not isolate and AUTOGRADER_ALLOW_WEAK_SANDBOX=1 accepts a weaker mode, the strongest this
    machine has (sandbox.require with allow_weak, as the batch's --allow-weak-sandbox and nbgrader's
    allow_weak_sandbox): never resource limits only where the uid mode would run. Raises
    SandboxError where GRADER_SANDBOX names no mode."""
    box = detect()
    if not box.isolating and os.environ.get(WEAK_OK) == "1":
        box = require("auto", True)
    return box


def failing_result(reason: str = "", sandbox: str | None = None) -> dict:
    """A results.json that gives 0 and says the grader failed (the reason goes to stdout only). It
    records the sandbox mode when one was detected: every result records its mode, a refusal too."""
    from .publish import FAILED

    if reason:
        print(f"autograder failure: {reason}")  # stdout: the instructor's log, hidden from students
    result = json.loads(json.dumps(FAILED))
    if sandbox:
        result["extra_data"]["sandbox"] = sandbox
    return result


def _write_private(path: Path, result: dict) -> None:
    """Write `path` afresh: a file a worker planted there (or a link) is replaced, not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)


def run(root: Path, parts: Sequence[int] | None = None, out: Path | None = None) -> dict:
    """Grade root/submission with grade_one and write the results JSON to `out` (default
    root/results/results.json), always, even when grading fails. The file is written only here,
    after grade_one returned, i.e. after every worker of the engine is dead; run_autograder passes
    a private `out` and publishes it only if this process exits 0."""
    t0 = time.perf_counter()
    out = out or root / "results" / "results.json"
    try:
        box = grading_box()
        refusal = sandbox_refusal(box)
        if refusal:
            result = failing_result(refusal, box.mode)
        else:
            options = Options(parts=list(parts) if parts else None, test_sets=("public", "hidden"), sandbox=box,
                              limits={"grade_budget_s": time_budget_s()})
            with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
                graded = grade_one(root / "submission", Path(tmp), options, name="submission")
            # stdout: hidden from students; the view's mode says how the workers started (bubblewrap)
            print(f"sandbox: {graded.view.get('sandbox') or box.mode}; status: {graded.status}")
            if graded.status == "failed to grade":
                print(graded.failure.get("traceback", ""))
                result = failing_result(graded.reason, graded.view.get("sandbox") or box.mode)
            else:
                # no execution_time: a submission can stretch its hidden calls, so the time is a channel
                result = results_json(graded.view, notes=graded.view["intake"]["notes"])
            print(f"grading took {time.perf_counter() - t0:.1f} s")  # stdout: the instructor's log
    except Exception:  # noqa: BLE001 -- students must always get a results.json
        traceback.print_exc(file=sys.stdout)
        result = failing_result()
    _write_private(Path(out), result)
    return result


def check(allow_weak: bool = False) -> int:
    """setup.sh's check: the sandbox this image gives, one line; non-zero if it is refused."""
    try:
        box = grading_box()
    except SandboxError as e:  # e.g. GRADER_SANDBOX names a mode this machine cannot give
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(box.describe()))
    refusal = None if allow_weak else sandbox_refusal(box)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    print(f"sandbox: {box.mode}")
    return 0


def parse_parts(text: str | None) -> list[int] | None:
    """--parts "1,3" -> [1, 3] (None or "": every part), refused (UsageError) unless each is a part
    of the rubric."""
    from autograder.engine.rubric import load_rubric

    if text is None or not text.strip():
        return None
    numbers = load_rubric().numbers
    parts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) not in numbers:
            raise UsageError(f"--parts {text!r}: {item!r} is not a part (the parts are {', '.join(map(str, numbers))}); "
                             "pass comma-separated part numbers, e.g. --parts 1,2 (or set AUTOGRADER_PARTS so)")
        if int(item) not in parts:
            parts.append(int(item))
    return parts


def run_command(root: Path, parts_text: str | None, out: Path | None) -> int:
    """`run`: check the command line, then grade. A results.json is written whenever `out` can be
    written: the grade, or a failing one (0 points) when the command line is refused."""
    root = Path(root)
    explicit_out = out is not None
    out = Path(out) if explicit_out else root / "results" / "results.json"
    if explicit_out or root.is_dir():
        writable_file(out, "--out")  # nothing to write into: the one line alone
    try:
        if not root.is_dir():
            raise UsageError(f"--root {root} is not a folder (Gradescope's /autograder, which holds submission/); "
                             "pass the folder with --root or GRADESCOPE_ROOT")
        if not (root / "submission").is_dir():
            raise UsageError(f"--root {root} holds no submission/ folder; put the submission in "
                             f"{root / 'submission'} or pass another --root")
        parts = parse_parts(parts_text)
    except UsageError as e:
        if explicit_out or root.is_dir():
            _write_private(out, failing_result(f"not graded: {e}"))
        raise
    result = run(root, parts, out)
    print(f"score {result['score']:g}")
    # not graded (a refused sandbox, the engine failed): a failing results.json is written, and the exit
    # status says so too (run_autograder's log; publish.py still publishes that result: 0 points)
    return 1 if (result.get("extra_data") or {}).get("status") == "failed to grade" else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python -m instructor.gradescope")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the autograder zip to upload to Gradescope")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "gradescope-autograder.zip")
    r = sub.add_parser("run", help="grade one submission the way Gradescope does (called by run_autograder)")
    r.add_argument("--root", type=Path, default=Path(os.environ.get("GRADESCOPE_ROOT") or "/autograder"))
    r.add_argument("--parts", default=os.environ.get("AUTOGRADER_PARTS") or None,
                   help="comma-separated parts (default: all; for checking the set-up only)")
    r.add_argument("--out", type=Path, default=None,
                   help="where to write the results (default: ROOT/results/results.json)")
    sub.add_parser("check", help="setup.sh: fail unless the sandbox isolates the workers "
                   f"(or {WEAK_OK}=1 accepts resource limits only)")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.out))
        return 0
    if a.cmd == "check":
        return check()
    return run_command(a.root, a.parts, a.out)


if __name__ == "__main__":
    sys.exit(run_cli(main))
