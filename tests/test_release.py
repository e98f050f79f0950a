"""Student release: built into a temp folder, scanned for leaks, graded with its own Makefile, and
proved free of instructor-only code (statically, and by running it with the instructor tree absent)."""
from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from instructor import release as rel
from instructor.release import build, canaries, scan, solution_fingerprints, solution_regions

ROOT = Path(__file__).resolve().parent.parent
FILES = ["online_softmax.py", "flash_forward.py", "flash_kernel.py", "flash_backward.py", "kv_cache.py",
         "flash_decoding.py"]
PROGRAMS = ["01_attention.py", "02_softmax.py", "03_flash_on_gpusim.py", "04_backward.py", "05_inference.py"]
RUBRIC = tomllib.loads((ROOT / "autograder" / "rubric.toml").read_text())


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "student-repo"
    info = build(out)
    return out, info


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def _make(release: Path, *args: str) -> subprocess.CompletedProcess:
    # PY=: use this venv instead of making one in the release (no network, no reinstall)
    return subprocess.run(["make", "-s", "-C", str(release), *args, f"PY={sys.executable}"], capture_output=True,
                          text=True, env=_env(), timeout=900)


def test_the_release_has_the_student_files_and_nothing_secret(release):
    out, info = release
    assert sorted(p.name for p in (out / "starter").glob("*.py") if p.name != "__init__.py") == sorted(FILES)
    for f in FILES:
        assert (out / "starter" / f).read_bytes() == (ROOT / "starter" / f).read_bytes()
    assert (out / "Makefile").is_file() and (out / "autograder" / "engine" / "runner.py").is_file()
    assert (out / "docs" / "handout" / "README.md").is_file() and (out / "course" / "__init__.py").is_file()
    assert sorted(p.name for p in (out / "autograder" / "tests").glob("*.py")) == \
        sorted(p.name for p in (ROOT / "autograder" / "tests").glob("*.py"))
    assert info["programs"] == PROGRAMS, "all five lecture programs ship"
    for f in ("code/lecture05/README.md", "code/lecture05/attention_kernels.py", "autograder/README.md",
              "autograder/debug.py", ".github/workflows/classroom.yml", "requirements.txt", "requirements.lock"):
        assert (out / f).is_file(), f
    for folder in rel.INSTRUCTOR:
        assert not (out / folder).exists(), folder
    for tool in ("batch.py", "gradescope", "nbgrader_channel.py", "release.py", "redteam", "mutations"):
        assert not (out / "autograder" / tool).exists(), tool
    assert scan(out) == []
    assert not [p for p in out.rglob("*") if "__pycache__" in p.parts]


