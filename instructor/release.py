"""Write the student repository: starter, public tests, engine, course package, handout, Makefile.

    python -m instructor.release --out DIR        # then: cd DIR && make grade
    python -m instructor.release --scan DIR       # only scan an existing release for leaks

Left out: solutions/, instructor/hidden_tests/, the mutation catalogue, the red-team corpus, the
engine's instructor documentation (autograder/README.md), the instructor tools (batch, Gradescope,
nbgrader, this file) and the project's own tests. The lecture
programs are included only when they do not import `solutions` (the others need the reference
solutions to run; students run the same code through `make grade`).

Every release is scanned before this command succeeds (`scan`): no canary string (listed in
instructor/canaries.txt, plus any `CANARY-...` token found in solutions/ or the hidden tests), no
hidden-test file, no solution marker, and no run of 4 consecutive code lines of a solution region
or of a hidden test (runs that the course package or the shipped tests contain are public anyway).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parent.parent
CANARIES = ROOT / "autograder" / "canaries.txt"
CANARY_TOKEN = re.compile(r"CANARY-[A-Z]+-[0-9A-Za-z]{6,}")
SOLUTION_RUN = 4  # consecutive code lines of a solution region that count as a copy of it
SKIP = {"__pycache__", ".pytest_cache", ".hypothesis"}
STAMP = ".release-stamp"  # marks a folder this command wrote, so that a rebuild may replace it

# (source, destination) relative paths; folders are copied recursively.
CONTENTS = [
    ("starter", "starter"),
    ("course", "course"),
    ("docs/handout", "docs/handout"),
    ("docs/gpusim_guide.md", "docs/gpusim_guide.md"),
    ("requirements.txt", "requirements.txt"),
    ("requirements.lock", "requirements.lock"),
    ("autograder/__init__.py", "autograder/__init__.py"),
    ("autograder/rubric.toml", "autograder/rubric.toml"),
    ("autograder/grade.py", "autograder/grade.py"),
    ("autograder/engine", "autograder/engine"),
    ("autograder/scenarios", "autograder/scenarios"),
    ("autograder/tests", "autograder/tests"),  # the checks with their public cases
]
HIDDEN_DIR = ROOT / "instructor" / "hidden_tests"

MAKEFILE = """\
# FlashAttention assignment. Implement the six files in starter/ (see docs/handout/README.md),
# then `make grade` (all parts) or `make grade PART=2`. `make grade IMPL=dir` grades another folder.
# With your own Python environment: make grade PY=/path/to/python (no virtualenv is made).

PYTHON ?= python3.11
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)
export PYTHONHASHSEED := 0

IMPL ?= starter
PART ?=

ifeq ($(PY),$(VENV)/bin/python)
DEPS := $(STAMP)
endif

.PHONY: help venv grade{demos_phony}

help:
\t@echo "make grade [PART=1..6] [IMPL=starter]   grade your implementation (public tests)"{demos_help}

venv: $(STAMP)

$(STAMP): requirements.txt requirements.lock
\t@command -v $(PYTHON) >/dev/null || {{ echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 1; }}
\ttest -x $(PY) || $(PYTHON) -m venv $(VENV)
\t$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c requirements.lock
\ttouch $(STAMP)

grade: $(DEPS)
\t$(PY) -m autograder.grade --impl $(IMPL) $(if $(PART),--part $(PART))
{demos_rule}"""

README = """\
# FlashAttention from the ground up — assignment

Implement the six files in `starter/`; the handout (`docs/handout/README.md`) states what each
part asks, with shapes and conventions, and links one page per part. Then run

    make grade            # all parts, public tests
    make grade PART=2     # one part

`make grade` prints a table (part, tests passed, points), then the first failure of each part with
what was checked, the inputs' shapes, the largest error and where it occurs, and a hint. It also
writes the same content to grade-report.json. Your final grade uses these public tests and hidden
tests of the same kind (more shapes, seeds and edge cases).

