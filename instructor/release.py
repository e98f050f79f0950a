"""Write the student repository: the student folders whole, plus generated top-level files.

    python -m instructor.release --out DIR        # then: cd DIR && make grade
    python -m instructor.release --scan DIR       # only scan an existing release for leaks

What ships is decided by folder, not by a list of files (the top level of this repository says who
gets what): the STUDENT folders (starter/, course/, autograder/, code/, docs/) are copied whole,
minus caches and the few instructor-only files inside them (INSTRUCTOR_FILES, e.g. the grader's
maintainer notes, replaced by a student version); the INSTRUCTOR folders (instructor/, solutions/,
tests/, benchmarks/) never ship. The top-level files are generated here: Makefile, README.md,
requirements.txt + requirements.lock (the student set: requirements-student.txt/.lock), .gitignore
and the GitHub Classroom workflow (.github/workflows/classroom.yml).

Rebuilding into an existing release replaces only the files this command wrote last time (listed in
MANIFEST); anything else there, a `.git` folder included, is kept.

A refused release leaves nothing of itself on disk: it is written into a staging folder next to
`--out` (same file system, so the move is a rename), scanned there together with what `--out`
already holds and keeps (the instructor's own files, the `.git` history), and moved into place only
when the scan is clean; a refusal (or a write that fails) deletes the staging folder and leaves
`--out` exactly as it was. Staging rather than writing in place and cleaning up: cleaning up could
not restore the previous release's files that the refused one had overwritten (the instructor's
working tree would hold a half-deleted release, its deletions ready to commit), and a run killed
between the write and the scan would leave the refused files inside the release repository, where
`git add .` takes them; a killed run here leaves only a hidden `.NAME.release-staging-*` folder
beside it. An earlier release in `--out` stays as it was: `--scan DIR` checks it with today's
canaries. Every path written or deleted
must lie inside the release folder with no symlink on the way, and the source tree may hold no
symlink (both refused with one line, before anything is touched: `_dest`, `shipped_files`).

Every release is scanned before this command succeeds (`scan`): no canary string (listed in
instructor/canaries.txt, which must exist and be readable, else the scan is refused: a scan
without the list would pass what the list protects; plus any `CANARY-...` token found in
solutions/ or the hidden tests), no
hidden-test file, no solution marker, no run of 4 consecutive code lines of a solution region or
of a hidden test (runs that the course package or the shipped tests contain are public anyway), and
no Python file that imports an instructor-only package (`instructor_imports`). The scan reads every
file as bytes (a binary file too), and every member of the archives among them (zip, tar, gzip,
bzip2, xz; nested, within ARCHIVE_DEPTH / ARCHIVE_BYTES / ARCHIVE_MEMBERS), and it fails closed:
a file it cannot read (a symlink, a device, an archive it cannot open or that is past a bound, a
format it does not know such as 7z) is a problem, which refuses the release like a leak. `--scan`
takes a folder, an archive or one file; a path it cannot scan is refused with one line.

A `.git` folder is not scanned as files (its objects are compressed), but as the repository it is:
an existing release repository's history is the instructor's, and a push publishes every commit
it holds, so a solution committed there once leaks with the next push. The scan reads, with
`git rev-list --objects --all --reflog --indexed-objects` and `git cat-file --batch` (local
commands, no network, no hooks), every blob, commit and tag reachable from a ref, a reflog or the
index, and checks each like a file (named `.git::PATH (blob SHA)`). It fails closed: git missing,
a `.git` git cannot read, or a history past GIT_BYTES is a problem. The one-line result says how
many objects of `.git` history were scanned.
"""
from __future__ import annotations

import ast
import bz2
import codecs
import errno
import gzip
import io
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent
CANARIES = ROOT / "instructor" / "canaries.txt"
CANARY_TOKEN = re.compile(r"CANARY-[A-Z]+-[0-9A-Za-z]{6,}")
SOLUTION_RUN = 4  # consecutive code lines of a solution region that count as a copy of it
SKIP = {"__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints"}
MANIFEST = ".release-manifest"  # the files this command wrote, so that a rebuild replaces only those
HIDDEN_DIR = ROOT / "instructor" / "hidden_tests"

# The top level of the repository, by who gets it (tests/test_release.py fails on a new entry that
# is in neither list, so that every new folder is a decision).
STUDENT = ("starter", "course", "autograder", "code", "docs")
INSTRUCTOR = ("instructor", "solutions", "tests", "benchmarks")
TOP_LEVEL_FILES = ("Makefile", "README.md", "pyproject.toml", "requirements.txt", "requirements.lock",
                   "requirements-student.txt", "requirements-student.lock", ".gitignore")  # generated anew in the release
# Files inside the student folders that do not ship as they are.
INSTRUCTOR_FILES = {"autograder/README.md": "the grader's maintainer notes: a student version is written instead"}
# Sections of autograder/README.md that are about instructor tools (dropped from the student version).
INSTRUCTOR_SECTIONS = ("Starter and handout", "Mutation catalogue")
PYTHON = "3.11"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

MAKEFILE = """\
# FlashAttention assignment. Implement the six files in starter/ (see docs/handout/README.md),
# then `make grade` (all parts) or `make grade PART=2`. `make grade IMPL=dir` grades another folder.
# With your own Python environment: make grade PY=/path/to/python (no virtualenv is made).

PYTHON ?= python{python}
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
# The stamp names the pins it installed (a checksum of requirements.txt and requirements.lock): a fresh
# clone, whose files are newer than any stamp but pin the same versions, installs nothing (nor touches a
# virtualenv shared through a symlink); other pins install theirs, and the stamps of other pins go only
# when that install changed a package (the course repository's pins, a superset, change nothing: both stay).
PINS   := $(shell cat requirements.txt requirements.lock 2>/dev/null | cksum | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(PINS)
# torch's CPU build comes from PyTorch's CPU index (PyPI's Linux wheel is the much larger CUDA
# build). Offline, or with a local torch 2.13.0 wheel that pip finds: make venv TORCH_INDEX=
TORCH_INDEX ?= {torch_index}
export PYTHONPATH := $(CURDIR)
export PYTHONHASHSEED := 0

IMPL ?= starter
PART ?=
# IMPL="my work" reaches the grader as ONE word, whatever it holds: recipes pass it through $(call q,...)
q = '$(subst ','\\'',$(1))'

ifeq ($(PY),$(VENV)/bin/python)
DEPS := $(STAMP)
endif

.PHONY: help venv grade grade-ci debug demos

help:
\t@echo "make grade [PART=1..6] [IMPL=starter]   grade your implementation (public tests)"
\t@echo "make debug PART=N [IMPL=starter]        run the first failing public test of part N here, in this process (pdb, print); not a grade"
\t@echo "make demos [IMPL=starter]               run the five lecture programs (code/lecture05) on your implementation"

venv: $(STAMP)

$(STAMP):
\t@command -v $(PYTHON) >/dev/null || {{ echo "error: $(PYTHON) not found; install Python {python} or run make PYTHON=/path/to/python{python}"; exit 1; }}
\ttest -x $(PY) || $(PYTHON) -m venv $(VENV)
\t@before=$$($(PY) -m pip freeze --all 2>/dev/null | cksum); \\
\t$(PY) -m pip install --quiet --disable-pip-version-check $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r requirements.txt -c requirements.lock || exit 1; \\
\tafter=$$($(PY) -m pip freeze --all 2>/dev/null | cksum); \\
\tif [ "$$before" != "$$after" ]; then rm -f $(VENV)/.installed $(VENV)/.installed-*; fi
\ttouch $(STAMP)

# Not every test passes yet: the grader exits 1, and GNU make would add its own
# "make: *** [Makefile:..: grade] Error 1" under the feedback, which reads like a crash. So the
# recipe ends make itself with SIGPIPE, which shells do not report: the exit status stays
# non-zero (141) for scripts and CI, and the last lines on screen are the grader's.
grade: $(DEPS)
\t@$(PY) -m autograder.grade --impl=$(call q,$(IMPL)) $(if $(PART),--part=$(call q,$(PART))) || {{ s=$$?; [ $$s -eq 1 ] && kill -PIPE $$PPID; exit $$s; }}

# The same for scripts and CI (GitHub Classroom): the grader's own exit status, make's usual message.
grade-ci: $(DEPS)
	@$(PY) -m autograder.grade --impl=$(call q,$(IMPL)) $(if $(PART),--part=$(call q,$(PART)))

debug: $(DEPS)
\t@$(PY) -m autograder.debug --impl=$(call q,$(IMPL)) $(if $(PART),--part=$(call q,$(PART)))

demos: $(DEPS)
\t@for p in code/lecture05/0*.py; do echo; echo "=== $$p ==="; $(PY) $$p --impl=$(call q,$(IMPL)) || exit 1; done
"""