def test_every_top_level_entry_says_who_gets_it():
    """The release copies folders: a new top-level folder must be declared student or instructor."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    top = {p.split("/", 1)[0] for p in listed if not p.startswith(".")}
    known = set(rel.STUDENT) | set(rel.INSTRUCTOR) | set(rel.TOP_LEVEL_FILES)
    assert not top - known, f"declare these in instructor/release.py (STUDENT, INSTRUCTOR or TOP_LEVEL_FILES): {top - known}"
    assert not set(rel.STUDENT) & set(rel.INSTRUCTOR)


def test_the_release_copies_whole_folders(release):
    """Every file of the student folders ships (a helper added next to the tests ships with them),
    except the declared instructor-only files, which are replaced."""
    out, _ = release
    for folder in rel.STUDENT:
        for f in (ROOT / folder).rglob("*"):
            r = f.relative_to(ROOT)
            if f.is_file() and not rel.SKIP & set(r.parts) and f.suffix != ".pyc" and r.as_posix() not in rel.INSTRUCTOR_FILES:
                assert (out / r).read_bytes() == f.read_bytes(), r
    grader_notes = (out / "autograder" / "README.md").read_text()
    assert "student copy" in grader_notes and "BEGIN SOLUTION" not in grader_notes
    assert "## Tolerance policy" in grader_notes, "the notes the test messages point to are there"


def test_nothing_shipped_imports_instructor_code(release, tmp_path):
    out, _ = release
    assert rel.instructor_imports(out) == []
    leaky = tmp_path / "leaky"
    shutil.copytree(out, leaky, ignore=shutil.ignore_patterns(".git"))
    (leaky / "autograder" / "tests" / "helper.py").write_text(
        "import instructor.batch\nfrom solutions.flash_forward import flash_forward\n"
        "import importlib\nimportlib.import_module('tests.lecture_programs')\nfrom benchmarks import x\n")
    found = "\n".join(rel.instructor_imports(leaky))
    for name in ("instructor.batch", "solutions.flash_forward", "tests.lecture_programs", "benchmarks"):
        assert f"imports {name} (instructor-only)" in found, name
    assert "autograder/tests/helper.py:1:" in found
    assert any("imports instructor.batch" in p for p in scan(leaky)), "the scan refuses such a release"


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
    assert "instructor/: an instructor-only folder is present" in problems
    assert "copied.py: contains code copied from the hidden test" in problems  # renamed: found by content
    assert "course/helpers.py: contains code copied from the solution region" in problems
    assert "notes.md: contains a solution marker" in problems
    assert f"docs/x.md: contains the canary {token}" in problems


def test_canaries_are_read_from_the_list_and_the_protected_files():
    assert rel.CANARIES.is_file(), "the canary list is instructor/canaries.txt"
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


def test_rebuilding_keeps_git_and_writes_only_its_own_files(tmp_path):
    out = tmp_path / "repo"
    _git(out, "init", "-q")  # a real repository: the scan reads its history (an unreadable .git is refused)
    head = (out / ".git" / "HEAD").read_text()
    build(out)  # a folder holding only .git: allowed (a fresh clone of the student repository)
    (out / "my-notes.txt").write_text("mine\n")
    (out / "docs" / "stale.md").write_text("from an older release\n")
    manifest = (out / rel.MANIFEST).read_text()
    (out / rel.MANIFEST).write_text(manifest.replace('"files": [', '"files": [\n  "docs/stale.md",'))
    info = build(out)
    assert (out / ".git" / "HEAD").read_text() == head, ".git is kept"
    assert (out / "my-notes.txt").read_text() == "mine\n", "a file the release did not write is kept"
    assert not (out / "docs" / "stale.md").exists(), "a file of the previous release that is gone is removed"
    assert "Makefile" in info["files"] and (out / "Makefile").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    with pytest.raises(SystemExit, match="not empty"):
        build(other)


def _one_line_refusal(out: Path, *names: str) -> str:
    """Rebuild `out`, which must be refused with one line naming each of `names`."""
    with pytest.raises(SystemExit) as e:
        build(out)
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    for n in names:
        assert n in msg, msg
    return msg


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("entry", ["../victim.txt", "{abs}", "docs/../../victim.txt", "./../victim.txt",
                                   ".git/HEAD", "", "docs//../../victim.txt", 7])
def test_a_tampered_manifest_cannot_make_a_rebuild_delete_anything_else(release, tmp_path, entry):
    src, _ = release
    out = tmp_path / "repo"
    shutil.copytree(src, out)
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    absolute = tmp_path / "elsewhere" / "victim2.txt"
    absolute.parent.mkdir()
    absolute.write_text("keep me too\n")
    entry = str(absolute) if entry == "{abs}" else entry
    manifest = (out / rel.MANIFEST)
    data = __import__("json").loads(manifest.read_text())
    data["files"].append(entry)
    manifest.write_text(__import__("json").dumps(data))
    before = _snapshot(out)
    _one_line_refusal(out, repr(entry) if isinstance(entry, str) and entry else "")
    assert victim.read_text() == "keep me\n" and absolute.read_text() == "keep me too\n"
    assert _snapshot(out) == before, "a refused rebuild touches nothing"


@pytest.mark.parametrize("planted", ["starter/online_softmax.py", "docs", "docs/handout", rel.MANIFEST,
                                     ".github/workflows/classroom.yml", "stale"])
def test_a_symlink_planted_in_an_existing_release_is_never_written_or_deleted_through(release, tmp_path, planted):
    """A link where the release writes a file (or a folder above one) would make the copy write
    through it; a listed stale file that is a link would make the rebuild delete through it."""
    src, _ = release
    out = tmp_path / "repo"
    shutil.copytree(src, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me\n")
    if planted == "stale":  # a file of the previous release, gone from this one, replaced by a link
        manifest = out / rel.MANIFEST
        manifest.write_text(manifest.read_text().replace('"files": [', '"files": [\n  "docs/old.md",'))
        planted = "docs/old.md"
    link = out / planted
    if link.is_dir():
        shutil.rmtree(link)
        (outside / "handout").mkdir()
        target = outside / "handout"
    else:
        link.unlink(missing_ok=True)
        target = outside / "victim.txt"
    link.symlink_to(target)
    before = _snapshot(outside)
    _one_line_refusal(out, "symlink", str(link))
    assert _snapshot(outside) == before and (outside / "victim.txt").read_text() == "keep me\n"
    assert link.is_symlink(), "left as it was: the instructor decides"


def test_a_hard_link_planted_in_an_existing_release_is_replaced_not_written_into(release, tmp_path):
    src, _ = release
    out = tmp_path / "repo"
    shutil.copytree(src, out)
    victim = tmp_path / "victim.py"
    victim.write_text("keep me\n")
    (out / "starter" / "online_softmax.py").unlink()
    os.link(victim, out / "starter" / "online_softmax.py")
    build(out)
    assert victim.read_text() == "keep me\n"
    assert (out / "starter" / "online_softmax.py").read_bytes() == (ROOT / "starter" / "online_softmax.py").read_bytes()
    assert not list(out.rglob("*.release-tmp"))


def _fake_repo(root: Path) -> Path:
    for folder in rel.STUDENT:
        (root / folder).mkdir(parents=True)
        (root / folder / "a.md").write_text("x\n")
    return root


@pytest.mark.parametrize("link", ["starter/online_softmax.py", "docs", "course/sub", "autograder/x.py"])
@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_symlink_in_the_source_tree_is_refused_not_followed(tmp_path, monkeypatch, link, where):
    """Source symlinks are refused wherever they point (documented choice: copying the file behind
    the link would ship what it points to, and skipping it would drop a file silently)."""
    repo = _fake_repo(tmp_path / "repo")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "answers.py").write_text("SECRET\n")
    target = (secret / "answers.py" if where == "outside" else repo / "code" / "a.md")
    if link in ("docs", "course/sub"):
        if (repo / link).exists():
            shutil.rmtree(repo / link)
        target = secret if where == "outside" else repo / "code"
    (repo / link).symlink_to(target)
    monkeypatch.setattr(rel, "ROOT", repo)
    with pytest.raises(SystemExit) as e:
        rel.shipped_files()
    assert f"{link} is a symlink" in str(e.value.code) and "\n" not in str(e.value.code)
    out = tmp_path / "release"
    with pytest.raises(SystemExit):
        build(out)
    assert not out.exists(), "refused before anything is written"
    with pytest.raises(SystemExit, match="is a symlink"):  # the read refuses a link on its own, too
        rel._read_source(link if link != "docs" else "docs/answers.py")


def test_a_rebuild_keeps_file_modes_and_writes_regular_files(release, tmp_path):
    src, _ = release
    out = tmp_path / "repo"
    shutil.copytree(src, out)
    build(out)
    for f in out.rglob("*"):
        assert not f.is_symlink(), f
    for r in rel.shipped_files():
        assert (out / r).stat().st_mode & 0o777 == (ROOT / r).stat().st_mode & 0o777, r


def test_student_requirements_have_no_instructor_tools_and_cpu_torch():
    req = (ROOT / "requirements-student.txt").read_text()
    lock = (ROOT / "requirements-student.lock").read_text()
    names = {line.split("==")[0].lower() for line in lock.split()}
    wanted = {line.split("#")[0].split("==")[0].strip().lower() for line in req.splitlines() if line.split("#")[0].strip()}
    assert wanted <= names
    for tool in ("nbgrader", "numba", "jupyterlab", "notebook", "ipykernel", "jupyter-server", "jupyter_server"):
        assert tool not in names, tool
    assert "torch==2.13.0" in lock.split() and "torch==2.13.0" in req.split()
    assert lock == rel.student_lock(), "requirements-student.lock is stale: run `make lock`"
    mk = rel.generated_files()["Makefile"]
    assert "--extra-index-url $(TORCH_INDEX)" in mk and rel.TORCH_CPU_INDEX in mk, "the CPU build's index"


@pytest.mark.parametrize("which", ["course", "release"])
def test_a_fresh_clone_with_the_same_pins_installs_nothing(which, tmp_path):
    """An outside instructor: in a fresh clone whose .venv is a symlink to a shared virtualenv, `make grade`
    ran pip against the shared venv and touched its stamp, because the clone's requirements files are
    newer than the stamp. The stamp now names the pins it installed: the same pins install nothing,
    whatever the files' times; other pins install theirs."""
    import time

    text = (ROOT / "Makefile").read_text() if which == "course" else rel.generated_files()["Makefile"]
    (tmp_path / "Makefile").write_text(text)
    for name in ("requirements.txt", "requirements.lock"):
        (tmp_path / name).write_text(f"pins of {name}\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)

    def dry_run() -> str:
        return subprocess.run(["make", "-n", "venv"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    plan = dry_run()
    assert "pip install" in plan
    stamp = re.search(r"touch (\.venv/\.installed-\w+)", plan).group(1)
    (tmp_path / stamp).touch()
    time.sleep(0.01)
    for name in ("requirements.txt", "requirements.lock"):  # a fresh clone: newer files, the same pins
        os.utime(tmp_path / name)
    assert "pip install" not in dry_run()
    (tmp_path / "requirements.lock").write_text("other pins\n")
    assert "pip install" in dry_run()


@pytest.mark.parametrize("which", ["course", "release"])
def test_an_install_that_changes_nothing_keeps_the_other_pins_stamp(which, tmp_path):
    """A venv shared by the course checkout and a student release (round 6): each `make` installed its own
    pins and removed the other's stamp, so the other reinstalled next time, back and forth. The release's
    pins are a subset: installing them changes no package, and the other stamp now stays; an install
    that changes a package still removes it. (A fake interpreter stands for the venv's python.)"""
    text = (ROOT / "Makefile").read_text() if which == "course" else rel.generated_files()["Makefile"]
    (tmp_path / "Makefile").write_text(text)
    for name in ("requirements.txt", "requirements.lock"):
        (tmp_path / name).write_text(f"pins of {name}\n")
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (tmp_path / "frozen").write_text("torch==2.13.0\n")
    fake = bin_ / "python"
    fake.write_text("#!/bin/sh\n"  # `-m pip freeze --all` prints ./frozen; `-m pip install` adds $CHANGE to it
                    'if [ "$3" = "freeze" ]; then cat frozen; else printf "%s" "$CHANGE" >> frozen; fi\n')
    fake.chmod(0o755)
    other = tmp_path / ".venv" / ".installed-123"

    def make(change: str) -> None:
        for stamp in (tmp_path / ".venv").glob(".installed-*"):
            if stamp != other:
                stamp.unlink()
        subprocess.run(["make", "venv", "TORCH_INDEX="], cwd=tmp_path, capture_output=True, text=True, check=True,
                       env={**os.environ, "CHANGE": change})

    other.touch()
    make("")
    assert other.exists() and len(list((tmp_path / ".venv").glob(".installed-*"))) == 2
    make("numpy==2.0\n")
    assert not other.exists() and len(list((tmp_path / ".venv").glob(".installed-*"))) == 1


def test_every_import_of_the_release_is_in_the_student_lock(release):
    """Each top-level import of a shipped .py file is the standard library, the release itself, or
    a package of requirements-student.lock."""
    import ast

    out, _ = release
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in (out / "requirements.lock").read_text().split()}
    dists = md.packages_distributions()
    local = {p.name.removesuffix(".py") for p in out.iterdir()} | {"attention_kernels", "_graded_submission"}
    missing = set()
    for f in out.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for m in mods:
                top = m.split(".")[0]
                if top in sys.stdlib_module_names or top in local:
                    continue
                if not {d.lower().replace("_", "-") for d in dists.get(top, [top])} & pinned:
                    missing.add(f"{f.relative_to(out)}: {m}")
    assert not missing, missing


def test_the_release_readme_says_python_first_run_and_report_path(release):
    out, _ = release
    readme = (out / "README.md").read_text()
    assert "Python 3.11" in readme and "first `make` command creates" in readme
    from autograder.grade import DEFAULT_REPORT

    assert f"`{DEFAULT_REPORT.as_posix()}`" in readme, "the report path the grader writes"
    for ref in re.findall(r"`((?:starter|course|autograder|code|docs)/[\w./-]+)`", readme):
        assert (out / ref).exists(), ref


def test_files_named_in_shipped_text_exist_in_the_release(release):
    """References from shipped code and docs to files of the student folders resolve in the release
    (the test messages point students to autograder/README.md and code/lecture05/README.md)."""
    out, _ = release
    bad = set()
    pattern = re.compile(r"\b((?:starter|course|autograder|code|docs)/[\w./-]*\w\.(?:md|py|toml|txt|png|pt))\b")
    for f in out.rglob("*"):
        if f.is_file() and f.suffix in (".py", ".md", ".toml") and ".git" not in f.parts:
            for ref in pattern.findall(f.read_text()):
                if "partN" not in ref and not (out / ref).exists():
                    bad.add(f"{f.relative_to(out)}: {ref}")
    assert not bad, bad


def test_make_grade_in_the_release_scores_the_starter_zero_and_the_solutions_full(release, tmp_path):
    out, _ = release
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; "
                            f"sys.exit(any(u.find_spec(m) for m in {list(rel.INSTRUCTOR)!r}))"],
                           cwd=out, env={**_env(), "PYTHONPATH": str(out)}, capture_output=True, text=True)
    assert probe.returncode == 0, "the instructor tree must be absent (not importable) for this test to prove anything"
    r = _make(out, "grade")
    assert r.returncode != 0  # not every test passed: a non-zero status for CI
    text = r.stdout + r.stderr
    assert "not implemented" in text
    assert "make: ***" not in text and "Error 1" not in text, "no raw make error for 'not full marks yet'"
    total = re.search(r"total\D+([\d.]+)\s*/\s*100", text)
    assert total and float(total.group(1)) == 0.0, text[-3000:]
    assert "ModuleNotFoundError" not in text and "ImportError" not in text, text[-3000:]
    # the solutions copied into the release score full marks there (part 1: the cheapest part)
    mine = out / "mine"
    mine.mkdir()
    for f in FILES:
        shutil.copy(ROOT / "solutions" / f, mine / f)
    r = _make(out, "grade", "IMPL=mine", "PART=1")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert re.search(r"total\D+15(\.0+)?\s*/\s*15", r.stdout), r.stdout[-2000:]
    assert (out / "build" / "grade-report.json").is_file()
    shutil.rmtree(mine)


