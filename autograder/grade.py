"""`make grade`: grade an implementation folder and print the feedback.

    python -m autograder.grade --impl starter [--part 2] [--tests public|hidden|all] [--json PATH] [--jobs N]

Prints a table (part, tests passed, points), then the first failure of each part; writes the same
report as JSON (build/grade-report.json by default). Exits 0 only if every graded test passed.

A mistake on the command line, or a path that cannot be used, is ONE line on stderr,
"error: ... (what to do)", and exit status 2, never a traceback. The report file is optional:
when it cannot be written, one warning line says so and the exit status is the grade's.

The command-line plumbing here (Parser, run_cli, UsageError, writable_folder, writable_file) is
shared by every command line of the kit (instructor.batch, instructor.redteam, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

DEFAULT_REPORT = Path("build/grade-report.json")
REPO = Path(__file__).resolve().parent.parent  # the repository this grader belongs to


def implementation_folder(given: str, flag: str = "--impl") -> Path:
    """The folder `given` names: a relative path is the current folder's, or else the repository's (the
    default `starter` from another folder: `make` runs from the repository, `python -m` may not).
    UsageError, naming where it looked and the folders that are there, when neither is a folder."""
    path = Path(given).expanduser()
    if path.is_dir():
        return path
    if not path.is_absolute() and (REPO / path).is_dir():
        return REPO / path
    where = "" if path.is_absolute() else f" (in {Path.cwd()}, nor in {REPO})"
    shipped = [f"{flag} {name}" for name in ("starter", "solutions") if (REPO / name).is_dir()]
    raise UsageError(f"{given} is not a folder{where}; use {', '.join(shipped)} or your own folder")


# ---------------------------------------------------------------------------------------------
# command-line plumbing: bad input is one line, never a traceback


class UsageError(Exception):
    """Something the user asked for cannot be done; the message says what and what to do.
    run_cli prints it as one line "error: <message>" and exits 2."""


def _line(text: object, limit: int = 400) -> str:
    """One printable line (the message may hold a path or a name the user chose)."""
    from autograder.engine import sanitize

    return sanitize.line(str(text), limit)


def os_error_text(e: OSError) -> str:
    """An OSError as "PATH: reason" (strerror), without the Errno clutter."""
    why = e.strerror or type(e).__name__
    names = [str(n) for n in (e.filename, getattr(e, "filename2", None)) if n is not None]
    return f"{' -> '.join(names)}: {why}" if names else why


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is ONE line on stderr (what is wrong, what to do), exit status 2."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"error: {_line(message, 300)} (see {self.prog} --help)\n")


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= 1 (a count of processes, judges, ...)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a whole number, not {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, not {value}")
        return value
    return parse


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a command-line entry point so that an expected failure is one line on stderr and a
    non-zero status, never a traceback: UsageError (what the user asked for), OSError (a path
    that cannot be read or written), ValueError (a value that makes no sense), and Ctrl-C.
    SystemExit passes through (argparse's and the tools' own one-line refusals)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("error: interrupted (run the command again to finish)", file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"error: {_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {_line(os_error_text(e))} (check the path, that it is the right kind (file or folder) "
              "and that you may read or write it)", file=sys.stderr)
        return 2
    except ValueError as e:  # UnicodeError included
        print(f"error: {_line(f'{type(e).__name__}: {e}' if not str(e) else e)} (check the command line)",
              file=sys.stderr)
        return 2


def _nearest_existing(path: Path) -> tuple[Path, list[Path]]:
    """The nearest ancestor of `path` (or itself) that exists, and the missing levels below it."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    return p, missing[::-1]


def writable_folder(path: Path, flag: str) -> None:
    """Refuse (UsageError) a folder that cannot be created and written: the check makes the missing
    levels, writes and removes a probe file, and removes the levels it made, so that a command can
    refuse before it has done any work (graded anyone) rather than fail at its first write."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"{flag} {path} is not a folder (a file or a broken link is there); pass a folder "
                         "(it is created if missing)")
    base, missing = _nearest_existing(path)
    if not base.is_dir():
        raise UsageError(f"{flag} {path} cannot be created: {base} is a file, not a folder; choose another folder")
    made: list[Path] = []
    try:
        for p in missing:
            p.mkdir()
            made.append(p)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        what = "written" if not missing else "created"
        raise UsageError(f"{flag} {path} cannot be {what} ({e.strerror or type(e).__name__}); "
                         f"choose a folder you may write") from None
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass


def writable_file(path: Path, flag: str) -> None:
    """Refuse (UsageError) a file path that cannot be written: a folder, a path below a file, a
    file or folder without write permission. Nothing is left behind."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder; pass a file name, e.g. {path / 'report.json'}")
    if os.path.lexists(path):  # a file to replace (or a device such as /dev/null)
        try:
            with open(path, "ab"):  # opens for writing, changes nothing
                pass
        except OSError as e:
            raise UsageError(f"{flag} {path} cannot be written ({e.strerror}); pass another file name") from None
        return
    base, _ = _nearest_existing(path.parent)
    if not base.is_dir():
        raise UsageError(f"{flag} {path} cannot be created: {base} is a file, not a folder; pass another file name")
    try:
        writable_folder(path.parent, "the folder")
    except UsageError as e:
        raise UsageError(f"{flag} {path}: {e}") from None


