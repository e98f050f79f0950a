"""Every command line of the grader and the instructor tools answers bad input with ONE line,
"error: ... (what to do)", and a non-zero exit status, never a traceback; and refuses an output
path it cannot write BEFORE it does any work. The Makefiles pass paths as one shell word.

- autograder.grade: --json a folder / below a file / in a folder that cannot be made, --jobs < 1,
  an unknown part; the report file is optional (a write that fails is one warning, and the exit
  status is the grade's); a copy without the hidden tests refuses --tests hidden/all, and a
  hidden set that brings no tests is shown as a problem, never as a silent 0.
- instructor.batch (grade and merge) and instructor.redteam: an --out they cannot create or
  write is refused before the reference (or anyone) is graded.
- make grade IMPL="my work" (the repository's Makefile and the student release's).
"""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from autograder import grade
from autograder.grade import run_cli

ROOT = Path(__file__).resolve().parent.parent
NO_DIR = Path("/proc/no-such-dir/sub")  # mkdir fails there, also for root (permissions would not stop root)


def _one_line(main, argv, capsys) -> str:
    """run_cli(main, argv) refuses: status non-zero, exactly one line on stderr, 'error: ...', no traceback."""
    try:
        code = run_cli(main, argv)
    except SystemExit as e:  # argparse's exit, or a tool's SystemExit("error: ...") (Python prints the text)
        code = e.code
    err = capsys.readouterr().err
    if isinstance(code, str):
        err, code = err + code + "\n", 1
    assert code not in (0, None), (argv, code, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "afile"
    f.write_text("x")
    return f


@pytest.fixture
def no_grading(monkeypatch):
    """Any grading from here on fails the test: a refusal must come before it."""
    def boom(*a, **k):
        raise AssertionError("graded before the command line was checked")

    import autograder.engine
    import instructor.batch as batch

    monkeypatch.setattr(autograder.engine, "grade_for_student", boom, raising=False)
    for name in ("reference_score", "scaled_call_timeouts", "run_engine", "_grade_all"):
        monkeypatch.setattr(batch, name, boom)


# ---------------------------------------------------------------------------------------------
# autograder.grade


def test_grade_refuses_bad_arguments_in_one_line_before_grading(tmp_path, a_file, capsys, no_grading):
    (tmp_path / "build").mkdir()
    cases = {
        ("--json", str(tmp_path / "build")): "is a folder",
        ("--json", str(a_file / "r.json")): "is a file, not a folder",
        ("--json", str(NO_DIR / "r.json")): "cannot be created",
        ("--jobs", "0"): "--jobs must be at least 1", ("--jobs", "-1"): "--jobs must be at least 1",
        ("--jobs", "x"): "whole number", ("--part", "9"): "no part 9", ("--tests", "secret"): "invalid choice",
        ("--impl", str(tmp_path / "nope")): "is not a folder", ("--impl", str(a_file)): "is not a folder",
    }
    for args, want in cases.items():
        argv = ["--impl", "starter", *args] if args[0] != "--impl" else list(args)
        assert want in _one_line(grade.main, argv, capsys), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "build"]  # nothing written


def test_grade_and_debug_find_the_repositorys_folders_from_any_folder(tmp_path, monkeypatch, capsys, no_grading):
    """`python -m autograder.grade` run from another folder: the default --impl starter (and any relative
    folder that is not there) is the repository's; a folder that is in neither place is named with
    both places, and only the folders this copy ships are suggested."""
    from autograder import debug

    monkeypatch.chdir(tmp_path)
    assert grade.implementation_folder("starter") == ROOT / "starter"
    (tmp_path / "starter").mkdir()  # one of the current folder's goes first
    assert grade.implementation_folder("starter") == Path("starter")
    err = _one_line(grade.main, ["--impl", "nope", "--part", "1"], capsys)
    assert f"nope is not a folder (in {tmp_path}, nor in {ROOT}); use --impl starter, --impl solutions or your " \
           "own folder" in err, err
    assert debug.main(["--impl", "nope"]) == 2 and "nor in" in capsys.readouterr().err
    monkeypatch.setattr(grade, "REPO", tmp_path)  # a student release ships no solutions/
    assert "use --impl starter or your own folder" in _one_line(grade.main, ["--impl", "nope"], capsys)


def test_a_copy_without_the_hidden_tests_refuses_them_in_one_line(tmp_path, monkeypatch, capsys, no_grading):
    """A student release has no instructor/hidden_tests: --tests hidden or all must not show a score."""
    from autograder.engine import runner

    monkeypatch.setattr(runner, "DEFAULT_HIDDEN_DIR", tmp_path / "instructor" / "hidden_tests")
    for tests in ("hidden", "all"):
        err = _one_line(grade.main, ["--impl", "solutions", "--part", "1", "--tests", tests], capsys)
        assert "hidden tests are not in this copy" in err and "--tests public" in err


def test_withheld_points_are_explained_and_the_report_file_is_optional(tmp_path, monkeypatch, capsys):
    """A hidden set that brings no tests withholds the part's points: the student sees why (not
    'first failure: ?'); and a report that cannot be written is one warning line, exit status unchanged."""
    from autograder.engine import runner

    empty = tmp_path / "hidden_tests"
    empty.mkdir()
    (empty / "__init__.py").write_text("")
    monkeypatch.setattr(runner, "DEFAULT_HIDDEN_DIR", empty)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(grade, "DEFAULT_REPORT", tmp_path / "afile" / "grade-report.json")  # cannot be written
    code = run_cli(grade.main, ["--impl", "solutions", "--part", "1", "--tests", "all"])
    out = capsys.readouterr()
    assert code == 1  # the points are withheld: not a pass
    assert "first failure: ?" not in out.out and "points are withheld" in out.out, out.out
    assert "grading problem: part 1: no hidden tests were collected" in out.out
    assert out.err.count("\n") == 1 and out.err.startswith("warning: the report was not written"), out.err
    monkeypatch.setattr(runner, "DEFAULT_HIDDEN_DIR", tmp_path / "missing")
    code = run_cli(grade.main, ["--impl", "solutions", "--part", "1"])  # public only: passes, report not written
    out = capsys.readouterr()
    assert code == 0 and out.err.startswith("warning: the report was not written"), (code, out.err)
    assert "Traceback" not in out.out + out.err