def test_the_classroom_workflow_reports_points_per_part_and_its_commands_run(release, tmp_path):
    """GitHub Classroom's format (classroom-resources/autograding-command-grader + the grading
    reporter); each part's command, run here as the workflow runs it, exits 0 exactly when the
    part's public tests all pass."""
    out, _ = release
    wf = yaml.safe_load((out / ".github" / "workflows" / "classroom.yml").read_text())
    steps = wf["jobs"]["run-autograding-tests"]["steps"]
    tests = [s for s in steps if str(s.get("uses", "")).startswith("classroom-resources/autograding-command-grader@")]
    points = {int(p["number"]): int(p["points"]) for p in RUBRIC["part"]}
    assert [int(s["with"]["max-score"]) for s in tests] == list(points.values()) and sum(points.values()) == 100
    reporter = next(s for s in steps if str(s.get("uses", "")).startswith("classroom-resources/autograding-grading-reporter@"))
    ids = [s["id"] for s in tests]
    assert reporter["with"]["runners"].split(",") == ids
    assert reporter["env"] == {f"{i.upper()}_RESULTS": f"${{{{steps.{i}.outputs.result}}}}" for i in ids}
    assert any(s.get("run") == "make venv" for s in steps), "the pinned packages are installed first"
    # run the commands as the workflow does (in the release, with this venv instead of `make venv`)
    env = {**_env(), "PY": sys.executable}
    for s, part in zip(tests, points):
        assert s["with"]["command"] == rel.classroom_command(part)
        r = subprocess.run(s["with"]["command"], shell=True, cwd=out, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode != 0, f"part {part}: the starter must not score"
    work = tmp_path / "graded"
    shutil.copytree(out, work)
    shutil.copy(ROOT / "solutions" / "online_softmax.py", work / "starter" / "online_softmax.py")
    r = subprocess.run(tests[0]["with"]["command"], shell=True, cwd=work, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]  # part 1 passes: its 15 points


# ---------------------------------------------------------------------------------------------------
# No working ⊕ ships: the judge-side part-1 code must not hand students merge_summary / merge_partial.

SHIPPED_JUDGE_MODULES = ("autograder.tests.cases_part1", "autograder.tests.probes", "autograder.tests.diagnose",
                         "autograder.tests.streaming")


class _Direct:
    """A `student` whose graded function is `fn` (called in this process, through the grader's plain-data
    encoding as between judge and worker); enough for the part-1 merge checks and their probes."""

    part, hidden, test_set = 1, False, "public"

    def __init__(self, fn) -> None:
        self.fn = fn

    def with_timeout(self, seconds: float) -> "_Direct":
        return self

    def function(self, target: str):
        return self.fn

    def call(self, target: str, *args, **kwargs):
        from autograder.debug import LocalStudent

        return LocalStudent._plain(self.fn(*LocalStudent._plain(args, target)), target)

    def scenario(self, target: str, **kwargs):
        import importlib

        from autograder.debug import LocalStudent

        module, _, name = target.rpartition(".")
        fn = getattr(importlib.import_module(f"autograder.scenarios.{module}"), name)
        return LocalStudent._plain(fn(self, **LocalStudent._plain(kwargs, target)), target)


def _as_merge(candidate):
    """candidate(a, b) with its tensors cast to the inputs' dtype (the one-line fix a student would add)."""
    import torch

    def merge(a, b):
        out = candidate(a, b)
        dt = a[0].dtype
        return type(out)(t.to(dt) if isinstance(t, torch.Tensor) else t for t in out) \
            if type(out) in (tuple, list) else out
    return merge


def _merge_cases_passed(fn) -> tuple[list[str], int]:
    """The part-1 merge cases (public and hidden merge_summary and merge_partial cases with two non-empty
    sides, the algebra on fixed score batches) that `fn` in the place of merge_summary / merge_partial passes, and how many there are."""
    import torch

    from autograder.tests import cases_part1 as C
    from autograder.tests import test_part1_online_softmax as public
    from instructor.hidden_tests import part1_online_softmax as hidden

    student = _Direct(_as_merge(fn))
    g = torch.Generator().manual_seed(0)
    scores = [(torch.rand(16, C.ROW_MAX, generator=g, dtype=torch.float64) * 120 - 60) for _ in range(3)]
    scores[1][::5] = float("-inf")  # empty rows
    # an empty side is excluded: there a ⊕ is its other argument, which any pass-through returns
    split = [c for c in [*public.MERGES, *hidden.MERGES] if 0 < c.split < c.rows.shape[-1]]
    checks = [(f"{check.__name__}[{case}]", lambda check=check, case=case: check(student, case))
              for case in split for check in (C.check_merge_summary, C.check_merge_partial)]
    checks.append(("check_algebra", lambda: C.check_algebra(student, *scores)))
    passed = []
    for name, run in checks:
        try:
            run()
        except Exception:  # noqa: BLE001 -- a CheckFailure, or the candidate cannot take (a, b) at all
            continue
        passed.append(name)
    return passed, len(checks)


def _two_argument_functions(module) -> list:
    """Every function defined in `module` (public or not: students can import either) that accepts two
    positional arguments."""
    import inspect

    found = []
    for name, obj in vars(module).items():
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            try:
                inspect.signature(obj).bind(None, None)
            except TypeError:
                continue
            found.append(obj)
    return found


def test_no_shipped_judge_function_is_a_working_merge():
    """Put each two-argument function of the shipped part-1 cases, probes and diagnosis in the place of
    merge_summary / merge_partial: none may pass a single merge case (the checks' expected values come
    from the scores, not from a ⊕). The solutions' ⊕ passes them all, so the harness can tell."""
    import importlib

    from solutions import online_softmax as sol

    passed, n = _merge_cases_passed(lambda a, b: sol.merge_partial(a, b) if len(a) == 3 else sol.merge_summary(a, b))
    assert len(passed) == n > 10, "the harness passes a correct ⊕ on every merge case"
    assert _merge_cases_passed(lambda a, b: a)[0] == [], "and fails a wrong one"
    scoring = {}
    for module in map(importlib.import_module, SHIPPED_JUDGE_MODULES):
        functions = _two_argument_functions(module)
        assert functions or module.__name__.endswith("diagnose"), module.__name__
        for fn in functions:
            passed, _ = _merge_cases_passed(fn)
            if passed:
                scoring[f"{module.__name__}.{fn.__name__}"] = passed
    assert not scoring, f"shipped judge code computes a working ⊕ (students can import it): {scoring}"


def _summary_cases_passed(fn) -> tuple[list[str], int]:
    """The part-1 online_summary cases (public and hidden rows) that `fn` in the place of online_summary
    passes (its outputs cast to the input's dtype), and how many there are."""
    import torch

    from autograder.tests import cases_part1 as C
    from autograder.tests import test_part1_online_softmax as public
    from instructor.hidden_tests import part1_online_softmax as hidden

    def summary(x):
        out = fn(x)
        return type(out)(t.to(x.dtype) if isinstance(t, torch.Tensor) else t for t in out) \
            if type(out) in (tuple, list) else out

    student = _Direct(summary)
    passed = []
    # rows that are all -inf are left out: their summary (-inf, 0) does not depend on the values
    cases = [c for c in [*public.ROWS, *hidden.ROWS] if not bool(torch.isneginf(c.x()).all())]
    for case in cases:
        try:
            C.check_summary(student, case)
        except Exception:  # noqa: BLE001 -- a CheckFailure, or the candidate cannot take x at all
            continue
        passed.append(case.id)
    return passed, len(cases)


def test_no_shipped_judge_function_is_a_working_summary():
    """Each one-argument function of the shipped part-1 cases, probes and diagnosis in the place of
    online_summary passes no case: the judge's references compute in numpy, which the recorder does
    not see, so their answers enter the replay as constants (refused, or wrong on the twin's inputs)."""
    import importlib
    import inspect

    from solutions import online_softmax as sol

    passed, n = _summary_cases_passed(sol.online_summary)
    assert len(passed) == n > 5, "the harness passes a correct online_summary on every case"
    assert _summary_cases_passed(lambda x: (x.amax(-1), x.exp().sum(-1)))[0] != _summary_cases_passed(sol.online_summary)[0]
    scoring = {}
    for module in map(importlib.import_module, SHIPPED_JUDGE_MODULES):
        for name, obj in vars(module).items():
            if not (inspect.isfunction(obj) and obj.__module__ == module.__name__):
                continue
            try:
                inspect.signature(obj).bind(None)
            except TypeError:
                continue
            passed, _ = _summary_cases_passed(obj)
            if passed:
                scoring[f"{module.__name__}.{name}"] = passed
    assert not scoring, f"shipped judge code computes a working online_summary (students can import it): {scoring}"


# ---------------------------------------------------------------------------------------------------
# The scan reads everything it is given, and refuses what it cannot read (fails closed): binary files
# as their bytes, single files, archives (zip, tar, gzip, bzip2, xz; nested, within bounds).

import bz2  # noqa: E402
import gzip  # noqa: E402
import io  # noqa: E402
import struct  # noqa: E402
import tarfile  # noqa: E402
import zipfile  # noqa: E402

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"
HIDDEN = ROOT / "instructor" / "hidden_tests"


def _leaky_members() -> dict[str, bytes]:
    """The solutions and hidden tests, under their repository paths (what a careless archive holds)."""
    return {f.relative_to(ROOT).as_posix(): f.read_bytes()
            for f in [*sorted((ROOT / "solutions").glob("*.py")), *sorted(HIDDEN.glob("*.py"))]}


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return b.getvalue()


def _tar(members: dict[str, bytes], mode: str = "w") -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode=mode) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return b.getvalue()


