"""Gradescope: build the autograder zip, then run its run_autograder in a folder laid out like
Gradescope's /autograder (GRADESCOPE_ROOT moves it; AUTOGRADER_PYTHON points at this venv instead of
the venv that setup.sh would make; AUTOGRADER_PARTS=1 keeps the run short)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder.engine import grade
from autograder.engine.runner import grade_for_student, student_view

ROOT = Path(__file__).resolve().parent.parent
BUG = '''

def merge_partial(a, b):  # an honest mistake: the outputs are added without rescaling
    (ma, la, oa), (mb, lb, ob) = a, b
    return torch.maximum(ma, mb), la + lb, oa + ob
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("gs") / "gradescope-autograder.zip"
    r = subprocess.run([sys.executable, "-m", "instructor.gradescope", "build", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def test_the_zip_has_what_gradescope_runs_and_no_solutions(built, tmp_path):
    with zipfile.ZipFile(built) as z:
        names = z.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert {"setup.sh", "run_autograder", "requirements.txt", "requirements.lock"} <= set(names)
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    hidden = sorted(p.name for p in (ROOT / "instructor" / "hidden_tests").glob("part*.py"))
    public = sorted(p.name for p in (ROOT / "autograder" / "tests").glob("test_*.py"))
    assert hidden and all(f"instructor/hidden_tests/{h}" in names for h in hidden)
    assert public and all(f"autograder/tests/{p}" in names for p in public)
    assert "autograder/engine/runner.py" in names and "course/__init__.py" in names
    assert not [n for n in names if n.startswith(("solutions/", "starter/", "instructor/redteam/")) or "__pycache__" in n]
    # reproducible: building again gives the same bytes
    again = tmp_path / "again.zip"
    subprocess.run([sys.executable, "-m", "instructor.gradescope", "build", "--out", str(again)], cwd=ROOT,
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert again.read_bytes() == built.read_bytes()


def test_run_autograder_writes_results_json_by_the_spec(built, tmp_path):
    gs = tmp_path / "autograder"
    with zipfile.ZipFile(built) as z:
        z.extractall(gs / "source")
    (gs / "source" / "run_autograder").chmod(0o755)
    sub = gs / "submission"
    sub.mkdir()
    text = (ROOT / "solutions" / "online_softmax.py").read_text() + BUG
    (sub / "online_softmax.py").write_text(text)
    (sub / "conftest.py").write_text("raise SystemExit('never imported')\n")
    r = _run_autograder(gs)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((gs / "results" / "results.json").read_text())

    # the spec's fields; points only on the per-part entries, published with the hidden tests
    assert {"score", "output", "visibility", "stdout_visibility", "tests"} <= set(res)
    assert res["visibility"] == "after_published" and res["stdout_visibility"] == "hidden"  # hidden tests ran
    points_rows = [t for t in res["tests"] if "points" in t.get("tags", [])]
    for t in res["tests"]:
        assert {"name", "number", "visibility", "output"} <= set(t)
        hidden = "hidden/" in t["name"] or t in points_rows
        assert t["visibility"] == ("after_published" if hidden else "visible")
        assert ("score" in t) == (t in points_rows)
    assert [t["name"] for t in points_rows] == ["Part 1: points (public and hidden tests)"]
    assert 0 <= points_rows[0]["score"] <= points_rows[0]["max_score"] == 15
    assert sum(t["score"] for t in points_rows) == pytest.approx(res["score"])
    assert any("hidden/" in t["name"] for t in res["tests"]) and any("public/" in t["name"] for t in res["tests"])
    assert "conftest.py" in res["output"] and "conftest.py" in res["tests"][0]["output"]  # intake's note, seen at once

    # the same engine on the same file gives the same points and outcomes (merge_partial's tests fail)
    impl = tmp_path / "impl"
    impl.mkdir()
    (impl / "online_softmax.py").write_text(text)
    direct = grade(impl, parts=[1], test_sets=("public", "hidden"))
    assert res["score"] == pytest.approx(direct["total"]) and 0 < direct["total"] < direct["max_total"]
    by_name = {t["name"].split(": ", 1)[1]: t["status"] for t in res["tests"]
               if not {"summary", "points"} & set(t["tags"])}
    assert by_name == {t["id"]: "passed" if t["outcome"] == "passed" else "failed" for t in student_view(direct)["tests"]}
    # a hidden test function is one entry: how many of its cases passed, never which
    for t in res["tests"]:
        if "hidden/" in t["name"]:
            assert "[" not in t["name"] and " hidden cases passed" in t["output"].splitlines()[0]

    # hidden tests are named, not revealed: no parameters in their names, the redacted message only
    for t in res["tests"]:
        if "hidden/" in t["name"]:
            assert "inputs:" not in t["output"] and "max abs error" not in t["output"]

    # what students see before publication (the visible tests, and the summary among them) counts and
    # scores public tests only, on their own scale (make grade's); the grade is published with the hidden tests
    visible = [t for t in res["tests"] if t["visibility"] == "visible"]
    summary = next(t for t in visible if t["name"] == "Public tests: summary")
    public = [t for t in direct["tests"] if t["set"] == "public"]
    passed = sum(t["outcome"] == "passed" for t in public)
    share = sum(t["score"] for t in public) / sum(t["max_score"] for t in public)
    row = next(line for line in summary["output"].splitlines() if line.startswith("| 1."))
    assert row.split("|")[2].strip() == f"{passed}/{len(public)}" == f"{passed}/{len(visible) - 1}"
    assert float(row.split("|")[3].split("/")[0]) == pytest.approx(15 * share, abs=0.01) and 0 < share < 1
    assert [t["number"] for t in visible[1:]] == [f"1.{i}" for i in range(1, len(visible))]
    assert res["visibility"] == "after_published"  # with the grade that holds them
    assert "their results and points are shown when the grades are published." in summary["output"]


def _visible(res: dict) -> list:
    """What a student sees of a results.json before publication: the visible fields."""
    top = {k: v for k, v in res.items() if k != "tests"} if res.get("visibility") == "visible" else {}
    return [top, [t for t in res["tests"] if t["visibility"] == "visible"]]


def test_what_students_see_before_publication_is_the_same_for_any_hidden_set(tmp_path):
    """One submission graded against two hidden sets (other cases, other counts, other outcomes):
    every field a student sees before publication is the same. Points per test, numbering or the
    summary's counts would otherwise tell how many hidden tests there are, or how they went."""
    from instructor.gradescope.results import results_json

    impl = tmp_path / "impl"
    impl.mkdir()
    (impl / "flash_decoding.py").write_text((ROOT / "solutions" / "flash_decoding.py").read_text().replace(
        "def combine_partials(", "def combine_partials(*a, **k):\n    raise RuntimeError('bug')\n\n\ndef _unused(", 1))
    graded = []
    case = "DecodeCase((), 1, {n}, 4, {s}, seed={seed})"
    for name, hidden in (("few", {"test_split_kv": [case.format(n=1, s=3, seed=1)]}),
                         ("many", {"test_split_kv": [case.format(n=9, s=4, seed=2), case.format(n=5, s=1, seed=3)],
                                   "test_combine_all_empty": ["DecodeCase((), 1, 0, 8, dtype='float64', seed=6)"]})):
        folder = tmp_path / name
        folder.mkdir()
        body = ", ".join(f"{test!r}: [{', '.join(cases)}]" for test, cases in hidden.items())
        (folder / "part6_flash_decoding.py").write_text(
            f"from autograder.tests.cases_part6 import DecodeCase\nHIDDEN = {{{body}}}\n")
        _, view = grade_for_student(impl, parts=[6], test_sets=("public", "hidden"), hidden_dir=folder)
        graded.append(results_json(view, notes=["flash_decoding.py"]))
    few, many = graded
    hidden_of = [[t for t in r["tests"] if t["visibility"] != "visible"] for r in graded]
    assert len(hidden_of[1]) > len(hidden_of[0]) and hidden_of[0] != hidden_of[1]
    assert _visible(few) == _visible(many)