README = """\
# FlashAttention from the ground up — assignment

Implement the six files in `starter/`; the handout (`docs/handout/README.md`) states what each
part asks, with shapes and conventions, and links one page per part.

## Setup

You need Python {python} (`python{python} --version`) and GNU make. The first `make` command creates
a virtual environment in `.venv/` and installs the pinned packages into it (`requirements.txt`,
versions fixed by `requirements.lock`: torch 2.13.0 CPU build, numpy, pytest, hypothesis, rich,
matplotlib; a few minutes and about 1 GB on disk, once). torch's CPU build comes from PyTorch's CPU
index ({torch_index}); without access to it, `make venv TORCH_INDEX=` installs `torch==2.13.0`
from PyPI or from a local wheel that pip finds. To use your own environment instead:
`make grade PY=/path/to/python`.

## Grading

    make grade            # all parts, public tests
    make grade PART=2     # one part

`make grade` prints a table (part, tests passed, points), then the first failure of each part with
what was checked, the inputs' shapes, the largest error and where it occurs, and a hint. It writes
the same content to `build/grade-report.json`. While not every test passes it exits with a
non-zero status (for scripts and CI). Your final grade uses these public tests and hidden tests
of the same kind (more shapes, seeds and edge cases).

The grader runs your code in a separate process and checks results there, so printing, exiting or
patching things inside your code cannot change a grade; it only costs you the test. It also means
that `breakpoint()` cannot stop there. To debug:

    make debug PART=2     # the first failing public test of part 2, in this process

runs that one test on the same inputs in the same process as your code, so `breakpoint()`, pdb and
`print` work. It is not a grade: it does not isolate your code, and only `make grade` scores.

## The lecture programs

The five programs in `code/lecture05/` (`code/lecture05/README.md`) run the lecture on your own
implementation: `make demos`, or one of them, e.g. `python code/lecture05/02_softmax.py`
(`--impl DIR` for another folder). A part you have not implemented yet prints one line, e.g.
"part 3 is not implemented yet: make grade PART=3", and the rest of the program runs.

## What is here

- `starter/`: your six files (the only files that are graded).
- `docs/`: the handout, one page per part, and the guide to the simulated GPU.
- `course/`: the course package your code may use (float64 references, the simulated GPU, the tiny
  transformer, the cost model). Do not edit it: the grader uses its own copy.
- `autograder/`: the grader, the rubric (`autograder/rubric.toml`) and the public tests
  (`autograder/tests/`); how it works: `autograder/README.md`.
- `code/lecture05/`: the lecture programs.
- `.github/workflows/classroom.yml`: on every push GitHub Classroom runs `make grade-ci PART=N` for
  each part (the public tests) and shows its points: a part's points when all of its tests pass.
"""

GITIGNORE = """\
.venv/
__pycache__/
*.pyc
.pytest_cache/
.hypothesis/
build/
"""

GRADER_README_NOTE = """\
> This is the student copy of the grader's notes: how `make grade` runs and checks your code. The
> hidden tests and the instructor tools it mentions are not part of this repository.

"""


def classroom_workflow() -> str:
    """.github/workflows/classroom.yml: one GitHub Classroom autograding test per part.

    The format GitHub Classroom writes itself: each test a `classroom-resources/autograding-command-
    grader@v1` step (test-name, command, timeout in minutes, max-score) whose `result` output the
    `classroom-resources/autograding-grading-reporter@v1` step collects (env `<STEP-ID>_RESULTS`,
    `runners: id,id,...`). A command test scores max-score when the command exits 0, else 0; each
    part is one test worth its rubric points, passed when all of the part's public tests pass.
    """
    rubric = tomllib.loads((ROOT / "autograder" / "rubric.toml").read_text(encoding="utf-8"))
    steps, ids = [], []
    for part in rubric["part"]:
        n, name, points = int(part["number"]), str(part["name"]), int(part["points"])
        ids.append(f"part{n}")
        steps.append(f"""\
    - name: "Part {n}: {name}"
      id: part{n}
      uses: classroom-resources/autograding-command-grader@v1
      with:
        test-name: "Part {n}: {name}"
        setup-command: ""
        command: "{classroom_command(n)}"
        timeout: 10
        max-score: {points}
""")
    reporter_env = "".join(f"        {i.upper()}_RESULTS: \"${{{{steps.{i}.outputs.result}}}}\"\n" for i in ids)
    return f"""\
# GitHub Classroom autograding: one test per part of the assignment, worth that part's points
# (autograder/rubric.toml) when all of the part's public tests pass. Written by `make release`.
name: Autograding Tests
on:
  - push
  - repository_dispatch
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    steps:
    - name: Checkout code
      uses: actions/checkout@v4
    - name: Set up Python
      uses: actions/setup-python@v5
      with:
        python-version: "{PYTHON}"
    - name: Install the pinned packages (torch CPU build)
      run: make venv
{"".join(steps)}    - name: Autograding Reporter
      uses: classroom-resources/autograding-grading-reporter@v1
      env:
{reporter_env}      with:
        runners: {",".join(ids)}
"""


