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
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    build(out)  # a folder holding only .git: allowed (a fresh clone of the student repository)
    (out / "my-notes.txt").write_text("mine\n")
    (out / "docs" / "stale.md").write_text("from an older release\n")
    manifest = (out / rel.MANIFEST).read_text()
    (out / rel.MANIFEST).write_text(manifest.replace('"files": [', '"files": [\n  "docs/stale.md",'))
    info = build(out)
    assert (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n", ".git is kept"
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

SHIPPED_JUDGE_MODULES = ("autograder.tests.cases_part1", "autograder.tests.probes", "autograder.tests.diagnose")


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