# ---------------------------------------------------------------------------------------------


def _hidden_tests_dir() -> Path:
    from autograder.engine import runner

    return Path(runner.DEFAULT_HIDDEN_DIR)


def _write_report(path: Path, report: dict) -> bool:
    """Write the JSON report; on failure one warning line (the grade printed above stands)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return True
    except OSError as e:
        print(f"warning: the report was not written ({_line(os_error_text(e))}); the grade above stands "
              "(pass --json PATH to write it elsewhere)", file=sys.stderr)
        return False


def _withheld_problems(report: dict, view: dict) -> list[str]:
    """The report's problems that the student view leaves out (those that name hidden tests), as
    lines a student may read: a problem with the test sets themselves is shown; what a hidden test
    did is only counted. A view never hides that something went wrong."""
    from autograder.engine.runner import HIDDEN_ERROR_PREFIX

    shown = set(view.get("errors") or [])
    dropped = [e for e in report.get("errors") or [] if _line(e, 500) not in shown]
    lines = [e for e in dropped if not e.startswith(HIDDEN_ERROR_PREFIX)]
    n = len(dropped) - len(lines)
    if n:
        lines.append(f"{n} hidden test(s) could not run (their details are not shown)")
    return [_line(e, 500) for e in lines]


def _name_withheld_parts(view: dict, problems: list[str]) -> None:
    """A part that did not pass but has no failing test to show (its points were withheld: a test
    set brought no tests) says why on its own line instead of "first failure: ?"."""
    for part in view.get("parts", []):
        if part.get("status") == "ok" or part.get("first_failure") or not part.get("total"):
            continue
        mine = [p for p in [*(view.get("errors") or []), *problems] if p.startswith(f"part {part['part']}:")]
        part["first_failure"] = {"test": "none (the part's points are withheld)",
                                 "message": "\n".join(mine) or "see the grading problems below"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python -m autograder.grade", description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default="starter", help="folder with the graded files (default: starter)")
    ap.add_argument("--part", type=int, action="append", help="grade only this part (repeatable)")
    ap.add_argument("--tests", choices=["public", "hidden", "all"], default="public",
                    help="which test sets to run (default: public)")
    ap.add_argument("--json", type=Path, default=None,
                    help=f"where to write the report (default: {DEFAULT_REPORT}, skipped with a warning if "
                         "it cannot be written)")
    ap.add_argument("--jobs", type=positive_int("--jobs"), default=1,
                    help="grade the parts in up to N processes at once (default 1)")
    ap.add_argument("--show-hidden", action="store_true",
                    help="instructors: do not redact hidden-test failures in the feedback")
    args = ap.parse_args(argv)
    impl = implementation_folder(args.impl)
    if args.json is not None:  # asked for: checked before grading, not after
        writable_file(args.json, "--json")
    from autograder.engine.rubric import RubricError, load_rubric

    try:
        rubric = load_rubric()
        for n in args.part or []:
            rubric.part(n)
    except RubricError as e:
        raise UsageError(f"{e} (check --part)") from None
    sets = ("public", "hidden") if args.tests == "all" else (args.tests,)
    if "hidden" in sets and not _hidden_tests_dir().is_dir():
        raise UsageError("the hidden tests are not in this copy: they are the instructor's; use --tests public")
    if args.jobs <= 1:
        from autograder.engine.processes import Zygote

        Zygote.prestart()  # its torch import overlaps the judge's (~0.5 s of a grade)

    from autograder.engine import grade_for_student
    from autograder.engine.feedback import print_report

    report, view = grade_for_student(impl, parts=args.part, test_sets=sets, jobs=args.jobs,
                                     redact_sets=() if args.show_hidden else ("hidden",))
    problems = _withheld_problems(report, view)
    _name_withheld_parts(view, problems)
    print_report(view)
    for p in problems:
        print(f"grading problem: {p}")
    path = args.json or DEFAULT_REPORT
    where = f"report: {path}  " if _write_report(path, report) else ""
    print(f"{where}({report['timing']['wall_s']:.1f} s)")
    all_passed = all(t["outcome"] == "passed" for t in report["tests"]) and not report["errors"] and report["tests"]
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