def classroom_command(part: int) -> str:
    """The command one Classroom test runs (and tests/test_release.py runs locally): exit 0 when all
    of the part's public tests pass."""
    return f"make -s grade-ci PART={part}"


def student_grader_readme() -> str:
    """autograder/README.md without its instructor-tool sections, with a note on top."""
    text = (ROOT / "autograder" / "README.md").read_text(encoding="utf-8")
    head, *sections = re.split(r"(?m)^## ", text)
    kept = [s for s in sections if not s.startswith(INSTRUCTOR_SECTIONS)]
    title, _, rest = head.partition("\n")
    return title + "\n\n" + GRADER_README_NOTE + rest.lstrip("\n") + "".join("## " + s for s in kept)


def shipped_files() -> list[str]:
    """Relative paths of every file of the student folders that ships as it is.

    A symlink anywhere in a student folder (or a student folder that is one) is refused, not
    followed and not skipped: copying through it would ship whatever it points to, and skipping it
    would silently drop a file. Replace it with the regular file or folder."""
    out = []
    for folder in STUDENT:
        for f in [ROOT / folder, *sorted((ROOT / folder).rglob("*"))]:
            rel = f.relative_to(ROOT)
            if SKIP & set(rel.parts):
                continue
            if f.is_symlink():
                raise SystemExit(f"error: {rel.as_posix()} is a symlink; the release copies regular files only: "
                                 "replace it with the file or folder it points to")
            if f.is_dir() or f.suffix in (".pyc", ".pyo"):
                continue
            if not f.is_file():
                raise SystemExit(f"error: {rel.as_posix()} is not a regular file (a pipe, socket or device); "
                                 "remove it from the student folder")
            if rel.as_posix() in INSTRUCTOR_FILES:
                continue
            out.append(rel.as_posix())
    return out


def generated_files() -> dict[str, str]:
    """Relative path -> text of every file the release gets that is written here."""
    fmt = {"python": PYTHON, "torch_index": TORCH_CPU_INDEX}
    return {
        "Makefile": MAKEFILE.format(**fmt),
        "README.md": README.format(**fmt),
        "requirements.txt": (ROOT / "requirements-student.txt").read_text(encoding="utf-8"),
        "requirements.lock": (ROOT / "requirements-student.lock").read_text(encoding="utf-8"),
        ".gitignore": GITIGNORE,
        ".github/workflows/classroom.yml": classroom_workflow(),
        "autograder/README.md": student_grader_readme(),
    }


def _dest(out: Path, rel: object) -> Path:
    """`out / rel` for a path the release writes or deletes, refused (one line naming it) unless it
    is a plain relative path that stays inside `out`, outside its `.git`, and passes through no
    symlink: a tampered manifest or a link planted in an existing release must not make a rebuild
    write or delete anything elsewhere."""
    where = f"{out}/{rel}" if isinstance(rel, str) else repr(rel)
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise SystemExit(f"error: refusing the release path {where}: not a plain relative path; "
                         f"delete {out / MANIFEST} and rebuild into an empty folder")
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or ".git" in parts:
        raise SystemExit(f"error: refusing the release path {rel!r}: it is not a plain path inside {out} "
                         f"(outside .git); delete {out / MANIFEST} and rebuild into an empty folder")
    path = out
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise SystemExit(f"error: refusing to write or delete through the symlink {path} in the release; "
                             "remove it and rebuild")
    if not path.resolve().is_relative_to(out):
        raise SystemExit(f"error: refusing the release path {path}: it resolves outside {out}")
    return path


def _previous_manifest(out: Path) -> list[str] | None:
    """The files the previous release wrote (None: `out` holds no readable manifest). Every entry
    must be a path `_dest` accepts, else the build is refused before anything is touched."""
    path = _dest(out, MANIFEST)
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, list):
        raise SystemExit(f"error: {path} is not a release manifest (its \"files\" is not a list); "
                         "delete it and rebuild into an empty folder")
    for rel in files:
        _dest(out, rel)
    return files


def _makedirs(out: Path, rel: str) -> None:
    """Create the folders above `out / rel`, one at a time, none of them a symlink (_dest checked
    the existing ones; this refuses a non-folder in the way)."""
    path = out
    for part in rel.split("/")[:-1]:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise SystemExit(f"error: refusing to write the release: {path} is not a folder; remove it and rebuild")
        if not path.exists():
            path.mkdir()