LEAKY_ARCHIVES = {  # name -> bytes, each holding the solutions and hidden tests
    "extra.zip": lambda m: _zip(m),
    "extra-stored.zip": lambda m: _zip(m, zipfile.ZIP_STORED),
    "extra.tar": lambda m: _tar(m),
    "extra.tar.gz": lambda m: _tar(m, "w:gz"),
    "extra.tgz": lambda m: _tar(m, "w:gz"),
    "extra.tar.bz2": lambda m: _tar(m, "w:bz2"),
    "extra.tar.xz": lambda m: _tar(m, "w:xz"),
    "flash_forward.py.gz": lambda m: gzip.compress(m["solutions/flash_forward.py"]),
    "notes.bz2": lambda m: bz2.compress(m["solutions/flash_forward.py"]),
    "nested.tar.gz": lambda m: _tar({"inner/more.zip": _zip({"deeper.tgz": _tar(m, "w:gz")})}, "w:gz"),
    "figure.png": lambda m: (ROOT / "code" / "lecture05" / "figures" / "roofline.png").read_bytes() + _zip(m),
    "no-suffix": lambda m: _zip(m),
}


@pytest.mark.parametrize("name", sorted(LEAKY_ARCHIVES))
def test_the_scan_looks_inside_archives_of_every_kind(release, tmp_path, name):
    """An archive in the release, and an archive given to --scan, is opened and its members scanned
    (whatever it is called: a zip behind a PNG is found by its bytes)."""
    data = LEAKY_ARCHIVES[name](_leaky_members())
    leaky = tmp_path / "leaky"
    shutil.copytree(release[0], leaky)
    (leaky / "docs" / name).write_bytes(data)
    problems = "\n".join(scan(leaky))
    assert f"docs/{name}::" in problems, problems[:2000]
    assert "contains code copied from the solution region at solutions/flash_forward.py" in problems
    if name not in ("flash_forward.py.gz", "notes.bz2"):
        assert "a solutions file" in problems and "a hidden-test file" in problems
        assert "contains code copied from the hidden test instructor/hidden_tests/" in problems
    (tmp_path / name).write_bytes(data)  # the archive alone
    assert any(p.startswith(f"{tmp_path / name}::") for p in scan(tmp_path / name))


