"""nbgrader channel: the whole cycle with nbgrader's own API (the code behind its CLI), on a copy of
instructor/nbgrader_course/: generate_assignment, three collected submissions (completed, starter, and completed
with one honest bug), autograde, export (nbgrader's CSV exporter), generate_feedback. Checks that the
points in nbgrader's gradebook are the engine's points for the same code graded as .py files.

To stay within the test budget both channels grade part 1 with the small test module of
autograder_minitests.py (c.EngineGrade.parts / tests_dir); the other parts' test cells then say
"not graded in this run" and score 0. nbgrader itself costs most of the time here: a new gradebook
runs the `alembic` command line once, and every step converts the notebook.
"""
from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.engine import grade, load_rubric
from instructor.make_notebook import NOTEBOOK, file_grade_id, part_grade_id, render
from instructor.nbgrader_channel import extract
from autograder_minitests import MERGE_BUG, write_mini_tests

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "flashattention"


def test_the_source_notebook_is_generated_from_the_solutions():
    assert NOTEBOOK.read_text(encoding="utf-8") == render(), "run: python -m instructor.make_notebook"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    rubric = load_rubric()
    tests = {c.metadata.nbgrader["grade_id"]: c.metadata.nbgrader for c in nb.cells if c.metadata.nbgrader.get("grade")}
    assert tests == {part_grade_id(p.number): {**tests[part_grade_id(p.number)], "points": float(p.points)}
                     for p in rubric.parts}  # one autograded cell per part, worth the rubric's points
    files = {c.metadata.nbgrader["grade_id"] for c in nb.cells if c.metadata.nbgrader.get("solution")}
    assert files == {file_grade_id(f) for f in rubric.all_files()}


pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # inside nbgrader's gradebook