# ---------------------------------------------------------------------------------------------
# instructor.batch, merge, redteam


def test_batch_and_merge_refuse_an_out_they_cannot_write_before_grading(tmp_path, a_file, capsys, no_grading):
    from instructor.batch import main

    subs = tmp_path / "subs"
    (subs / "ann").mkdir(parents=True)
    (subs / "ann" / "online_softmax.py").write_text("x = 1\n")
    for out, want in ((a_file / "sub", "is a file, not a folder"), (NO_DIR, "cannot be created"),
                      (a_file, "is a file")):
        assert want in _one_line(main, [str(subs), "--out", str(out), "--sandbox", "off", "--allow-weak-sandbox"],
                                 capsys), out
        assert want in _one_line(main, ["merge", str(subs), "--out", str(out)], capsys), out


def test_redteam_assemble_refuses_a_folder_it_cannot_write(tmp_path, a_file, capsys):
    from instructor.redteam.__main__ import main

    for dest, want in ((NO_DIR, "cannot be created"), (a_file / "x", "is a file, not a folder"),
                       (a_file, "is not a folder"), (ROOT / "instructor", "is not empty")):
        assert want in _one_line(main, ["assemble", str(dest)], capsys), dest
    assert a_file.read_text() == "x"


def test_run_cli_turns_expected_errors_into_one_line(capsys):
    def raising(exc):
        def main(argv):
            raise exc
        return main

    for exc in (PermissionError(13, "Permission denied", "build"), IsADirectoryError(21, "Is a directory", "x"),
                ValueError("bad value\nsecond line"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid"),
                grade.UsageError("no such thing; do this")):
        _one_line(raising(exc), [], capsys)
    with pytest.raises(SystemExit):  # argparse's and the tools' own refusals pass through
        run_cli(raising(SystemExit("error: x")), [])


# ---------------------------------------------------------------------------------------------
# Makefiles: a path with a space or a quote is one word


def _dry_run(makefile: Path, *args: str) -> list[list[str]]:
    r = subprocess.run(["make", "-n", "-s", "-f", str(makefile), *args], cwd=makefile.parent, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [shlex.split(line) for line in r.stdout.splitlines() if " -m " in line or "--impl" in line]


WEIRD = "it's my work $x"


def _values(words: list[str], flag: str) -> list[str]:
    """What `flag` gets in one command line: `--flag VALUE` or `--flag=VALUE` (the Makefiles' form: a
    value that starts with a dash is still the flag's)."""
    return [words[i + 1] if w == flag else w[len(flag) + 1:] for i, w in enumerate(words)
            if w == flag or w.startswith(flag + "=")]


def _words_after(lines: list[list[str]], module: str, flag: str) -> list[str]:
    found = [v for w in lines if module in w or _values(w, module) for v in _values(w, flag)]
    assert found, lines
    return found


@pytest.mark.skipif(subprocess.run(["make", "--version"], capture_output=True).returncode != 0, reason="no make")
def test_the_makefiles_pass_every_path_as_one_word():
    repo = ROOT / "Makefile"
    for target in ("grade", "grade-ci", "debug"):
        lines = _dry_run(repo, target, f"IMPL={WEIRD}", "PART=1")
        mod = "autograder.debug" if target == "debug" else "autograder.grade"
        assert _words_after(lines, mod, "--impl") == ["it's my work "], lines  # make expands $x itself
        dashed = _dry_run(repo, target, "IMPL=-my work", "PART=1")  # a folder named with a leading dash
        assert _words_after(dashed, mod, "--impl") == ["-my work"] and not any("-my work" in w for w in dashed)
    lines = _dry_run(repo, "autograde", "SUBMISSIONS=my subs", "OUT=my out")
    assert _words_after(lines, "instructor.batch", "--out") == ["my out"] and ["my subs"] == [
        w[w.index("instructor.batch") + 1] for w in lines if "instructor.batch" in w]
    assert _words_after(_dry_run(repo, "release", "RELEASE_DIR=a b"), "instructor.release",
                        "--out") == ["a b"]
    demos = _dry_run(repo, "demos", "IMPL=my work")
    assert _words_after(demos, "--impl", "--impl") == ["my work"] * len(demos)


@pytest.mark.skipif(subprocess.run(["make", "--version"], capture_output=True).returncode != 0, reason="no make")
def test_the_student_release_makefile_passes_impl_as_one_word(tmp_path):
    from instructor import release

    student = tmp_path / "release" / "Makefile"
    student.parent.mkdir()
    student.write_text(release.MAKEFILE.format(python=release.PYTHON, torch_index=release.TORCH_CPU_INDEX))
    for target in ("grade", "grade-ci", "debug", "demos"):
        lines = _dry_run(student, target, "IMPL=my work", "PART=1", "PY=python3")
        assert set(_words_after(lines, "--impl" if target == "demos" else "-m", "--impl")) == {"my work"}, lines