def test_an_archive_of_a_clean_release_is_clean_and_its_members_are_scanned(release, tmp_path):
    out, _ = release
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    for name, data in (("release.zip", _zip(files)), ("release.tar.gz", _tar(files, "w:gz"))):
        (tmp_path / name).write_bytes(data)
        problems, counts = rel.scan_report(tmp_path / name)
        assert problems == [], problems
        assert counts["files"] == 1 and counts["members"] >= len(files), counts  # the .pt checkpoint is a zip too
    problems, counts = rel.scan_report(out)
    assert problems == [] and counts["files"] == len(files) and counts["members"] > 0, counts


def _encrypted_zip() -> bytes:
    """A zip whose member is marked encrypted (zipfile cannot write one: the flag is set by hand)."""
    data = bytearray(_zip({"a.py": (ROOT / "solutions" / "flash_forward.py").read_bytes()}))
    data[6] |= 1  # the local header's flags
    cd = data.rindex(b"PK\x01\x02")
    data[cd + 8] |= 1  # the central directory entry's flags
    return bytes(data)


def _hidden_member_zip() -> bytes:
    """A zip whose first member (the solution) is left out of its central directory: zipfile lists only
    the second, so a reader of the directory never sees the first."""
    data = _zip({"s.py": (ROOT / "solutions" / "flash_forward.py").read_bytes(), "ok.txt": b"fine\n"})
    eocd = data.rindex(b"PK\x05\x06")
    count = struct.unpack("<H", data[eocd + 10:eocd + 12])[0]
    size, offset = struct.unpack("<II", data[eocd + 12:eocd + 20])
    cd = data[offset:offset + size]
    cd = cd[cd.index(b"PK\x01\x02", 4):]
    tail = bytearray(data[eocd:])
    tail[8:12] = struct.pack("<HH", count - 1, count - 1)
    tail[12:16] = struct.pack("<I", len(cd))
    hidden = data[:offset] + cd + bytes(tail)
    assert zipfile.ZipFile(io.BytesIO(hidden)).namelist() == ["ok.txt"]
    return hidden