@pytest.fixture(scope="module")
def cycle(tmp_path_factory):
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.plugins import CsvExportPlugin
    from traitlets.config.loader import PyFileConfigLoader

    course = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "instructor" / "nbgrader_course" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "instructor" / "nbgrader_course" / "source", course / "source")
    tests_dir = write_mini_tests(tmp_path_factory.mktemp("minitests"))
    with (course / "nbgrader_config.py").open("a") as f:
        f.write(f"\nc.EngineGrade.parts = [1]\nc.EngineGrade.test_sets = ['public']\n"
                f"c.EngineGrade.tests_dir = {str(tests_dir)!r}\nc.EngineGrade.allow_weak_sandbox = True\n")
    old_path, old_cwd = os.environ.get("PATH", ""), os.getcwd()
    os.environ["PATH"] = f"{Path(os.sys.executable).parent}{os.pathsep}{old_path}"  # nbgrader runs `alembic`
    os.chdir(course)
    try:
        cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
        api = NbGraderAPI(coursedir=CourseDirectory(config=cfg, root=str(course)), config=cfg)
        assert api.generate_assignment(ASSIGNMENT, force=True)["success"]
        released = nbformat.read(course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
        source = nbformat.read(course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
        answers = {c.metadata.nbgrader["grade_id"]: c.source for c in source.cells}

        def completed(extra: str = "") -> nbformat.NotebookNode:
            nb = nbformat.from_dict(released)
            for c in nb.cells:
                if c.metadata.get("nbgrader", {}).get("solution"):
                    c.source = answers[c.metadata.nbgrader["grade_id"]]
                    if c.metadata.nbgrader["grade_id"] == file_grade_id("online_softmax.py"):
                        c.source += extra
            return nb

        submissions = {"complete": completed(), "starter": released, "buggy": completed(MERGE_BUG),
                       "bom": completed()}  # saved by a Windows editor: a BOM and CRLF line ends
        for student, nb in submissions.items():  # what `nbgrader collect` leaves in submitted/
            d = course / "submitted" / student / ASSIGNMENT
            d.mkdir(parents=True)
            nbformat.write(nb, d / f"{ASSIGNMENT}.ipynb")
            if student == "bom":
                path = d / f"{ASSIGNMENT}.ipynb"
                path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
            (d / "timestamp.txt").write_text("2026-01-15 12:00:00.000000 UTC")
        for student in submissions:
            result = api.autograde(ASSIGNMENT, student, force=True)
            assert result["success"], result.get("log", "")[-3000:]
        scores = {}
        with Gradebook(api.coursedir.db_url) as gb:
            for student in submissions:
                nb = gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student)
                scores[student] = {g.name: g.score for g in nb.grades}
            CsvExportPlugin(config=cfg, to=str(course / "grades.csv")).export(gb)
        for student in submissions:
            assert api.generate_feedback(ASSIGNMENT, student, force=True)["success"]
    finally:
        os.chdir(old_cwd)
        os.environ["PATH"] = old_path
    return {"course": course, "scores": scores, "submissions": submissions, "tests_dir": tests_dir}


def _py_channel(impl: Path, tests_dir: Path) -> dict:
    """The .py channel: the files graded like `make grade IMPL=...` (same parts and tests)."""
    return grade(impl, parts=[1], test_sets=("public",), tests_dir=tests_dir)


def test_the_same_code_gets_the_same_points_through_both_channels(cycle, tmp_path):
    # the .py channel on the repository's own files: the completed notebook holds the solutions, the
    # released one the starter; the buggy one is the solutions with merge_partial replaced
    buggy = tmp_path / "buggy"
    buggy.mkdir()
    (buggy / "online_softmax.py").write_text((ROOT / "solutions" / "online_softmax.py").read_text() + MERGE_BUG)
    py = {name: _py_channel(impl, cycle["tests_dir"])
          for name, impl in (("complete", ROOT / "solutions"), ("starter", ROOT / "starter"), ("buggy", buggy))}
    for student, report in py.items():
        assert cycle["scores"][student][part_grade_id(1)] == pytest.approx(report["parts"][0]["points"], abs=1e-4)
    assert py["complete"]["total"] == 15 and py["starter"]["total"] == 0 and 0 < py["buggy"]["total"] < 15
    for student in py:  # parts not graded in this run score 0 (never free points)
        assert all(v == 0 for k, v in cycle["scores"][student].items() if k != part_grade_id(1))


def test_export_and_feedback_show_the_engines_result(cycle):
    rows = {r["student_id"]: r for r in csv.DictReader((cycle["course"] / "grades.csv").open())}
    assert float(rows["complete"]["score"]) == 15.0 and float(rows["starter"]["score"]) == 0.0
    assert float(rows["bom"]["score"]) == 15.0  # graded like the same notebook without the BOM
    assert float(rows["buggy"]["score"]) == pytest.approx(cycle["scores"]["buggy"][part_grade_id(1)])
    html = (cycle["course"] / "feedback" / "starter" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "graded by the course&#39;s engine" in html or "graded by the course's engine" in html
    assert "not implemented yet" in html
    buggy = (cycle["course"] / "feedback" / "buggy" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "merge_partial" in buggy and "FAILED" in buggy


def test_extraction_gives_back_the_files(cycle, tmp_path):
    assert extract(cycle["submissions"]["complete"], tmp_path / "c") == {}
    for f in load_rubric().all_files():  # the completed notebook holds the solution files verbatim
        assert (tmp_path / "c" / f).read_text() == (ROOT / "solutions" / f).read_text().rstrip("\n") + "\n"
    assert extract(cycle["submissions"]["starter"], tmp_path / "s") == {}
    assert "raise NotImplementedError" in (tmp_path / "s" / "online_softmax.py").read_text()


def test_student_code_never_runs_in_a_notebook_kernel(cycle):
    # the autograded notebook's code cells carry no execution counts: nothing was executed in a kernel
    nb = nbformat.read(cycle["course"] / "autograded" / "complete" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    assert all(c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    assert not (cycle["course"] / "autograded" / "complete" / ASSIGNMENT / "submission").exists()


def test_outside_the_repository_without_pythonpath_nbgrader_refuses(tmp_path):
    # the course folder copied elsewhere, nbgrader's own command line, no PYTHONPATH: the config
    # cannot import the engine, so nbgrader must stop non-zero before it touches a notebook
    import subprocess
    import sys

    course = tmp_path / "course"
    shutil.copytree(ROOT / "instructor" / "nbgrader_course", course)
    d = course / "submitted" / "untouched" / ASSIGNMENT
    d.mkdir(parents=True)
    shutil.copy(course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", d)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", ASSIGNMENT, "--force"], cwd=course,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cannot import the course's grading engine" in r.stderr and "PYTHONPATH" in r.stderr
    assert not (course / "autograded").exists() and not (course / "gradebook.db").exists()

    # with the engine importable but no sandbox that isolates the workers: refused too, unless allowed
    from instructor.sandbox import detect

    if detect().mode.startswith("rlimits-only"):
        nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
        subprocess.run(nbgrader + ["generate_assignment", ASSIGNMENT, "--force"], cwd=course, check=True,
                       env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=300)
        r = subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", ASSIGNMENT, "--force"],
                           cwd=course, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and "sandbox not available" in r.stdout + r.stderr
        assert not (course / "autograded" / "untouched" / ASSIGNMENT).exists()  # nbgrader removed the failed one


def test_a_test_cell_run_plainly_raises(tmp_path):
    # a test cell run as it is raises (so a plain kernel run fails it); this is no defence on its own,
    # see the input-transformer tests below: the defence is the kit's config, outside the kernel
    import subprocess
    import sys

    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert len(cells) == len(load_rubric().parts)
    for cell in cells:
        r = subprocess.run([sys.executable, "-I", "-c", cell.source], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and "AssertionError" in r.stderr and "nbgrader_config.py" in r.stderr
    assert "grade this notebook only with the course kit's `nbgrader_config.py`" in nb.cells[0].source


# ---------------------------------------------------------------------------------------------------
# A student's cell that makes the kernel skip the test cells (nothing in a kernel the student controls
# can defend): with the kit's config no kernel run scores, even with the preprocessor list replaced.

HACK = ("ip = get_ipython()\n"
        "ip.input_transformers_cleanup.append(lambda lines: ['pass\\n'] if any('graded by the course engine' in l "
        "for l in lines) else lines)\n")


def _submit_attack(course: Path, student: str) -> None:
    """The released (starter) notebook with the hack as a cell of the student's own, after the intro."""
    from nbformat.v4 import new_code_cell

    nb = nbformat.read(course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    nb.cells.insert(1, new_code_cell(HACK))
    d = course / "submitted" / student / ASSIGNMENT
    d.mkdir(parents=True)
    nbformat.write(nb, d / f"{ASSIGNMENT}.ipynb")
    (d / "timestamp.txt").write_text("2026-01-15 12:00:00.000000 UTC")


def _scores(course: Path, student: str) -> dict:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            nb = gb.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student)
        except MissingEntry:
            return {}
        return {g.name: g.score for g in nb.grades}


def _nbgrader(course: Path, *args: str) -> "subprocess.CompletedProcess":
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(Path(sys.executable).parent / "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)


OVERRIDE = "--Autograde.autograde_preprocessors=['nbgrader.preprocessors.Execute','nbgrader.preprocessors.SaveAutoGrades']"


def test_the_input_transformer_attack_scores_0_with_the_kits_config(cycle):
    course = cycle["course"]
    _submit_attack(course, "mallory")
    r = _nbgrader(course, "autograde", ASSIGNMENT, "--student", "mallory", "--force")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    scores = _scores(course, "mallory")
    assert scores and all(v == 0 for v in scores.values()), scores


def test_a_preprocessor_override_on_the_command_line_starts_no_kernel(cycle):
    course = cycle["course"]
    _submit_attack(course, "mallory_cli")
    r = _nbgrader(course, "autograde", ASSIGNMENT, "--student", "mallory_cli", "--force", OVERRIDE)
    log = r.stdout + r.stderr
    assert r.returncode != 0 and "No such kernel" in log, log[-3000:]
    assert not any(_scores(course, "mallory_cli").values()), "no points from a failed run"


def test_the_gradebook_takes_only_the_engines_points(cycle, tmp_path):
    """Whatever runs instead of EngineGrade (here: a preprocessor that writes full marks into every
    test cell, the best a kernel run could do), SaveAutoGrades stores 0 for a cell the engine did not
    grade; with EngineGrade in the list the engine's points are stored (the cycle above)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.preprocessors import NbGraderPreprocessor, SaveAutoGrades
    from nbformat.v4 import new_output
    from traitlets.config.loader import PyFileConfigLoader

    class FullMarks(NbGraderPreprocessor):
        def preprocess_cell(self, cell, resources, index):
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                full = repr(float(cell.metadata["nbgrader"]["points"]))
                cell.outputs = [new_output("execute_result", data={"text/plain": full}, execution_count=1)]
            return cell, resources

    course = cycle["course"]
    _submit_attack(course, "mallory_forge")
    old_cwd = os.getcwd()
    os.chdir(course)
    try:
        cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
        cfg.Autograde.autograde_preprocessors = [FullMarks, SaveAutoGrades]
        api = NbGraderAPI(coursedir=CourseDirectory(config=cfg, root=str(course)), config=cfg)
        assert api.autograde(ASSIGNMENT, "mallory_forge", force=True)["success"]
    finally:
        os.chdir(old_cwd)
    scores = _scores(course, "mallory_forge")
    assert scores and all(v == 0 for v in scores.values()), scores
    assert cycle["scores"]["complete"][part_grade_id(1)] == 15, "the engine's own points still go through"


def test_even_a_real_kernel_forced_on_the_command_line_scores_0(cycle):
    """The attack as the tester ran it, with the kernel forced back on: the kernel runs the hack (the
    test cells are skipped, nbgrader would give full marks) and the gradebook still gets 0."""
    from jupyter_client.kernelspec import find_kernel_specs

    if "python3" not in find_kernel_specs():
        pytest.skip("no python3 Jupyter kernel installed")
    course = cycle["course"]
    _submit_attack(course, "mallory_kernel")
    r = _nbgrader(course, "autograde", ASSIGNMENT, "--student", "mallory_kernel", "--force", OVERRIDE,
                  "--NotebookClient.kernel_name=python3", "--ExecutePreprocessor.kernel_name=python3",
                  "--Execute.kernel_name=python3")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    graded = nbformat.read(course / "autograded" / "mallory_kernel" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    tests = [c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests and not any(o.output_type == "error" for c in tests for o in c.outputs), \
        "the hack worked in the kernel: without the guard these cells would score full marks"
    scores = _scores(course, "mallory_kernel")
    assert scores and all(v == 0 for v in scores.values()), scores
    assert "refusing" in r.stdout + r.stderr and "not the course engine's grade" in r.stdout + r.stderr


def test_a_refused_regrade_leaves_no_earlier_grade_standing(cycle):
    """An outside instructor: a notebook graded 100 was replaced by the untouched one and re-graded where
    the sandbox was refused; nbgrader exited 1 but `nbgrader export` still gave the old 100. A refused
    run now turns this notebook's stored autograded scores into 'not graded' before it stops."""
    course = cycle["course"]
    d = course / "submitted" / "regraded" / ASSIGNMENT
    d.mkdir(parents=True)
    nbformat.write(cycle["submissions"]["complete"], d / f"{ASSIGNMENT}.ipynb")
    (d / "timestamp.txt").write_text("2026-01-15 12:00:00.000000 UTC")
    r = _nbgrader(course, "autograde", ASSIGNMENT, "--student", "regraded", "--force")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert _scores(course, "regraded")[part_grade_id(1)] == 15
    nbformat.write(cycle["submissions"]["starter"], d / f"{ASSIGNMENT}.ipynb")
    r = _nbgrader(course, "autograde", ASSIGNMENT, "--student", "regraded", "--force", "--EngineGrade.sandbox=bogus")
    assert r.returncode != 0 and "unknown sandbox mode 'bogus'" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    scores = _scores(course, "regraded")
    assert scores and not any(scores.values()), scores


def _engine_config(**kw):
    from types import SimpleNamespace

    base = dict(sandbox="auto", allow_weak_sandbox=True, parts=[1], test_sets=["public"], limits={}, tests_dir="")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("mistake", [dict(tests_dir="/nonexistent/tests"), dict(limits={"call_timeout_s": 0.001}),
                                     dict(parts=[9])])
def test_options_the_reference_fails_with_stop_nbgrader_before_any_notebook(mistake):
    """The batch's own set-up check, in the nbgrader channel: options with which the reference
    solutions do not score full marks (a wrong tests_dir, limits or parts) would give every student
    0 with exit status 0; they stop the run with one line instead (SystemExit passes nbgrader's
    per-notebook error handling), and the refusal is remembered, not re-graded per student."""
    from instructor import nbgrader_channel

    cfg = _engine_config(**mistake)
    with pytest.raises(SystemExit, match=r"^error: (the reference solutions score|grading the reference solutions "
                                         r"failed).*c\.EngineGrade's options") as first:
        nbgrader_channel.checked_options(cfg)
    assert "\n" not in str(first.value)
    with pytest.raises(SystemExit) as again:
        nbgrader_channel.checked_options(cfg)
    assert str(again.value) == str(first.value)


def test_the_checked_options_scale_the_call_time_limits_once_per_run(tmp_path):
    from instructor import nbgrader_channel

    cfg = _engine_config(tests_dir=str(write_mini_tests(tmp_path / "mini")))
    options = nbgrader_channel.checked_options(cfg)
    limits = options.limits["call_timeouts"]
    assert limits and all(v >= 5.0 for v in limits.values())  # the batch's floor
    options.limits["call_timeouts"]["x"] = 1.0  # a caller's change does not reach the next notebook
    assert "x" not in nbgrader_channel.checked_options(cfg).limits["call_timeouts"]


def test_a_bom_before_the_writefile_magic_is_ignored(tmp_path):
    """A cell pasted from a Windows editor starts with U+FEFF: the %%writefile line is still the
    magic (not a line of the graded file, which would then be invalid Python)."""
    from nbformat.v4 import new_code_cell, new_notebook

    name = "online_softmax.py"
    code = (ROOT / "solutions" / name).read_text()
    cell = new_code_cell("\ufeff%%writefile submission/" + name + "\n" + code,
                         metadata={"nbgrader": {"grade_id": file_grade_id(name), "solution": True, "grade": False}})
    problems = extract(new_notebook(cells=[cell]), tmp_path / "out", [name])
    assert problems == {} and (tmp_path / "out" / name).read_text() == code


def _solution_cell(name: str, source: str):
    from nbformat.v4 import new_code_cell

    return new_code_cell(source, metadata={"nbgrader": {"grade_id": file_grade_id(name), "solution": True,
                                                        "grade": False}})


def test_extraction_writes_what_running_the_notebook_top_to_bottom_writes(tmp_path):
    """Appends (-a, --append), a second %%writefile of a file in a later cell (not its solution cell),
    indented cells, quoted names, a cell without a final newline: the graded files are the files that
    IPython itself writes when it runs the cells in order (checked by running them in IPython)."""
    import json
    import subprocess
    import sys

    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    a, b = "online_softmax.py", "flash_forward.py"
    cells = [
        new_code_cell("import os\nos.makedirs('submission', exist_ok=True)\n"),
        _solution_cell(a, f"%%writefile submission/{a}\ndef first():\n    return 1"),  # no final newline
        new_markdown_cell("%%writefile submission/" + a + "\nnot code"),  # markdown: writes nothing
        new_code_cell(f"%%writefile -a submission/{a}\n\ndef second():\n    return 2\n"),
        _solution_cell(b, f"%%writefile submission/{b}\ndef draft():\n    raise NotImplementedError\n"),
        new_code_cell(f"\n\n  %%writefile './submission/{b}'\n  def final():\n      return 3\n"),  # replaces it
        new_code_cell(f'%%writefile --append "submission/{b}"\nFINAL = final()\n'),
        new_code_cell("print('a cell that writes nothing')\n"),
        new_code_cell(f"%%writefile -a submission/{a}\ndef third():\n    return first() + second()\n"),
    ]
    problems = extract(new_notebook(cells=cells), tmp_path / "graded", [a, b])
    assert problems == {}
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "cells.json").write_text(json.dumps([c.source for c in cells if c.cell_type == "code"]))
    script = ("import json, sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
              "shell = InteractiveShell.instance()\n"
              "for src in json.load(open(sys.argv[1])):\n"
              "    assert shell.run_cell(src).success, src\n")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cells.json")], cwd=run, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in (a, b):
        assert (tmp_path / "graded" / name).read_bytes() == (run / "submission" / name).read_bytes(), name
    assert "def draft" not in (tmp_path / "graded" / b).read_text()  # the later cell's file, not the solution cell's


@pytest.mark.parametrize("line, want", [
    ("%%writefile submission/{name{", "cannot be told"), ("%%writefile $target", "cannot be told"),
    ("%%writefile -x submission/online_softmax.py", "does not take"),
    ("%%writefile submission/online_softmax.py extra.py", "exactly one file"),
    ("%%writefile submission\\online_softmax.py", "backslash"),
    ("%%writefile online_softmax.py", "not submission/online_softmax.py"),
    ("%%writefile /tmp/submission/online_softmax.py", "not submission/online_softmax.py"),
])
def test_a_writefile_the_extraction_cannot_follow_is_refused_naming_the_cell(tmp_path, line, want):
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    from instructor.nbgrader_channel import take_notebook

    name = "online_softmax.py"
    code = (ROOT / "solutions" / name).read_text()
    nb = new_notebook(cells=[new_markdown_cell("intro"), _solution_cell(name, f"%%writefile submission/{name}\n{code}"),
                             new_code_cell(f"{line}\nx = 1\n")])
    problems = extract(nb, tmp_path / "out", [name])
    assert want in problems.get(name, "") and "cell 3" in problems[name], problems
    assert not (tmp_path / "out" / name).exists()
    sub = take_notebook(nb, tmp_path / "out2")
    computed = "$" in line or "{" in line  # the cell may write any file: every graded file is refused
    want_rejected = sorted(load_rubric().all_files()) if computed else [name]
    assert sorted(n for n, _ in sub.rejected) == want_rejected and name not in sub.files


def test_a_solution_cell_that_lost_its_writefile_line_is_named(tmp_path):
    from nbformat.v4 import new_notebook

    from instructor.nbgrader_channel import take_notebook

    name = "online_softmax.py"
    nb = new_notebook(cells=[_solution_cell(name, (ROOT / "solutions" / name).read_text())])
    problems = extract(nb, tmp_path / "out", [name])
    assert ("its solution cell, cell 1 (file_online_softmax), must start with `%%writefile submission/online_softmax.py`"
            in problems[name]), problems
    assert name in take_notebook(nb, tmp_path / "out2").missing


@pytest.mark.parametrize("mode, said", [("bubblewrap", "sandbox mode 'bubblewrap' is not available"),
                                        ("bogus", "unknown sandbox mode 'bogus'")])
def test_a_sandbox_mode_asked_for_that_is_not_available_refuses(mode, said, monkeypatch):
    """c.EngineGrade.sandbox names the mode: one that cannot run here (bubblewrap without bwrap) or a
    typo refuses before the reference is graded, never falls back to another mode."""
    from types import SimpleNamespace

    from instructor import nbgrader_channel

    monkeypatch.setenv("GRADER_BWRAP", "/nonexistent/bwrap")
    cfg = SimpleNamespace(sandbox=mode, allow_weak_sandbox=False, parts=[6], test_sets=["public"], limits={},
                          tests_dir="")
    why = nbgrader_channel._check_setup(cfg)
    assert isinstance(why, str) and why.startswith("sandbox not available") and said in why, why
    assert "\n" not in why


def test_a_notebook_of_any_shape_is_read_without_a_traceback(tmp_path):
    """A student can edit the notebook's JSON: cells, metadata and the nbgrader entry may hold any value.
    extract reads what it can (a cell with odd metadata is still a %%writefile cell); the command line
    refuses a file that is not a notebook in one line, exit status 2."""
    import subprocess
    import sys

    name = "online_softmax.py"
    code = (ROOT / "solutions" / name).read_text()
    odd = [{"cell_type": "code", "metadata": {"nbgrader": "x"}, "source": f"%%writefile submission/{name}\n{code}",
            "outputs": [], "execution_count": None},
           {"cell_type": "code", "metadata": [], "source": 7, "outputs": [], "execution_count": None},
           {"cell_type": "code", "metadata": {"nbgrader": {"grade_id": ["x"], "solution": True}}, "source": ["x = 1\n"]},
           "not a cell"]
    nb = nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": odd})
    problems = extract(nb, tmp_path / "out", [name])
    assert problems == {} and (tmp_path / "out" / name).read_text() == code
    for label, text in {"a list": "[]", "deep": "[" * 100_000, "no cells": '{"nbformat": 4, "cells": 3}'}.items():
        path = tmp_path / f"{label}.ipynb"
        path.write_text(text)
        run = subprocess.run([sys.executable, "-m", "instructor.nbgrader_channel", "extract", str(path), "--out",
                              str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert run.returncode == 2 and "Traceback" not in run.stderr, (label, run.stderr[-500:])
        assert run.stderr.startswith("error: not a Jupyter notebook") and run.stderr.count("\n") == 1, (label, run.stderr)
