"""Student release: built into a temp folder, scanned for leaks, and graded with its own Makefile."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from instructor.release import build, canaries, scan, solution_fingerprints, solution_regions

ROOT = Path(__file__).resolve().parent.parent
FILES = ["online_softmax.py", "flash_forward.py", "flash_kernel.py", "flash_backward.py", "kv_cache.py",
         "flash_decoding.py"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "student-repo"
    info = build(out)
    return out, info


def _make(release: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAKEFLAGS", "MAKELEVEL")}
    # PY=: use this venv instead of making one in the release (no network, no reinstall)
    return subprocess.run(["make", "-s", "-C", str(release), *args, f"PY={sys.executable}"], capture_output=True,
                          text=True, env=env, timeout=900)


def test_the_release_has_the_student_files_and_nothing_secret(release):
    out, info = release
    assert sorted(p.name for p in (out / "starter").glob("*.py") if p.name != "__init__.py") == sorted(FILES)
    for f in FILES:
        assert (out / "starter" / f).read_bytes() == (ROOT / "starter" / f).read_bytes()
    assert (out / "Makefile").is_file() and (out / "autograder" / "engine" / "runner.py").is_file()
    assert (out / "docs" / "handout" / "README.md").is_file() and (out / "course" / "__init__.py").is_file()
    assert sorted(p.name for p in (out / "autograder" / "tests").glob("test_*.py")) == \
        sorted(p.name for p in (ROOT / "autograder" / "tests").glob("test_*.py"))
    assert not (out / "solutions").exists() and not (out / "instructor").exists()
    for tool in ("batch.py", "gradescope", "nbgrader_channel.py", "release.py", "redteam", "mutations"):
        assert not (out / "autograder" / tool).exists(), tool
    assert scan(out) == []
    assert not [p for p in out.rglob("*") if "__pycache__" in p.parts]


def test_the_scan_finds_each_kind_of_leak(release, tmp_path):
    out, _ = release
    leaky = tmp_path / "leaky"
    shutil.copytree(out, leaky)
    hidden = sorted((ROOT / "instructor" / "hidden_tests").glob("part*.py"))
    assert hidden and solution_regions()
    shutil.copy(hidden[0], leaky / "autograder" / "tests" / "copied.py")  # a hidden test, renamed
    (leaky / "instructor").mkdir()
    shutil.copy(ROOT / "solutions" / "online_softmax.py", leaky / "course" / "helpers.py")  # solution code
    (leaky / "notes.md").write_text("see ### BEGIN SOLUTION\n")
    token = "CANARY-TEST-0123456789ab"
    (leaky / "docs" / "x.md").write_text(f"<!-- {token} -->\n")
    problems = "\n".join(scan(leaky, extra_canaries=[token]))
    assert "instructor-only folder is present" in problems
    assert "copied.py: contains code copied from the hidden test" in problems  # renamed: found by content
    assert "course/helpers.py: contains code copied from the solution region" in problems
    assert "notes.md: contains a solution marker" in problems
    assert f"docs/x.md: contains the canary {token}" in problems


def test_canaries_are_read_from_the_list_and_the_protected_files():
    tokens = canaries()
    planted = {t for folder in (ROOT / "solutions", ROOT / "instructor" / "hidden_tests")
               for f in folder.glob("*.py") for t in re.findall(r"CANARY-[A-Z]+-[0-9A-Za-z]{6,}", f.read_text())}
    assert planted <= set(tokens)
    if not planted:
        pytest.skip("no CANARY-... comments planted in solutions/ or the hidden tests yet (see instructor/canaries.txt)")


def test_no_run_of_solution_lines_is_counted_when_it_is_public_course_code():
    prints = solution_fingerprints()
    course_text = "\n".join(p.read_text() for p in (ROOT / "course").rglob("*.py"))
    assert prints and not [k for k in prints if "\n".join(k) in " ".join(course_text.split())]


def test_make_grade_in_the_release_scores_the_starter_zero_and_the_solutions_full(release, tmp_path):
    out, _ = release
    r = _make(out, "grade")
    assert r.returncode != 0  # not every test passed
    text = r.stdout + r.stderr
    assert "not implemented" in text
    total = re.search(r"total\D+([\d.]+)\s*/\s*100", text)
    assert total and float(total.group(1)) == 0.0, text[-3000:]
    # the solutions copied into the release score full marks there (part 1: the cheapest part)
    mine = out / "mine"
    mine.mkdir()
    for f in FILES:
        shutil.copy(ROOT / "solutions" / f, mine / f)
    r = _make(out, "grade", "IMPL=mine", "PART=1")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert re.search(r"total\D+15(\.0+)?\s*/\s*15", r.stdout), r.stdout[-2000:]