def _write(out: Path, rel: str, data: bytes, mode: int = 0o644) -> None:
    """Write `data` at `out / rel` as a new file that replaces the old one: never through a symlink
    (_dest and _makedirs check the path, O_NOFOLLOW | O_EXCL the temporary file) nor into a file
    hard-linked from elsewhere (the old inode is not written to, only unlinked by the rename)."""
    path = _dest(out, rel)
    _makedirs(out, rel)
    tmp = path.with_name(f".{path.name}.release-tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # the source's bits, whatever the umask (as shutil.copy2 did)
            f.write(data)
        os.replace(tmp, _dest(out, rel))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_source(rel: str) -> tuple[bytes, int]:
    """The bytes and permission bits of the repository file `rel`, refused if it or a folder above
    it is a symlink (shipped_files refuses those; this closes the gap until the read)."""
    path = ROOT
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            raise SystemExit(f"error: {path.relative_to(ROOT)} is a symlink; the release copies regular files only: "
                             "replace it with the file it points to")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_mode & 0o777


def _out_folder(out: Path) -> Path:
    """`out` resolved, refused with one line (what is wrong, what to do) unless the release can be
    written there: not over or inside the repository's own folders, and a folder or a path whose first
    existing folder above it is a folder this process may write into."""
    try:
        out = Path(out).resolve()
    except (OSError, RuntimeError) as e:
        raise SystemExit(f"error: --out {out} cannot be resolved ({e}); choose another --out") from None
    if out == ROOT or ROOT.is_relative_to(out) or out.is_relative_to(ROOT / "instructor"):
        raise SystemExit(f"error: refusing to write the release over the repository ({out}); choose an --out "
                         "outside it, e.g. build/student-release")
    if out.is_relative_to(ROOT) and out.relative_to(ROOT).parts[0] in (*STUDENT, *INSTRUCTOR, ".git"):
        raise SystemExit(f"error: refusing to write the release into the repository's "
                         f"{out.relative_to(ROOT).parts[0]}/ ({out}): the next release would ship it; "
                         "choose an --out outside it, e.g. build/student-release")
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: cannot write the release to {out}: it is a file, not a folder; choose another --out")
    above = out
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise SystemExit(f"error: cannot write the release to {out}: {above} is a file, not a folder; "
                         "choose another --out")
    if not os.access(above, os.W_OK | os.X_OK):
        raise SystemExit(f"error: cannot write the release to {out}: {above} is not writable; "
                         "choose another --out")
    return out



def _cannot_write(out: Path, e: OSError, state: str) -> SystemExit:
    """The one line for an --out the release cannot be written to; `state` says what is in --out now."""
    where = f" ({e.filename})" if e.filename else ""
    return SystemExit(f"error: cannot write the release to {out}: {e.strerror or e}{where}; choose an --out in a "
                      f"folder you can write to, with free space, then run again ({state})")


def build(out: Path) -> dict:
    """Write the release into `out` and scan it. `out` may be absent, empty, hold only a `.git`, or
    be a previous release (then the files it wrote are replaced and nothing else is touched).

    Every path written or deleted goes through `_dest` first (inside `out`, no symlink on the way),
    and all of them are checked before the first is touched: a refused path leaves `out` as it was."""
    out = _out_folder(out)
    canaries()  # a missing or unreadable canary list: refused before anything is written
    previous = _previous_manifest(out) if out.is_dir() else None
    if out.is_dir() and previous is None and any(p.name != ".git" for p in out.iterdir()):
        raise SystemExit(f"error: {out} is not empty (and not a previous release); remove it or choose another --out")
    copied, generated = shipped_files(), generated_files()
    files = sorted(set(copied) | set(generated) | {MANIFEST})
    for rel in files:  # all checked before anything is written or deleted
        _dest(out, rel)
    sources = {rel: _read_source(rel) for rel in copied}
    made: list[Path] = []
    staging: Path | None = None
    placed = False
    try:
        try:
            _make_parents(out, made)
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.release-staging-", dir=out.parent))
            _write_release(staging, files, sources, generated)
        except OSError as e:
            raise _cannot_write(out, e, "nothing in --out was changed") from None
        problems, counts = scan_report(staging, kept=out, replaced=set(previous or []) | set(files))
        if problems:
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise SystemExit(f"error: refusing the release in {out}: its scan found {len(problems)} problem(s) (leaks "
                             "of instructor material, or files it cannot look into); nothing in it was written or "
                             "changed (an earlier release there is as it was: check it with --scan before you push "
                             "it); fix each in the source, then rebuild" + _history_hint(problems) + ":\n  "
                             + "\n  ".join(problems[:20]) + more)
        try:
            _move_into_place(staging, out, previous, files)
        except OSError as e:
            raise _cannot_write(out, e, "any files moved there so far stay there") from None
        placed = True
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not placed:
            for level in reversed(made):
                try:
                    level.rmdir()
                except OSError:
                    break
    programs = sorted(p for p in copied if re.fullmatch(r"code/lecture05/0\d_\w+\.py", p))
    return {"out": str(out), "files": files, "programs": [Path(p).name for p in programs],
            "git_objects": counts["git objects"]}


def _history_hint(problems: list[str]) -> str:
    if not any(".git::" in p or ".git/:" in p for p in problems):
        return ""
    return (" (a problem named .git::... is in the history of the release repository, which a push publishes: "
            "remove it from that history, or release into a fresh repository)")


def _make_parents(out: Path, made: list[Path]) -> None:
    """Create the missing folders above `out` (the staging folder goes beside it), appending each to
    `made` (top first), so that a refused release removes them again."""
    for level in [p for p in out.parents if not p.exists()][::-1]:
        level.mkdir()
        made.append(level)


def _move_into_place(staging: Path, out: Path, previous: list[str] | None, files: list[str]) -> None:
    """Move the scanned release from `staging` into `out`: the previous release's files that this one no
    longer has are deleted, every file is renamed over its old version (the manifest last), each path
    through `_dest`. A rename that crosses file systems (`out` a mount point) is a copy."""
    out.mkdir(exist_ok=True)
    for rel in previous or []:  # files of the previous release that this one no longer has
        stale = _dest(out, rel)
        if rel not in files and stale.is_file():
            stale.unlink()
            for parent in stale.parents:
                if parent == out or any(parent.iterdir()):
                    break
                parent.rmdir()
    for rel in sorted(files, key=lambda r: r == MANIFEST):
        _makedirs(out, rel)
        src = staging / rel
        try:
            os.replace(src, _dest(out, rel))
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            _write(out, rel, src.read_bytes(), src.stat().st_mode & 0o777)


def _write_release(out: Path, files: list[str], sources: dict[str, tuple[bytes, int]],
                   generated: dict[str, str]) -> None:
    """Write the release's files into the (empty, staging) folder `out`."""
    for rel, (data, mode) in sources.items():
        _write(out, rel, data, mode)
    for rel, text in generated.items():
        _write(out, rel, text.encode("utf-8"))
    _write(out, MANIFEST, (json.dumps({"written_by": "python -m instructor.release (make release)",
                                       "files": files}, indent=1) + "\n").encode("utf-8"))


def student_lock(requirements: Path = ROOT / "requirements-student.txt") -> str:
    """requirements-student.lock: the pins of `requirements` and of everything they need, as
    installed in this environment (importlib.metadata), one `name==version` a line, sorted."""
    import importlib.metadata as md
    from packaging.requirements import Requirement

    roots = [Requirement(line.split("#", 1)[0].strip()) for line in requirements.read_text().splitlines()
             if line.split("#", 1)[0].strip()]
    seen: dict[str, str] = {}
    todo = [r.name for r in roots]
    while todo:
        name = todo.pop()
        dist = md.distribution(name)
        key = dist.metadata["Name"]
        if key.lower() in {k.lower() for k in seen}:
            continue
        seen[key] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    pins = {k: ("2.13.0" if k == "torch" else v) for k, v in seen.items()}  # no local label: +cpu and plain alike
    return "".join(f"{k}=={v}\n" for k, v in sorted(pins.items(), key=lambda kv: kv[0].lower()))


def _imports_in(where: str, data: bytes) -> list[str]:
    """Every import of an instructor-only package (INSTRUCTOR) in the Python source `data`: `import x`,
    `from x import`, and importlib.import_module("x...") / __import__("x...")."""
    try:
        tree = ast.parse(data.decode("utf-8"), filename=where)
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        return [f"{where}: cannot be parsed ({e})"]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
            names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in INSTRUCTOR:
                found.append(f"{where}:{node.lineno}: imports {name} (instructor-only)")
    return found


def instructor_imports(release: Path) -> list[str]:
    """Every import of an instructor-only package in the Python files of `release` (a folder, an
    archive or one file; .py members of archives included), plus each file that cannot be read."""
    problems: list[str] = []
    found = [p for where, inner, data in _scanned_files(Path(release), problems) if inner.endswith(".py")
             for p in _imports_in(where, data)]
    return found + problems


# ---------------------------------------------------------------------------------------------
# the leak scan


def canaries() -> list[str]:
    """Canary strings: instructor/canaries.txt (one per line, # comments) plus CANARY-... tokens
    planted in solutions/ and the hidden tests."""
    found: set[str] = set()
    try:
        listed = _read_regular(CANARIES).decode("utf-8")
    except (OSError, _Unscannable, UnicodeDecodeError) as e:
        why = "is missing" if isinstance(e, FileNotFoundError) else f"cannot be read ({_why(e)})"
        raise SystemExit(f"error: the canary list {CANARIES} {why}: nothing was scanned (a scan without it would "
                         "pass the canaries it lists); restore it (git checkout instructor/canaries.txt) or make "
                         "it a readable UTF-8 file, then run again") from None
    for line in listed.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            found.add(line)
    for folder in (ROOT / "solutions", HIDDEN_DIR):
        for f in folder.rglob("*.py") if folder.is_dir() else []:
            found.update(CANARY_TOKEN.findall(f.read_text(encoding="utf-8", errors="replace")))
    return sorted(found)


def _why(e: BaseException) -> str:
    return (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__


def _norm_lines(text: str) -> list[str]:
    """Code lines with indentation and trailing comments' whitespace dropped; blanks and comments out."""
    out = []
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if line and not line.startswith("#"):
            out.append(line)
    return out


def solution_regions() -> list[tuple[str, list[str]]]:
    """[(where, normalised code lines)] for every solution region of solutions/*.py."""
    regions = []
    for f in sorted((ROOT / "solutions").glob("*.py")):
        inside, start, body = False, 0, []
        for i, raw in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            line = raw.strip()
            if line.startswith("### BEGIN SOLUTION"):
                inside, start, body = True, i, []
            elif line.startswith("### END SOLUTION"):
                inside = False
                regions.append((f"solutions/{f.name}:{start}", _norm_lines("\n".join(body))))
            elif inside:
                body.append(raw)
    return regions


def solution_fingerprints(run: int = SOLUTION_RUN) -> dict[tuple[str, ...], str]:
    """Sequences whose presence in a file means a solution region was copied: every run of `run`
    consecutive code lines of a region, and each whole shorter region of at least 60 characters.
    Single lines are not used: idioms like `scale = 1.0 / math.sqrt(d) if scale is None else scale`
    occur everywhere. Runs that also occur in the course package (which students get whole, e.g.
    course.tiny_transformer.greedy_generate is the uncached generation loop) are public already."""
    out: dict[tuple[str, ...], str] = {}
    for where, lines in solution_regions():
        if len(lines) >= run:
            for i in range(len(lines) - run + 1):
                out.setdefault(tuple(lines[i:i + run]), where)
        elif len(lines) >= 2 and sum(map(len, lines)) >= 60:
            out.setdefault(tuple(lines), where)
    for f in sorted((ROOT / "course").rglob("*.py")):
        for key in _copied_keys(f.read_text(encoding="utf-8"), out):
            out.pop(key, None)
    return out


def _copied_keys(text: str, prints: dict[tuple[str, ...], str]) -> set[tuple[str, ...]]:
    lines = _norm_lines(text)
    found = set()
    for n in {len(k) for k in prints}:
        for i in range(len(lines) - n + 1):
            key = tuple(lines[i:i + n])
            if key in prints:
                found.add(key)
    return found


def _copied_regions(text: str, prints: dict[tuple[str, ...], str]) -> set[str]:
    return {prints[key] for key in _copied_keys(text, prints)}


def hidden_fingerprints(run: int = SOLUTION_RUN) -> dict[tuple[str, ...], str]:
    """Runs of `run` consecutive code lines of the hidden tests that occur in no file the release
    ships by design (public tests, case generators, conftest, diagnostics): finding one in the
    release means a hidden test was copied, whatever its file is called."""
    tests = ROOT / "autograder" / "tests"
    out: dict[tuple[str, ...], str] = {}
    for f in sorted(HIDDEN_DIR.rglob("*.py")) if HIDDEN_DIR.is_dir() else []:
        lines = _norm_lines(f.read_text(encoding="utf-8"))
        for i in range(len(lines) - run + 1):
            out.setdefault(tuple(lines[i:i + run]), f"instructor/hidden_tests/{f.name}")
    shipped = list(tests.rglob("*.py"))
    for f in shipped:
        for key in _copied_keys(f.read_text(encoding="utf-8"), out):
            out.pop(key, None)
    return out


# What the scan reads: every regular file of a folder (or the one file it is given), as bytes, and
# every member of every archive among them, recursively; a file that is neither text nor an archive
# is scanned as its bytes (canaries and copied code are found in any file). Anything it cannot read
# (a symlink, a device, an unreadable file, an archive it cannot open, a format it does not know,
# an archive past these bounds) is a problem: refused, never passed.
ARCHIVE_DEPTH = 8          # containers inside containers (a .tar.gz is two: the gzip stream, then the tar)
ARCHIVE_BYTES = 256 << 20  # bytes unpacked from archives in one scan, all archives together
ARCHIVE_MEMBERS = 20_000   # members of archives in one scan, all archives together
# Archive formats known by their first bytes that the scan cannot open.
UNSUPPORTED_ARCHIVES = ((b"7z\xbc\xaf\x27\x1c", "7z"), (b"Rar!\x1a\x07", "rar"), (b"\x28\xb5\x2f\xfd", "zstd"),
                        (b"\x04\x22\x4d\x18", "lz4"), (b"\x1f\x9d", "compress (.Z)"), (b"\x1f\xa0", "compress (.Z)"),
                        (b"LZIP", "lzip"), (b"MSCF", "cab"), (b"!<arch>\n", "ar (.deb)"), (b"xar!", "xar"),
                        (b"\xed\xab\xee\xdb", "rpm"))
# Names that say "archive": a file so named that no reader here opens is refused, not read as bytes.
ARCHIVE_SUFFIXES = {".zip", ".jar", ".whl", ".egg", ".tar", ".tgz", ".taz", ".gz", ".tbz", ".tbz2", ".bz2",
                    ".txz", ".xz", ".lzma", ".7z", ".rar", ".zst", ".lz4", ".z", ".lz", ".cab", ".deb", ".rpm"}
_STREAM_SUFFIXES = {".gz": "", ".tgz": ".tar", ".taz": ".tar", ".bz2": "", ".tbz": ".tar", ".tbz2": ".tar",
                    ".xz": "", ".txz": ".tar", ".lzma": ""}


class _Unscannable(Exception):
    """A file or archive the scan cannot read; the message says why and what to do."""


class _Budget:
    """What is left of the bounds (ARCHIVE_BYTES, ARCHIVE_MEMBERS) for one scan."""

    def __init__(self) -> None:
        self.bytes, self.members = ARCHIVE_BYTES, ARCHIVE_MEMBERS

    def member(self) -> None:
        self.members -= 1
        if self.members < 0:
            raise _Unscannable(f"holds more than {ARCHIVE_MEMBERS:,} members (the bound for all archives of one "
                               "scan): refused, not scanned; unpack it into the folder, or remove it")

    def read(self, stream) -> bytes:
        data = stream.read(self.bytes + 1)
        if len(data) > self.bytes:
            raise _Unscannable(f"unpacks to more than {ARCHIVE_BYTES >> 20} MiB (the bound for all archives of "
                               "one scan): refused, not scanned; unpack it into the folder, or remove it")
        self.bytes -= len(data)
        return data


def _is_tar(data: bytes) -> bool:
    """A tar header at the start: the ustar magic, or (old tars) a valid header checksum."""
    if len(data) < 512:
        return False
    if data[257:262] == b"ustar":
        return True
    try:
        return tarfile.nti(data[148:156]) in tarfile.calc_chksums(data[:512])
    except (tarfile.HeaderError, ValueError):
        return False


def _archive_kind(name: str, data: bytes) -> str | None:
    """'zip', 'tar', 'gzip', 'bzip2', 'xz', 'lzma' (formats the scan opens), 'unsupported:<format>',
    'unreadable' (named like an archive, in no format known here), or None (not an archive)."""
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return "zip"
    if data[:2] == b"\x1f\x8b":
        return "gzip"
    if data[:3] == b"BZh" and data[3:4] in b"123456789" and len(data) > 4:
        return "bzip2"
    if data[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if _is_tar(data):
        return "tar"
    for magic, kind in UNSUPPORTED_ARCHIVES:
        if data.startswith(magic):
            return f"unsupported:{kind}"
    if zipfile.is_zipfile(io.BytesIO(data)):  # a zip behind other bytes (a self-extractor, an image)
        return "zip"
    suffix = PurePosixPath(name).suffix.lower()
    if suffix == ".lzma":
        return "lzma"
    return "unreadable" if suffix in ARCHIVE_SUFFIXES else None


def _zip_members(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        # every byte between the first member and the directory must belong to a listed member: data
        # that the directory does not list (a hidden member) is refused, not skipped
        spans = []
        for info in infos:
            start = info.header_offset  # zipfile counts it from the start of `data`, as start_dir
            head = data[start:start + 30]
            if len(head) < 30 or head[:4] != b"PK\x03\x04":
                raise _Unscannable(f"its member {info.filename} has no local header where the directory says: "
                                   "a damaged zip; fix or remove it")
            name_len, extra_len = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
            end = start + 30 + name_len + extra_len + info.compress_size
            spans.append((start, end + (24 if info.flag_bits & 0x8 else 0)))
        directory = zf.start_dir
        first_header = data.find(b"PK\x03\x04")  # bytes before the zip (a self-extractor, an image) are no member
        covered = min((s for s, _ in spans), default=directory)
        if 0 <= first_header < covered:
            covered = first_header
        for s, e in sorted(spans):
            if s > covered:
                break
            covered = max(covered, e)
        if covered < directory:
            raise _Unscannable(f"holds {directory - covered:,} bytes its directory does not list (a hidden or "
                               "damaged member): refused, not scanned; rebuild the zip, or remove it")
        for info in infos:
            if info.is_dir():
                continue
            budget.member()
            if info.flag_bits & 0x1:
                raise _Unscannable(f"its member {info.filename} is encrypted: the scan cannot read it; "
                                   "ship it unencrypted, or remove it")
            with zf.open(info) as f:
                yield info.filename, budget.read(f)


def _tar_members(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for member in tf:
            if member.isreg():
                budget.member()
                f = tf.extractfile(member)
                yield member.name, budget.read(f)
        end = tf.offset
    if data[end:].strip(b"\0"):  # tarfile stops quietly at a header it cannot read
        raise _Unscannable(f"holds {len(data) - end:,} bytes after the last member tar can read (a damaged or "
                           "concatenated tar): refused, not scanned; rebuild it, or remove it")


def _stream_member(kind: str, name: str, data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    opener = {"gzip": lambda f: gzip.GzipFile(fileobj=f), "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile,
              "lzma": lzma.LZMAFile}[kind]
    suffix = PurePosixPath(name).suffix
    inner = name[:-len(suffix)] + _STREAM_SUFFIXES[suffix.lower()] if suffix.lower() in _STREAM_SUFFIXES \
        else f"{name}.unpacked"
    budget.member()
    with opener(io.BytesIO(data)) as f:
        yield inner, budget.read(f)


def _members(kind: str, name: str, data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    if kind.startswith("unsupported:"):
        raise _Unscannable(f"a {kind.split(':', 1)[1]} archive, which the scan cannot open: ship its files "
                           "unpacked (or as zip or tar), or remove it")
    if kind == "unreadable":
        raise _Unscannable(f"named like an archive ({PurePosixPath(name).suffix}) but no reader here opens it "
                           "(zip, tar, gzip, bzip2, xz): fix or remove it")
    if kind == "zip":
        return _zip_members(data, budget)
    if kind == "tar":
        return _tar_members(data, budget)
    return _stream_member(kind, name, data, budget)


def _expand(where: str, inner: str, data: bytes, depth: int, budget: _Budget,
            problems: list[str]) -> Iterator[tuple[str, str, bytes]]:
    """(where, inner, data) itself, then every member if it is an archive (where: 'a/b.zip::c/d.py';
    inner: the path inside its innermost archive, or in the scanned folder)."""
    yield where, inner, data
    kind = _archive_kind(inner, data)
    if kind is None:
        return
    try:
        if depth >= ARCHIVE_DEPTH:
            raise _Unscannable(f"archives nested more than {ARCHIVE_DEPTH} deep: refused, not scanned; "
                               "unpack them, or remove it")
        for name, member in _members(kind, inner, data, budget):
            yield from _expand(f"{where}::{name}", name, member, depth + 1, budget, problems)
    except _Unscannable as e:
        problems.append(f"{where}: {e}")
    except Exception as e:  # noqa: BLE001 -- whatever a reader raises (BadZipFile, TarError, EOFError, ...): refused
        problems.append(f"{where}: cannot be read as a {kind} archive ({type(e).__name__}: {e}): "
                        "refused, not scanned; fix or remove it")


def _read_regular(path: Path) -> bytes:
    """The bytes of `path`, refused unless it is a regular file (not a symlink, pipe, socket or device)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _Unscannable("a symlink: the scan does not follow links (a release holds regular files only); "
                           "replace it with the file, or remove it")
    if not stat.S_ISREG(st.st_mode):
        raise _Unscannable("not a regular file (a pipe, socket or device): it cannot be scanned; remove it")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _Unscannable("not a regular file: it cannot be scanned; remove it")
        return f.read()


def _folder_files(folder: Path, problems: list[str], skip: frozenset[str] | set[str] = frozenset(),
                  gits: list[str] | None = None) -> Iterator[tuple[str, bytes]]:
    """(path relative to `folder`, bytes) of every file under `folder` but inside `.git` folders
    (their paths relative to `folder` are appended to `gits`) and those in `skip`; what cannot be
    listed or read is added to `problems`."""
    def unlisted(e: OSError) -> None:
        where = Path(e.filename).relative_to(folder).as_posix() if e.filename else str(folder)
        problems.append(f"{where}/: cannot be listed ({e.strerror}): not scanned; make it readable, then scan again")

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unlisted):
        here = Path(dirpath)
        for d in list(dirnames):
            rel = (here / d).relative_to(folder).as_posix()
            if (here / d).is_symlink():
                dirnames.remove(d)
                problems.append(f"{rel}: a symlink: the scan does not follow links (a release holds regular "
                                "files only); replace it with the folder, or remove it")
            elif d == ".git":
                dirnames.remove(d)
                if gits is not None:
                    gits.append(rel)
        dirnames.sort()
        for name in sorted(filenames):
            rel = (here / name).relative_to(folder).as_posix()
            if rel in skip:
                continue
            try:
                yield rel, _read_regular(here / name)
            except _Unscannable as e:
                problems.append(f"{rel}: {e}")
            except OSError as e:
                problems.append(f"{rel}: cannot be read ({e.strerror}): not scanned; make it readable, then scan again")


def scan_refusal(target: Path) -> str | None:
    """One line ("error: ...") when `target` is no folder or file that can be scanned, else None."""
    target = Path(target)
    try:
        st = target.stat()
    except OSError as e:
        why = "does not exist" if e.errno in (errno.ENOENT, errno.ENOTDIR) else f"cannot be read ({e.strerror})"
        return (f"error: {target} {why}: nothing scanned; give the release folder (make release writes "
                "build/student-release), an archive of it or one file")
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return (f"error: {target} is not a folder or a regular file (a pipe, socket or device): nothing scanned; "
                "give the release folder, an archive of it or one file")
    return None


GIT_BYTES = 512 << 20  # bytes of .git objects read in one scan (blobs, commits, tags)
GIT_TIMEOUT_S = 300


def _git_objects(gitdir: Path, where: str, problems: list[str]) -> Iterator[tuple[str, str, bytes]]:
    """(where, inner, bytes) of every blob, commit and tag reachable in the repository `gitdir` from
    its refs, reflogs and index: what a push of it could publish. What git cannot give is a problem."""
    def refuse(why: str) -> None:
        problems.append(f"{where}/: {why}: the history of this git repository is not scanned; "
                        f"fix that, or move {where} out of the release folder, then run again")

    git = shutil.which("git")
    if git is None:
        refuse("git is not installed")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_NO_REPLACE_OBJECTS="1", GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    base = [git, "-c", "core.fsmonitor=false", "-c", f"safe.directory={gitdir.parent}", f"--git-dir={gitdir}"]

    def git_run(args: list[str], data: bytes = b"") -> bytes | None:
        try:
            r = subprocess.run(base + args, input=data, capture_output=True, env=env, timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            refuse(f"git {args[0]} failed ({_why(e)})")
            return None
        if r.returncode != 0:
            first = (r.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit status {r.returncode}"])[0]
            refuse(f"git cannot read it ({first[:200]})")
            return None
        return r.stdout

    listed = git_run(["rev-list", "--objects", "--all", "--reflog", "--indexed-objects"])
    if listed is None:
        return
    paths: dict[str, str] = {}
    for line in listed.decode("utf-8", "surrogateescape").splitlines():
        sha, _, path = line.partition(" ")
        if sha:
            paths.setdefault(sha, path)
    if not paths:
        return
    checked = git_run(["cat-file", "--batch-check=%(objectname) %(objecttype) %(objectsize)"],
                      "".join(f"{sha}\n" for sha in paths).encode())
    if checked is None:
        return
    wanted, total = [], 0
    for line in checked.decode().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in ("blob", "commit", "tag"):
            wanted.append(fields[0])
            total += int(fields[2])
        elif len(fields) != 3:
            refuse(f"git cat-file answered {line[:100]!r}")
            return
    if total > GIT_BYTES:
        refuse(f"its reachable objects hold {total >> 20} MiB, more than the scan's bound of {GIT_BYTES >> 20} MiB")
        return
    batch = git_run(["cat-file", "--batch"], "".join(f"{sha}\n" for sha in wanted).encode())
    if batch is None:
        return
    pos = 0
    for sha in wanted:
        try:
            end = batch.index(b"\n", pos)
            got, kind, size = batch[pos:end].decode().split()
            data = batch[end + 1:end + 1 + int(size)]
        except ValueError:  # "SHA missing", a short answer
            refuse(f"git cat-file gave no readable answer for the object {sha[:10]}")
            return
        pos = end + 1 + int(size) + 1
        if got != sha or len(data) != int(size):
            refuse("git cat-file gave a truncated answer")
            return
        path = paths[sha]
        if kind == "blob" and path:
            yield f"{where}::{path} (blob {sha[:10]})", path, data
        else:
            yield f"{where}::{kind} {sha[:10]}", f"{kind}-{sha[:10]}", data


def _scanned_files(target: Path, problems: list[str], kept: Path | None = None, replaced: Iterable[str] = (),
                   counts: dict[str, int] | None = None) -> Iterator[tuple[str, str, bytes]]:
    """(where, inner, bytes) of every file of `target` (a folder, or one file) and of every member of
    the archives among them, then of the files of `kept` (a folder whose files but `replaced` stay
    beside the target's, named relative to it), then of every object of the `.git` histories found
    in both; whatever cannot be read is added to `problems`."""
    budget = _Budget()
    refusal = scan_refusal(target)
    if refusal:
        problems.append(refusal.removeprefix("error: "))
        return
    if not target.is_dir():
        try:
            data = _read_regular(target.resolve())
        except (_Unscannable, OSError) as e:
            problems.append(f"{target}: {e.strerror if isinstance(e, OSError) else e}: not scanned")
            return
        yield from _expand(str(target), target.name, data, 0, budget, problems)
        return
    gits: list[tuple[Path, str]] = []
    for folder, skip in ((target, frozenset()), (kept, frozenset(replaced))):
        if folder is None or not folder.is_dir():
            continue
        found: list[str] = []
        for rel, data in _folder_files(folder, problems, skip, found):
            yield from _expand(rel, rel, data, 0, budget, problems)
        gits += [(folder / rel, rel) for rel in found]
    for gitdir, where in gits:
        for obj in _git_objects(gitdir, where, problems):
            if counts is not None:
                counts["git objects"] = counts.get("git objects", 0) + 1
            yield from _expand(*obj, 0, budget, problems)


def _json_strings(doc: object) -> Iterator[str]:
    """The strings of a JSON document (a list of strings joined, as a notebook cell's source lines)."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, list) and doc and all(isinstance(x, str) for x in doc):
        yield "".join(doc)
    elif isinstance(doc, list):
        for x in doc:
            yield from _json_strings(x)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from _json_strings(v)


def _texts(data: bytes) -> list[str]:
    """The ways to read `data` as text for the scan: UTF-8 (else Latin-1, which maps every byte, so a
    binary file is read as its bytes), UTF-16/32 when it starts with their byte order mark, and the
    strings of a JSON document (a notebook's cells: escapes undone)."""
    texts = []
    for bom, codec in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                       (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            texts.append(data.decode(codec, errors="replace"))
            break
    try:
        texts.append(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        texts.append(data.decode("latin-1"))
    for text in list(texts):
        if text.lstrip()[:1] in ("{", "["):
            try:
                texts.append("\n".join(_json_strings(json.loads(text))))
            except (ValueError, RecursionError):
                pass
    return texts


def _contains(data: bytes, texts: list[str], s: str) -> bool:
    """`s` in one of the texts, or in the bytes as UTF-16 without a byte order mark."""
    return any(s in t for t in texts) or s.encode("utf-16-le") in data or s.encode("utf-16-be") in data


def scan_report(target: Path, extra_canaries: Iterable[str] = (), kept: Path | None = None,
                replaced: Iterable[str] = ()) -> tuple[list[str], dict[str, int]]:
    """(problems, counts) of a scan of `target`: a release folder, an archive, or one file (problems
    empty = clean; counts: 'files' read from the folder or the file given, 'members' of archives and
    of `.git` histories, 'git objects'). `kept`: a folder whose files (but those in `replaced`)
    will sit beside the target's, scanned as part of it (build: the --out a staged release moves into)."""
    target = Path(target)
    problems: list[str] = []
    tokens = sorted(set(canaries()) | set(extra_canaries))
    hidden_prints = hidden_fingerprints()
    hidden_names = ({f.name for f in HIDDEN_DIR.rglob("*.py") if f.name != "__init__.py"}
                    if HIDDEN_DIR.is_dir() else set())
    prints = solution_fingerprints()
    counts = {"files": 0, "members": 0, "git objects": 0}
    flagged_folders: set[str] = set()
    for where, inner, data in _scanned_files(target, problems, kept, replaced, counts):
        counts["members" if "::" in where else "files"] += 1
        parts = PurePosixPath(inner).parts
        if "hidden_tests" in parts[:-1] or (parts and parts[-1] in hidden_names):
            problems.append(f"{where}: a hidden-test file")
        if "solutions" in parts[:-1]:
            problems.append(f"{where}: a solutions file")
        if "::" in where and len(parts) > 1 and parts[0] in INSTRUCTOR:
            folder = f"{where.rsplit('::', 1)[0]}::{parts[0]}/"
            if folder not in flagged_folders:
                flagged_folders.add(folder)
                problems.append(f"{folder}: an instructor-only folder is present")
        texts = _texts(data)
        for t in tokens:
            if _contains(data, texts, t):
                problems.append(f"{where}: contains the canary {t}")
        if _contains(data, texts, "BEGIN SOLUTION") or _contains(data, texts, "END SOLUTION"):
            problems.append(f"{where}: contains a solution marker")
        for where_from in sorted(set().union(*(_copied_regions(t, prints) for t in texts))):
            problems.append(f"{where}: contains code copied from the solution region at {where_from}")
        copied_hidden = set().union(*({hidden_prints[k] for k in _copied_keys(t, hidden_prints)} for t in texts))
        for where_from in sorted(copied_hidden):
            problems.append(f"{where}: contains code copied from the hidden test {where_from}")
        if inner.endswith(".py"):
            problems += _imports_in(where, data)
    for top in (target, kept) if target.is_dir() else ():
        for folder in INSTRUCTOR if top is not None else ():
            if (top / folder).exists() or (top / folder).is_symlink():
                problems.append(f"{folder}/: an instructor-only folder is present")
    if not problems and not counts["files"]:
        problems.append(f"{target}: holds no file to scan: give the release folder, an archive of it or one file")
    return list(dict.fromkeys(problems)), counts


def scan(release: Path, extra_canaries: Iterable[str] = (), kept: Path | None = None,
         replaced: Iterable[str] = ()) -> list[str]:
    """Problems found in a release (a folder, an archive or one file; empty list = clean). Fails
    closed: what cannot be read or opened is a problem too."""
    return scan_report(release, extra_canaries, kept, replaced)[0]


SIZE_GROUPS = (("student code", ("starter",)), ("engine", ("autograder/engine",)),
               ("checks (autograder/ without engine/)", ("autograder",)), ("course", ("course",)),
               ("programs", ("code",)), ("docs", ("docs",)), ("top-level files", (".",)))


def sizes(release: Path) -> list[tuple[str, int, int, int]]:
    """(group, files, text lines, bytes) of a release, each file counted in the first group that holds
    it; lines are counted in the files that are UTF-8 text (a binary file counts its bytes only)."""
    release, seen, out = Path(release), set(), []
    for name, folders in SIZE_GROUPS:
        files = [f for d in folders for f in sorted((release / d).rglob("*"))
                 if f.is_file() and f not in seen and ".git" not in f.relative_to(release).parts]
        seen.update(files)
        lines = size = 0
        for f in files:
            data = f.read_bytes()
            size += len(data)
            try:
                lines += len(data.decode("utf-8").splitlines()) if b"\0" not in data else 0
            except UnicodeDecodeError:
                pass
        out.append((name, len(files), lines, size))
    return out


def _say(text: str, stream=None) -> None:
    """Print `text`, whatever the path characters in it (a non-UTF-8 --out prints escaped)."""
    stream = stream or sys.stdout
    enc = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(enc, "backslashreplace").decode(enc, "replace"), file=stream)


def _git_said(objects: int) -> str:
    return (f".git history: {objects} objects scanned" if objects else
            "no .git history to scan")


def main(argv: list[str] | None = None) -> int:
    from autograder.grade import Parser  # the kit's one-line argparse errors

    ap = Parser(prog="python -m instructor.release", description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--out", type=Path, default=ROOT / "build" / "student-release")
    what.add_argument("--scan", type=Path, default=None,
                      help="only scan this release: a folder, an archive (zip, tar, tar.gz, gz, ...) or one file")
    a = ap.parse_args(argv)
    try:
        if a.scan is not None:
            refusal = scan_refusal(a.scan)
            if refusal:
                _say(refusal, sys.stderr)
                return 2
            problems, counts = scan_report(a.scan)
            if problems:
                _say("\n".join(problems))
                _say(f"error: {a.scan}: {len(problems)} problem(s) above (leaks, or files the scan cannot read): "
                     "fix each, then scan again", sys.stderr)
                return 1
            _say(f"{a.scan}: clean ({counts['files']} files and {counts['members']} archive members scanned; "
                 f"{len(canaries())} canaries, {len(solution_regions())} solution regions checked); "
                 f"{_git_said(counts['git objects'])}")
            return 0
        info = build(a.out)
        table = sizes(Path(info["out"]))
    except OSError as e:  # build() turns those it expects into one line; this is the backstop
        where = f" ({e.filename})" if e.filename else ""
        _say(f"error: {e.strerror or e}{where}: nothing more was done; check the path and that it is "
             "writable, then run again", sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 -- never a traceback, never a pass
        _say(f"error: {type(e).__name__}: {e}; nothing was passed: check the paths given, then run again "
             "(if it persists, it is a bug of instructor/release.py)", sys.stderr)
        return 1
    _say(f"release written to {info['out']}: {len(info['files'])} files, programs {', '.join(info['programs'])} "
         f"(scanned: clean); {_git_said(info['git_objects'])}")
    for name, n, lines, size in table:
        _say(f"  {name:38s} {n:4d} files {lines:7,d} lines {size:11,d} bytes")
    return 0


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the output's reader went away (`| head`): no traceback, a non-zero exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    sys.exit(status)
