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
    env = {**os.environ, "GRADESCOPE_ROOT": str(gs), "AUTOGRADER_PYTHON": sys.executable, "AUTOGRADER_PARTS": "1"}
    env.pop("PYTHONPATH", None)  # run_autograder sets it to the unpacked source
    r = subprocess.run(["bash", str(gs / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((gs / "results" / "results.json").read_text())

    # the spec's fields
    assert {"score", "output", "visibility", "stdout_visibility", "tests"} <= set(res)
    assert res["visibility"] == "visible" and res["stdout_visibility"] == "hidden"
    for t in res["tests"]:
        assert {"name", "score", "max_score", "visibility", "output"} <= set(t)
        assert t["visibility"] == ("after_published" if "hidden/" in t["name"] else "visible")
        assert 0 <= t["score"] <= t["max_score"]
    assert any("hidden/" in t["name"] for t in res["tests"]) and any("public/" in t["name"] for t in res["tests"])
    # the engine rounds test scores to 1e-6 and part points to 1e-4: the sums agree to ~1e-4
    assert abs(sum(t["score"] for t in res["tests"]) - res["score"]) < 1e-3
    assert "conftest.py" in res["output"]  # intake says it ignored the extra file

    # the same engine on the same file gives the same points (merge_partial's tests fail, the rest pass)
    impl = tmp_path / "impl"
    impl.mkdir()
    (impl / "online_softmax.py").write_text(text)
    direct = grade(impl, parts=[1], test_sets=("public", "hidden"))
    assert res["score"] == pytest.approx(direct["total"]) and 0 < direct["total"] < direct["max_total"]
    by_name = {t["name"].split(": ", 1)[1]: t["score"] for t in res["tests"]}
    assert by_name == {t["id"]: pytest.approx(t["score"]) for t in direct["tests"]}

    # hidden tests are named, not revealed: no parameters in their names, the redacted message only
    for t in res["tests"]:
        if "hidden/" in t["name"]:
            assert "inputs:" not in t["output"] and "max abs error" not in t["output"]


def test_a_grading_crash_still_writes_results(tmp_path, monkeypatch, capsys):
    import autograder.engine
    from instructor.gradescope.__main__ import run

    def broken(*args, **kwargs):
        raise RuntimeError("the grader is broken")

    monkeypatch.setattr(autograder.engine, "grade", broken)
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "online_softmax.py").write_text("x = 1\n")
    res = run(tmp_path)
    assert json.loads((tmp_path / "results" / "results.json").read_text()) == res
    assert res["score"] == 0 and "autograder itself failed" in res["output"] and res["tests"] == []
    assert "the grader is broken" in capsys.readouterr().out  # the traceback: stdout, hidden from students