def _run_autograder(gs: Path, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRADESCOPE_ROOT": str(gs), "AUTOGRADER_PYTHON": sys.executable, "AUTOGRADER_PARTS": "1",
           "AUTOGRADER_ALLOW_WEAK_SANDBOX": "1", **extra}  # this machine may lack bubblewrap
    env.pop("PYTHONPATH", None)  # run_autograder sets it to the unpacked source
    return subprocess.run(["bash", str(gs / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_run_autograder_takes_relative_paths_as_the_callers(built, tmp_path):
    """A try-out as the instructor guide shows it: GRADESCOPE_ROOT and AUTOGRADER_PYTHON relative to the
    folder it is run from (run_autograder changes into the source folder before it runs the engine)."""
    gs = tmp_path / "autograder"
    with zipfile.ZipFile(built) as z:
        z.extractall(gs / "source")
    (gs / "submission").mkdir()
    (gs / "submission" / "online_softmax.py").write_text((ROOT / "solutions" / "online_softmax.py").read_text())
    python = os.path.relpath(sys.executable, tmp_path)  # e.g. ../../../work/main/.venv/bin/python
    r = _run_autograder(Path("autograder"), cwd=tmp_path, AUTOGRADER_PYTHON=python)
    assert r.returncode == 0 and "judge exit status: 0" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads((gs / "results" / "results.json").read_text())["score"] == pytest.approx(15)


# A submission that forges its own results and kills the grader (as root, with resource limits only,
# a worker can do both): it writes score 100 into results.json and into the judge's private output,
# then SIGKILLs the judge. The forged 100 must not stand.
FORGER = """

def _forge_and_kill():
    import json, os, signal
    pid, judge, cmd = os.getpid(), None, b""
    for _ in range(12):
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            break
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        if b"instructor.gradescope" in cmd:
            judge = pid
            break
    env = dict(e.split(b"=", 1) for e in open(f"/proc/{judge}/environ", "rb").read().split(b"\\0") if b"=" in e)
    args = cmd.split(b"\\0")
    targets = [env[b"GRADESCOPE_ROOT"].decode() + "/results/results.json", args[args.index(b"--out") + 1].decode()]
    for t in targets:
        with open(t, "w") as f:
            json.dump({"score": 100.0, "output": "forged", "tests": []}, f)
    os.kill(judge, signal.SIGKILL)


def naive_softmax(x):
    _forge_and_kill()
"""


def test_an_engine_that_dies_gives_a_failing_results_json(built, tmp_path):
    gs = tmp_path / "autograder"
    with zipfile.ZipFile(built) as z:
        z.extractall(gs / "source")
    (gs / "submission").mkdir(parents=True)
    (gs / "submission" / "online_softmax.py").write_text((ROOT / "starter" / "online_softmax.py").read_text() + FORGER)
    # resource limits only (what Gradescope's container may give), where a worker CAN kill the judge:
    # under bubblewrap the forger cannot see it, and this test is about the judge's death
    r = _run_autograder(gs, GRADER_SANDBOX="rlimits")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((gs / "results" / "results.json").read_text())
    assert res["score"] == 0 and res["tests"] == [] and "autograder itself failed" in res["output"], res
    assert "judge exit status: 137" in r.stdout  # the kill is in the instructor's log only
    assert "137" not in res["output"]


def test_publish_only_takes_a_clean_exit(tmp_path):
    from instructor.gradescope.publish import FAILED, publish

    good = {"score": 7.5, "output": "ok", "tests": []}
    (tmp_path / "private.json").write_text(json.dumps(good))
    dest = tmp_path / "results" / "results.json"
    dest.parent.mkdir()
    dest.write_text(json.dumps({"score": 100.0, "tests": []}))  # planted by a submission
    assert publish(0, str(tmp_path / "private.json"), str(dest)) == good == json.loads(dest.read_text())
    assert publish(137, str(tmp_path / "private.json"), str(dest)) == FAILED == json.loads(dest.read_text())
    assert publish(0, str(tmp_path / "absent.json"), str(dest)) == FAILED
    (tmp_path / "private.json").write_text("[1, 2]")
    assert publish(0, str(tmp_path / "private.json"), str(dest)) == FAILED
    # a judge that refused (exit 1) wrote its own failing result, with the mode it refused: published as is
    own = {**FAILED, "extra_data": {"status": "failed to grade", "sandbox": "rlimits-only (bwrap not found)"}}
    (tmp_path / "private.json").write_text(json.dumps(own))
    assert publish(1, str(tmp_path / "private.json"), str(dest)) == own == json.loads(dest.read_text())
    for forged in ({**own, "score": 1.0}, {**own, "tests": [{"score": 5}]}, {**own, "extra_data": {}}):
        (tmp_path / "private.json").write_text(json.dumps(forged))  # points or no failure: not with exit 1
        assert publish(1, str(tmp_path / "private.json"), str(dest)) == FAILED


def test_setup_checks_the_sandbox_mode():
    from instructor.sandbox import detect

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AUTOGRADER_ALLOW_WEAK_SANDBOX", None)
    r = subprocess.run([sys.executable, "-m", "instructor.gradescope", "check"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    if detect().mode.startswith("rlimits-only"):
        assert r.returncode == 1 and "sandbox not available" in r.stderr
        r = subprocess.run([sys.executable, "-m", "instructor.gradescope", "check"], cwd=ROOT,
                           env={**env, "AUTOGRADER_ALLOW_WEAK_SANDBOX": "1"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "instructor.gradescope check" in (ROOT / "instructor" / "gradescope" / "setup.sh").read_text()


def test_a_grading_crash_still_writes_results(tmp_path, monkeypatch, capsys):
    import autograder.engine
    from instructor.gradescope.__main__ import run

    def broken(*args, **kwargs):
        raise RuntimeError("the grader is broken")

    monkeypatch.setattr(autograder.engine, "grade", broken)
    monkeypatch.setenv("AUTOGRADER_ALLOW_WEAK_SANDBOX", "1")
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "online_softmax.py").write_text("x = 1\n")
    res = run(tmp_path)
    assert json.loads((tmp_path / "results" / "results.json").read_text()) == res
    assert res["score"] == 0 and "autograder itself failed" in res["output"] and res["tests"] == []
    assert "the grader is broken" in capsys.readouterr().out  # the traceback: stdout, hidden from students


def test_a_refusal_records_the_sandbox_mode_it_refused(tmp_path, monkeypatch, capsys):
    """Every result records its mode, a refusal's too: the instructor sees from results.json alone
    why nothing was graded (the reason itself goes to stdout, the instructor's log)."""
    import instructor.gradescope.__main__ as gs
    from instructor.sandbox import Sandbox

    monkeypatch.setattr(gs, "detect", lambda: Sandbox(mode="rlimits-only (no isolation here)"))
    monkeypatch.delenv("AUTOGRADER_ALLOW_WEAK_SANDBOX", raising=False)
    (tmp_path / "submission").mkdir()
    res = gs.run(tmp_path)
    assert res["score"] == 0 and res["tests"] == [] and "autograder itself failed" in res["output"]
    assert res["extra_data"] == {"status": "failed to grade", "sandbox": "rlimits-only (no isolation here)"}
    assert "sandbox not available: rlimits-only" in capsys.readouterr().out
    assert "sandbox" not in gs.failing_result()["extra_data"]  # nothing detected, nothing claimed


def test_a_refusal_exits_non_zero_and_the_weak_flag_takes_the_strongest_mode(tmp_path, monkeypatch, capsys):
    """An outside instructor: `run` printed 'autograder failure: sandbox not available' and exited 0;
    and GRADER_SANDBOX=bubblewrap with the weak flag, bubblewrap missing, graded with resource limits
    only where the uid mode isolates (the batch and nbgrader took the uid mode). Now the refusal exits 1
    (its failing results.json written all the same), and the flag takes the strongest mode here."""
    import instructor.gradescope.__main__ as gs
    from instructor import sandbox

    (tmp_path / "submission").mkdir()
    monkeypatch.setenv("GRADER_SANDBOX", "rlimits")
    monkeypatch.delenv("AUTOGRADER_ALLOW_WEAK_SANDBOX", raising=False)
    assert gs.run_command(tmp_path, None, None) == 1
    res = json.loads((tmp_path / "results" / "results.json").read_text())
    assert res["score"] == 0 and res["extra_data"]["status"] == "failed to grade"
    assert "set by GRADER_SANDBOX=rlimits" in capsys.readouterr().out
    monkeypatch.setenv("GRADER_SANDBOX", "bubblewrap")
    monkeypatch.setenv("GRADER_BWRAP", "/nonexistent/bwrap")
    monkeypatch.setenv("AUTOGRADER_ALLOW_WEAK_SANDBOX", "1")
    sandbox._detect.cache_clear()
    try:
        best = sandbox.detect("uid")
        box = gs.grading_box()
        assert box.mode == (best.mode if best.isolating else box.mode) and (box.isolating or not best.isolating)
        monkeypatch.delenv("AUTOGRADER_ALLOW_WEAK_SANDBOX")
        said = gs.sandbox_refusal(sandbox.detect())
        assert "set by GRADER_SANDBOX=bubblewrap" in said and "bwrap not found" in said
        if best.isolating:
            assert f"the strongest mode this machine has, {best.mode}" in said
    finally:
        sandbox._detect.cache_clear()


def test_the_build_refuses_hidden_tests_that_miss_a_part():
    from instructor.gradescope.__main__ import _check_hidden_tests

    complete = [f"instructor/hidden_tests/part{n}_x.py" for n in range(1, 7)]
    _check_hidden_tests(complete)
    with pytest.raises(SystemExit, match=r"no cases for part\(s\) \[3\]"):
        _check_hidden_tests([f for f in complete if "part3_" not in f])


@pytest.mark.parametrize("raw, want", [("", 480.0), ("900", 900.0), ("0", 480.0), ("-5", 480.0), ("nan", 480.0),
                                       ("inf", 480.0), ("ten", 480.0)])
def test_the_grade_budget_stays_inside_gradescopes_timeout(monkeypatch, capsys, raw, want):
    """run() grades within AUTOGRADER_TIME_BUDGET_S (default 8 of Gradescope's 10 minutes): a hanging
    submission then gets the engine's results.json, not Gradescope's timeout; a bad value is named
    in the log and the default used."""
    from instructor.gradescope.__main__ import time_budget_s

    monkeypatch.setenv("AUTOGRADER_TIME_BUDGET_S", raw)
    assert time_budget_s() == want
    assert ("not a positive number" in capsys.readouterr().out) == (raw not in ("", "900"))


# --- bad command lines: one line on stderr ("error: ..."), a non-zero exit, never a traceback; `run`
# still writes a failing results.json wherever it can write one


def _one_line(r: subprocess.CompletedProcess, *want: str) -> str:
    assert r.returncode not in (0, None), (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    err = r.stderr
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    for w in want:
        assert w in err, err
    return err


def _failing(path: Path) -> None:
    res = json.loads(path.read_text())
    assert res["score"] == 0 and res["tests"] == [] and "autograder itself failed" in res["output"], res


def test_bad_arguments_to_build_are_one_line_and_write_nothing(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "ro").mkdir()
    cases = {str(tmp_path): "is not a file name", str(tmp_path / "afile" / "a.zip"): "is a file, not a folder",
             "/proc/no-such-dir/a.zip": "cannot be created", "": "is not a file name"}
    for out, want in cases.items():
        r = subprocess.run([sys.executable, "-m", "instructor.gradescope", "build", "--out", out], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        _one_line(r, want, "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "ro"]


def test_bad_arguments_to_the_zips_entry_point_are_one_line_and_a_failing_results_json(built, tmp_path):
    """From an unpacked copy of the built zip (no repository around it): `run` and `build` refuse
    bad input in one line; `run` writes a failing results.json where it can write one."""
    gs = tmp_path / "autograder"
    with zipfile.ZipFile(built) as z:
        z.extractall(gs / "source")
    (gs / "submission").mkdir()
    (gs / "submission" / "online_softmax.py").write_text((ROOT / "starter" / "online_softmax.py").read_text())
    (tmp_path / "afile").write_text("x")
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOGRADER_PARTS", "GRADESCOPE_ROOT")}
    env.update(PYTHONPATH=str(gs / "source"), AUTOGRADER_ALLOW_WEAK_SANDBOX="1")

    def zip_cli(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "instructor.gradescope", *args], cwd=gs / "source",
                              capture_output=True, text=True, env={**env, **extra}, timeout=300)

    results = gs / "results" / "results.json"
    for parts, want in [("x", "'x' is not a part"), ("9", "'9' is not a part"), ("1,,2", "'' is not a part"),
                        ("-1", "is not a part")]:
        results.unlink(missing_ok=True)
        _one_line(zip_cli("run", "--root", str(gs), f"--parts={parts}"), want, "--parts")
        _failing(results)
    _one_line(zip_cli("run", "--root", str(gs), "--parts", "x", "--out", str(tmp_path / "r.json")), "--parts")
    _failing(tmp_path / "r.json")
    results.unlink()
    _one_line(zip_cli("run", "--root", str(gs), AUTOGRADER_PARTS="0"), "--parts")  # the environment's value
    _failing(results)
    _one_line(zip_cli("run", "--root", str(tmp_path / "nope")), "--root", "is not a folder")
    assert not (tmp_path / "nope").exists()  # no /autograder made up
    _one_line(zip_cli("run", "--root", str(tmp_path / "nope"), "--out", str(tmp_path / "r2.json")), "--root")
    _failing(tmp_path / "r2.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line(zip_cli("run", "--root", str(empty)), "submission/")
    _failing(empty / "results" / "results.json")
    _one_line(zip_cli("run", "--root", str(gs), "--out", str(tmp_path)), "--out", "is a folder")
    _one_line(zip_cli("run", "--root", str(gs), "--out", str(tmp_path / "afile" / "r.json")), "--out")
    _one_line(zip_cli("run", "--bogus"), "--help")
    _one_line(zip_cli("bogus"), "invalid choice")
    _one_line(zip_cli("build", "--out", str(tmp_path / "z.zip")), "course repository")
    assert not (tmp_path / "z.zip").exists()

    # through run_autograder: the judge refuses, the published results.json fails closed
    r = _run_autograder(gs, AUTOGRADER_PARTS="seven")
    assert r.returncode == 0 and "judge exit status: 2" in r.stdout and "Traceback" not in r.stdout + r.stderr, r
    _failing(results)