def _nested(depth: int) -> bytes:
    data, name = f"# {canaries()[0]}\n".encode(), "t.txt"
    for i in range(depth):
        data, name = _zip({name: data}), f"n{i}.zip"
    return data


UNSCANNABLE = {  # name -> (bytes, what the refusal says)
    "corrupt.zip": (lambda: b"PK\x03\x04" + bytes(range(256)) * 4, "cannot be read as a zip archive"),
    "junk.zip": (lambda: b"this is no zip\n", "named like an archive (.zip)"),
    "truncated.tar.gz": (lambda: _tar(_leaky_members(), "w:gz")[:300], "cannot be read as a gzip archive"),
    "bad-crc.zip": (lambda: _zip({"a.txt": b"x" * 100}, zipfile.ZIP_STORED).replace(b"x" * 100, b"y" * 100),
                    "cannot be read as a zip archive"),
    "x.7z": (lambda: b"7z\xbc\xaf\x27\x1c" + bytes(32), "a 7z archive, which the scan cannot open"),
    "x.zst": (lambda: b"\x28\xb5\x2f\xfd" + bytes(32), "a zstd archive, which the scan cannot open"),
    "x.rar": (lambda: b"Rar!\x1a\x07\x00" + bytes(32), "a rar archive, which the scan cannot open"),
    "encrypted.zip": (_encrypted_zip, "is encrypted"),
    "hidden-member.zip": (_hidden_member_zip, "its directory does not list"),
    "concatenated.tar": (lambda: _tar({"a.txt": b"a\n"}) + _tar(_leaky_members()), "after the last member"),
    "deep.zip": (lambda: _nested(rel.ARCHIVE_DEPTH + 2), "archives nested more than"),
}


@pytest.mark.parametrize("name", sorted(UNSCANNABLE))
def test_an_archive_the_scan_cannot_read_is_refused_not_passed(release, tmp_path, name):
    make, why = UNSCANNABLE[name]
    data = make()
    leaky = tmp_path / "leaky"
    shutil.copytree(release[0], leaky)
    (leaky / "docs" / name).write_bytes(data)
    problems = scan(leaky)
    assert any(p.startswith(f"docs/{name}") and why in p and "\n" not in p for p in problems), problems
    (tmp_path / name).write_bytes(data)
    assert any(why in p for p in scan(tmp_path / name))


def test_archives_past_the_bounds_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(rel, "ARCHIVE_BYTES", 10_000)
    (tmp_path / "big.zip").write_bytes(_zip({"zeros.txt": bytes(20_000)}))  # 20 kB unpacked from ~100 bytes
    assert any("unpacks to more than" in p for p in scan(tmp_path / "big.zip"))
    (tmp_path / "ok.zip").write_bytes(_zip({"zeros.txt": bytes(5_000)}))
    assert scan(tmp_path / "ok.zip") == []
    monkeypatch.setattr(rel, "ARCHIVE_MEMBERS", 3)
    (tmp_path / "many.zip").write_bytes(_zip({f"{i}.txt": b"x" for i in range(5)}))
    assert any("holds more than 3 members" in p for p in scan(tmp_path / "many.zip"))
    monkeypatch.setattr(rel, "ARCHIVE_DEPTH", 2)
    (tmp_path / "deep.zip").write_bytes(_nested(3))
    assert any("nested more than 2 deep" in p for p in scan(tmp_path / "deep.zip"))
    (tmp_path / "deep.zip").write_bytes(_nested(2))
    assert any("contains the canary" in p for p in scan(tmp_path / "deep.zip")), "within the bound: scanned"


def test_the_scan_reads_binary_and_encoded_files_as_their_bytes(release, tmp_path):
    """A canary or solution code in a file that is not UTF-8 text is found all the same: in the raw
    bytes of a binary file, in UTF-16, and in a notebook (JSON: the code is in escaped strings)."""
    out, _ = release
    leaky = tmp_path / "leaky"
    shutil.copytree(out, leaky)
    token = canaries()[0]
    solution = "\n".join(line for line in (ROOT / "solutions" / "flash_forward.py").read_text().splitlines()
                         if "SOLUTION" not in line and "CANARY" not in line)
    (leaky / "docs" / "fig.jpg").write_bytes(JPEG[:-2] + f"<{token}>".encode() + JPEG[-2:])
    (leaky / "docs" / "utf16.md").write_bytes(f"see {token}\n".encode("utf-16"))
    (leaky / "docs" / "lesson.ipynb").write_text(
        __import__("json").dumps({"cells": [{"cell_type": "code", "source": solution.splitlines(True)}]}, indent=1))
    problems = "\n".join(scan(leaky))
    assert f"docs/fig.jpg: contains the canary {token}" in problems
    assert f"docs/utf16.md: contains the canary {token}" in problems
    assert "docs/lesson.ipynb: contains code copied from the solution region at solutions/flash_forward.py" in problems


def test_what_the_scan_cannot_read_in_a_folder_is_a_problem(release, tmp_path):
    out, _ = release
    leaky = tmp_path / "leaky"
    shutil.copytree(out, leaky)
    (leaky / "docs" / "answers.py").symlink_to(ROOT / "solutions" / "flash_forward.py")
    (leaky / "docs" / "more").symlink_to(ROOT / "solutions")
    os.mkfifo(leaky / "docs" / "pipe")
    problems = "\n".join(scan(leaky))
    assert "docs/answers.py: a symlink" in problems and "docs/more: a symlink" in problems
    assert "docs/pipe: not a regular file" in problems
    empty = tmp_path / "empty"
    empty.mkdir()
    assert any("holds no file to scan" in p for p in scan(empty))


def _cli(*args: str | bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "instructor.release", *args], cwd=ROOT, capture_output=True,
                          env={**_env(), "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8", **(env or {})}, timeout=300)


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode != 0, (r.stdout, err)
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert b"clean" not in r.stdout, r.stdout
    for w in words:
        assert w in err, err
    return err