The grader runs your code in a separate process and checks results there, so printing, exiting or
patching things inside your code cannot change a grade; it only costs you the test.
{programs}"""


def _copy(src: Path, dst: Path) -> list[Path]:
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return [dst]
    out = []
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or SKIP & set(rel.parts) or f.suffix in (".pyc", ".pyo"):
            continue
        out += _copy(f, dst / rel)
    return out


def _imports_solutions(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except SyntaxError:
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "solutions" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "solutions":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"solutions(\.\w+)*", node.value):
            return True  # importlib.import_module("solutions.x")
    return False


def build(out: Path) -> dict:
    """Write the release into `out` (must be empty or absent) and scan it. Returns what was done."""
    out = Path(out).resolve()
    if out == ROOT or ROOT.is_relative_to(out):
        raise SystemExit(f"error: refusing to write the release over the repository ({out})")
    if out.exists() and (out / STAMP).is_file():
        shutil.rmtree(out)  # a previous release written by this command: replace it
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty (and not a previous release); remove it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    missing = []
    for src, dst in CONTENTS:
        if (ROOT / src).exists():
            _copy(ROOT / src, out / dst)
        else:
            missing.append(src)
    included, left_out = [], []
    programs = ROOT / "code" / "lecture05"
    for p in sorted(programs.glob("*.py")) if programs.is_dir() else []:
        if _imports_solutions(p):
            left_out.append(p.name)
        else:
            _copy(p, out / "code" / "lecture05" / p.name)
            included.append(p.name)
    demos = bool(included)
    (out / "Makefile").write_text(MAKEFILE.format(
        demos_phony=" demos" if demos else "",
        demos_help='\n\t@echo "make demos                              run the lecture programs in code/lecture05"' if demos else "",
        demos_rule=("\ndemos: $(DEPS)\n\t@for p in code/lecture05/0*.py; do echo; echo \"=== $$p ===\"; $(PY) $$p || exit 1; done\n"
                    if demos else "")))
    prog_text = ""
    if included:
        prog_text = ("\nThe lecture programs in `code/lecture05/` (" + ", ".join(included) + ") run with `make demos`.")
    if left_out:
        prog_text += ("\nThe lecture programs " + ", ".join(left_out) + " are not included: they run the reference "
                      "solutions.")
    (out / "README.md").write_text(README.format(programs=prog_text))
    (out / STAMP).write_text("written by python -m instructor.release; `make release` replaces this folder\n")
    (out / ".gitignore").write_text(".venv/\n__pycache__/\n*.pyc\n.pytest_cache/\n.hypothesis/\n/grade-report.json\nbuild/\n.release-stamp\n")
    problems = scan(out)
    if problems:
        raise SystemExit("error: the release leaks instructor material:\n  " + "\n  ".join(problems[:20]))
    return {"out": str(out), "programs_included": included, "programs_left_out": left_out, "missing": missing}


# ---------------------------------------------------------------------------------------------
# the leak scan


def canaries() -> list[str]:
    """Canary strings: instructor/canaries.txt (one per line, # comments) plus CANARY-... tokens
    planted in solutions/ and the hidden tests."""
    found: set[str] = set()
    if CANARIES.is_file():
        for line in CANARIES.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                found.add(line)
    for folder in (ROOT / "solutions", HIDDEN_DIR):
        for f in folder.rglob("*.py") if folder.is_dir() else []:
            found.update(CANARY_TOKEN.findall(f.read_text(encoding="utf-8", errors="replace")))
    return sorted(found)


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


def _text_files(folder: Path) -> Iterable[tuple[Path, str]]:
    for f in sorted(folder.rglob("*")):
        if f.is_file() and not f.is_symlink():
            try:
                yield f, f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                yield f, f.read_bytes().decode("latin-1")


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


def scan(release: Path, extra_canaries: Iterable[str] = ()) -> list[str]:
    """Problems found in a release folder (empty list = clean)."""
    release = Path(release)
    problems = []
    tokens = sorted(set(canaries()) | set(extra_canaries))
    hidden_prints = hidden_fingerprints()
    hidden_names = ({f.name for f in HIDDEN_DIR.rglob("*.py") if f.name != "__init__.py"}
                    if HIDDEN_DIR.is_dir() else set())
    prints = solution_fingerprints()
    for f, text in _text_files(release):
        rel = f.relative_to(release).as_posix()
        if "hidden_tests" in rel or f.name in hidden_names:
            problems.append(f"{rel}: a hidden-test file")
        if rel.startswith("solutions/"):
            problems.append(f"{rel}: a solutions file")
        for t in tokens:
            if t in text:
                problems.append(f"{rel}: contains the canary {t}")
        if "BEGIN SOLUTION" in text or "END SOLUTION" in text:
            problems.append(f"{rel}: contains a solution marker")
        for where in sorted(_copied_regions(text, prints)):
            problems.append(f"{rel}: contains code copied from the solution region at {where}")
        for where in sorted({hidden_prints[k] for k in _copied_keys(text, hidden_prints)}):
            problems.append(f"{rel}: contains code copied from the hidden test {where}")
    if (release / "instructor").exists():
        problems.append("instructor/: the instructor-only folder is present")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m instructor.release", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "student-release")
    ap.add_argument("--scan", type=Path, default=None, help="only scan this existing release folder")
    a = ap.parse_args(argv)
    if a.scan:
        problems = scan(a.scan)
        print("\n".join(problems) or f"{a.scan}: clean ({len(canaries())} canaries, "
                                      f"{len(solution_regions())} solution regions checked)")
        return 1 if problems else 0
    info = build(a.out)
    print(f"release written to {info['out']} (scanned: clean)")
    if info["programs_left_out"]:
        print("left out (they run the solutions): " + ", ".join(info["programs_left_out"]))
    if info["missing"]:
        print("not in the repository yet: " + ", ".join(info["missing"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