def test_scan_cli_refuses_a_path_it_cannot_scan(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    _one_line_error(_cli("--scan", str(tmp_path / "nonexistent")), "does not exist", "give the release folder")
    _one_line_error(_cli("--scan", str(tmp_path / "pipe")), "not a folder or a regular file")
    _one_line_error(_cli("--scan", str(tmp_path / "x.zip" / "y")), "does not exist")


def test_scan_cli_scans_a_single_file_and_an_archive(tmp_path):
    r = _cli("--scan", str(ROOT / "solutions" / "flash_forward.py"))
    assert r.returncode == 1 and b"contains a solution marker" in r.stdout and b"clean" not in r.stdout, r
    (tmp_path / "leaky.zip").write_bytes(_zip(_leaky_members()))
    r = _cli("--scan", str(tmp_path / "leaky.zip"))
    assert r.returncode == 1 and b"leaky.zip::solutions/flash_forward.py: a solutions file" in r.stdout, r
    assert b"leaky.zip::instructor/: an instructor-only folder is present" in r.stdout
    assert r.stderr.decode().startswith("error: ") and r.stderr.count(b"\n") == 1, r.stderr
    (tmp_path / "ok.txt").write_text("nothing secret\n")
    r = _cli("--scan", str(tmp_path / "ok.txt"))
    assert r.returncode == 0 and b"clean (1 files and 0 archive members scanned" in r.stdout, r


# --- make release on a source tree that holds a binary file or an archive (a copy of the repository)


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A copy of the repository's student folders, solutions and student requirements as rel.ROOT (the
    hidden tests and canaries stay the real ones)."""
    repo = tmp_path / "repo"
    for folder in (*rel.STUDENT, "solutions"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns(*rel.SKIP, "*.pyc"))
    for f in ("requirements-student.txt", "requirements-student.lock"):
        shutil.copy(ROOT / f, repo / f)
    monkeypatch.setattr(rel, "ROOT", repo)
    return repo


def test_make_release_ships_binary_files_counts_their_bytes_and_scans_them(source, tmp_path, capsys):
    (source / "docs" / "handout" / "fig.jpg").write_bytes(JPEG)
    out = tmp_path / "out"
    assert rel.main(["--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(scanned: clean)" in printed and " bytes" in printed, printed
    assert (out / "docs" / "handout" / "fig.jpg").read_bytes() == JPEG
    docs = {name: (n, lines, size) for name, n, lines, size in rel.sizes(out)}["docs"]
    shipped = [p for p in (out / "docs").rglob("*") if p.is_file()]
    assert docs[0] == len(shipped) and docs[2] == sum(p.stat().st_size for p in shipped)
    assert docs[1] == sum(len(p.read_text().splitlines()) for p in shipped if p.suffix == ".md")
    token = canaries()[0]  # a canary inside a binary file's bytes
    (source / "docs" / "handout" / "fig.jpg").write_bytes(JPEG[:-2] + token.encode() + JPEG[-2:])
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(tmp_path / "out2")])
    assert f"docs/handout/fig.jpg: contains the canary {token}" in str(e.value.code)


@pytest.mark.parametrize("name", ["extra.zip", "extra.tar.gz", "nested.tar.gz", "figure.png"])
def test_make_release_refuses_a_source_archive_that_holds_solutions(source, tmp_path, name):
    (source / "docs" / name).write_bytes(LEAKY_ARCHIVES[name](_leaky_members()))
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(tmp_path / "out")])
    msg = str(e.value.code)
    assert msg.startswith("error: refusing the release") and f"docs/{name}::" in msg, msg[:2000]
    assert "(scanned: clean)" not in msg


def test_make_release_refuses_a_source_archive_it_cannot_read(source, tmp_path):
    (source / "docs" / "bundle.7z").write_bytes(UNSCANNABLE["x.7z"][0]())
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(tmp_path / "out")])
    assert "docs/bundle.7z: a 7z archive, which the scan cannot open" in str(e.value.code)


# --- bad --out values and arguments: one line ("error: ...", what to do), a non-zero exit, no traceback


def _bad_out(tmp_path: Path, kind: str) -> str:
    if kind == "a file":
        (tmp_path / "file").write_text("x\n")
        return str(tmp_path / "file")
    if kind == "a folder under a file":
        (tmp_path / "file").write_text("x\n")
        return str(tmp_path / "file" / "release")
    if kind == "a symlink loop":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        return str(tmp_path / "loop" / "release")
    if kind == "procfs":
        return "/proc/release"
    if kind == "a device":
        return "/dev/null/release"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["a file", "a folder under a file", "a symlink loop", "procfs", "a device"])
def test_a_bad_out_is_one_line_and_a_nonzero_exit(tmp_path, kind):
    if kind == "procfs" and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    out = _bad_out(tmp_path, kind)
    _one_line_error(_cli("--out", out), "--out")


@pytest.mark.parametrize("folder", [*rel.STUDENT, *rel.INSTRUCTOR])
def test_an_out_inside_the_repository_folders_is_refused(source, folder):
    """Into starter/ (or any folder of the repository but build/), the next release would ship this
    one. In a copy of the repository (rel.ROOT), so that a failing run writes nothing here."""
    (source / folder).mkdir(exist_ok=True)
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(source / folder / "release")])
    msg = str(e.value.code)
    assert msg.startswith("error: refusing") and "\n" not in msg and "--out" in msg, msg
    assert not (source / folder / "release").exists()


def test_a_write_that_fails_midway_is_one_line(tmp_path, monkeypatch):
    """A read-only file system or a full disk (the OS refuses a write; root is not stopped by modes,
    so the refusal is simulated where the release writes)."""
    import errno

    def refuse(out, rel_path, data, mode=0o644):
        raise OSError(errno.EROFS, "Read-only file system", str(out / rel_path))

    monkeypatch.setattr(rel, "_write", refuse)
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(tmp_path / "out")])
    msg = str(e.value.code)
    assert msg.startswith("error: cannot write the release") and "Read-only file system" in msg, msg
    assert "\n" not in msg and "--out" in msg


@pytest.mark.parametrize("args", [["--out"], ["--scan"], ["--bogus"], ["--out", "a", "--scan", "b"]])
def test_bad_arguments_are_one_line(args):
    r = _cli(*args)
    assert r.returncode == 2
    _one_line_error(r, "--help")


def test_an_out_path_that_is_not_utf8_is_written_and_printed(tmp_path):
    out = os.fsencode(tmp_path) + b"/rel\xff"
    r = _cli("--out", out, env={"PYTHONIOENCODING": "utf-8"})  # a strict stdout, as under en_US.UTF-8
    assert r.returncode == 0 and b"(scanned: clean)" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert b"Traceback" not in r.stderr and os.path.isfile(out + b"/Makefile")


def test_output_into_a_closed_pipe_is_no_traceback(tmp_path):
    """`... | head -1`: the reader goes away; the command ends without a traceback, non-zero."""
    (tmp_path / "ok.txt").write_text("nothing secret\n")
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "instructor.release", "--scan", str(tmp_path / "ok.txt")], cwd=ROOT,
                           stdout=write, stderr=subprocess.PIPE, env={**_env(), "PYTHONPATH": str(ROOT)}, timeout=300)
    finally:
        os.close(write)
    assert r.returncode != 0 and b"Traceback" not in r.stderr and b"BrokenPipe" not in r.stderr, r.stderr


# --- a refused release leaves nothing shippable; the canary list is required; .git history is scanned


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    repo.mkdir(parents=True, exist_ok=True)
    env = {**_env(), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env, timeout=120)


def _tree(folder: Path) -> dict[str, bytes]:
    """Every entry under `folder` (a folder as None), .git included."""
    return {p.relative_to(folder).as_posix(): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def test_a_refused_release_leaves_out_as_it_was(source, tmp_path):
    out = tmp_path / "student"
    _git(out, "init", "-q")
    assert rel.main(["--out", str(out)]) == 0
    (out / "my-notes.txt").write_text("mine\n")
    before = _tree(out)
    token = canaries()[0]
    (source / "docs" / "handout" / "leak.md").write_text(f"<!-- {token} -->\n")  # a new file with a canary
    (source / "starter" / "online_softmax.py").write_text("# changed, and would overwrite the old release\n")
    with pytest.raises(SystemExit) as e:
        rel.main(["--out", str(out)])
    msg = str(e.value.code)
    assert f"docs/handout/leak.md: contains the canary {token}" in msg and "nothing in it was written" in msg, msg
    assert _tree(out) == before, "a refused release changes nothing in --out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "student"], "no staging folder is left beside --out"
    fresh = tmp_path / "a" / "b" / "release"  # and into a folder that did not exist: nothing is left at all
    with pytest.raises(SystemExit, match="refusing the release"):
        rel.main(["--out", str(fresh)])
    assert not (tmp_path / "a").exists()


def test_a_file_the_instructor_keeps_in_out_is_scanned_with_the_release(release, tmp_path):
    out = tmp_path / "repo"
    build(out)
    (out / "course" / "notes.md").write_text("### BEGIN SOLUTION\n")  # not written by the tool, but it ships
    _one_line_free = _tree(out)
    with pytest.raises(SystemExit) as e:
        build(out)
    assert "course/notes.md: contains a solution marker" in str(e.value.code)
    assert _tree(out) == _one_line_free


@pytest.mark.parametrize("kind", ["missing", "a folder", "not UTF-8"])
def test_a_missing_or_unreadable_canary_list_is_refused_in_one_line(tmp_path, monkeypatch, kind):
    listed = tmp_path / "canaries.txt"
    if kind == "a folder":
        listed.mkdir()
    elif kind == "not UTF-8":
        listed.write_bytes(b"CANARY-X-\xff\xfe\n")
    monkeypatch.setattr(rel, "CANARIES", listed)
    (tmp_path / "ok.txt").write_text("nothing secret\n")
    for argv in (["--out", str(tmp_path / "out")], ["--scan", str(tmp_path / "ok.txt")]):
        with pytest.raises(SystemExit) as e:
            rel.main(argv)
        msg = str(e.value.code)
        assert msg.startswith("error: the canary list") and "\n" not in msg and "restore it" in msg, msg
        assert ("is missing" if kind == "missing" else "cannot be read") in msg, msg
    assert not (tmp_path / "out").exists()


def test_the_history_of_a_release_repository_is_scanned(release, tmp_path, capsys):
    out = tmp_path / "repo"
    _git(out, "init", "-q")
    build(out)
    _git(out, "add", "-A")
    _git(out, "commit", "-qm", "release")
    assert rel.main(["--scan", str(out)]) == 0
    objects = int(re.search(r"\.git history: (\d+) objects scanned", capsys.readouterr().out).group(1))
    assert objects > len(rel.shipped_files())  # the blobs, trees are not counted, plus the commit
    shutil.copy(ROOT / "solutions" / "online_softmax.py", out / "docs" / "leak.py")
    _git(out, "add", "docs/leak.py")
    _git(out, "commit", "-qm", "oops")
    _git(out, "rm", "-q", "docs/leak.py")
    _git(out, "commit", "-qm", "removed again: but still in the history a push publishes")
    assert not (out / "docs" / "leak.py").exists()
    with pytest.raises(SystemExit) as e:
        build(out)
    msg = str(e.value.code)
    assert ".git::docs/leak.py (blob " in msg and "contains a solution marker" in msg and "history" in msg, msg
    assert rel.main(["--scan", str(out)]) == 1 and ".git::docs/leak.py" in capsys.readouterr().out
    (out / "docs" / "leak.py").write_text("staged, never committed: BEGIN SOLUTION\n")
    _git(out, "add", "docs/leak.py")
    (out / "docs" / "leak.py").unlink()
    problems = scan(out)
    assert any(p.startswith(".git::docs/leak.py") and "marker" in p for p in problems)  # the index too


def test_a_git_folder_the_scan_cannot_read_is_refused(release, tmp_path):
    src, _ = release
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # not a repository git can read
    problems = scan(out)
    assert [p for p in problems if p.startswith(".git/: git cannot read it")], problems
    r = _cli("--scan", str(out))
    assert r.returncode == 1 and b".git/: git cannot read it" in r.stdout and b"Traceback" not in r.stderr


@pytest.mark.parametrize("readme", ["README.md", "instructor/README.md"])
def test_the_readmes_say_github_classroom_points_are_feedback_not_a_grade(readme):
    """GitHub Classroom's autograding runs in the student's own repository: the student can change
    the workflow, the tests and the points. A README that describes it must say so, and name the
    channels whose hidden tests give the grade."""
    text = (ROOT / readme).read_text(encoding="utf-8")
    assert "GitHub Classroom" in text
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    said = [p for p in paragraphs if "GitHub Classroom" in p and "student's own repository" in p
            and "not a grade" in p and "hidden tests" in p and "Gradescope" in p and "nbgrader" in p
            and ("batch" in p.lower())]
    assert said, f"{readme}: no paragraph says GitHub Classroom's points are feedback the student can alter, not a grade"
