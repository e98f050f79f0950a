"""Generate the nbgrader source notebook from the single source: solutions/*.py and the rubric.

    python -m instructor.make_notebook            # writes instructor/nbgrader_course/source/flashattention/flashattention.ipynb
    python -m instructor.make_notebook --check    # exit 1 if that file is not what the generator makes

The notebook has, per part: a markdown cell (the part's handout page), one solution cell per graded
file holding that file verbatim (its `### BEGIN/END SOLUTION` regions are what `nbgrader
generate_assignment` clears) behind a `%%writefile submission/<file>` line, and one locked,
autograded test cell whose points are the rubric's. What is graded is what running the notebook
top to bottom writes into submission/ (instructor.nbgrader_channel.extract: every `%%writefile`
cell in order, `-a` appends included; the intro says so). Points are NOT decided in the notebook's
kernel: `nbgrader autograde` is configured (instructor/nbgrader_course/nbgrader_config.py) to replace kernel
execution with instructor.nbgrader_channel.EngineGrade, which grades the code of the solution
cells with the same engine as `make grade` and writes each part's points into its test cell.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.engine import load_rubric

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "flashattention"
NOTEBOOK = ROOT / "instructor" / "nbgrader_course" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
PACKAGE = "submission"  # the folder the code cells write into (a package: relative imports work)


def file_grade_id(filename: str) -> str:
    """grade_id of the solution cell that holds `filename` (extraction maps it back)."""
    return "file_" + filename.removesuffix(".py")


def part_grade_id(number: int) -> str:
    return f"part{number}_tests"


def _meta(grade_id: str, *, solution: bool = False, grade: bool = False, locked: bool = False,
          points: float | None = None) -> dict:
    nb = {"grade_id": grade_id, "grade": grade, "solution": solution, "locked": locked, "schema_version": 3}
    if grade:
        nb["points"] = points
    return {"nbgrader": nb}


def _handout_page(number: int) -> str | None:
    pages = sorted((ROOT / "docs" / "handout").glob(f"part{number}_*.md"))
    return pages[0].read_text(encoding="utf-8") if pages else None


def build_notebook() -> nbformat.NotebookNode:
    rubric = load_rubric()
    cells = []
    table = "\n".join(f"| {p.number} | {p.name} | {', '.join(f'`{f}`' for f in p.files)} | {p.points:g} |"
                      for p in rubric.parts)
    intro = (
        "# FlashAttention from the ground up\n\n"
        "> **Instructors: grade this notebook only with the course kit's `nbgrader_config.py`**\n"
        "> (`instructor/nbgrader_course/`, the repository on `PYTHONPATH`). It grades the code with the course's\n"
        "> engine and no notebook kernel. Any other configuration runs the notebook in a kernel, which the\n"
        "> notebook's own code controls: the points it gives mean nothing.\n\n"
        "Write your code where a cell says `# YOUR CODE HERE` (replace the `raise NotImplementedError`).\n"
        f"Each code cell writes one file into the package `{PACKAGE}/` when you run it, so later parts can\n"
        f"import earlier ones (`from .flash_forward import flash_forward`) and you can try them:\n"
        f"`from {PACKAGE}.online_softmax import online_softmax`.\n\n"
        "Run the set-up cell first. Keep the first line (`%%writefile ...`) of every code cell.\n\n"
        f"**What is graded** is what running this notebook from top to bottom writes into `{PACKAGE}/`:\n"
        f"every code cell that starts with `%%writefile {PACKAGE}/<file>` replaces that file, and\n"
        f"`%%writefile -a {PACKAGE}/<file>` appends to it, in cell order, whichever cell it is (a cell you\n"
        "added too). Only `%%writefile` cells count: a file written another way (`open()`, `!cp`) is not\n"
        f"graded. A `%%writefile` whose file cannot be told (a name built from variables) or that names a\n"
        f"graded file by another path than `{PACKAGE}/<file>` gets that file refused, naming the cell.\n\n"
        "| part | what | file | points |\n|---|---|---|---|\n" + table + "\n\n"
        "**Grading.** Each part ends with a locked cell worth the part's points. They are set by the\n"
        "course's grading engine with public and hidden tests (the same engine as `make grade`), from\n"
        "the code in your cells, not by running this notebook: print statements or state left in\n"
        "the kernel do not count."
    )
    cells.append(new_markdown_cell(intro, metadata=_meta("intro", locked=True)))
    setup = (f"# Set-up: the code cells below write your files into the package {PACKAGE}/\n"
             "import os\n\n"
             f"os.makedirs({PACKAGE!r}, exist_ok=True)\n"
             f"open(os.path.join({PACKAGE!r}, '__init__.py'), 'a').close()")
    cells.append(new_code_cell(setup, metadata=_meta("setup", locked=True)))
    for part in rubric.parts:
        page = _handout_page(part.number)
        head = f"## Part {part.number}: {part.name} ({part.points:g} points)\n\n"
        head += page.split("\n", 1)[1].strip() if page and page.startswith("#") else (page or "")
        cells.append(new_markdown_cell(head.strip(), metadata=_meta(f"part{part.number}_text", locked=True)))
        for f in part.files:
            text = (ROOT / "solutions" / f).read_text(encoding="utf-8").rstrip("\n")
            cells.append(new_code_cell(f"%%writefile {PACKAGE}/{f}\n{text}\n",
                                       metadata=_meta(file_grade_id(f), solution=True)))
        test = (
            f"# Part {part.number} ({part.points:g} points) is graded by the course's grading engine with public and\n"
            f"# hidden tests: `nbgrader autograde` sets this cell's points from the engine's report for\n"
            f"# part {part.number}; what this cell prints while you work does not count.\n"
            "# Run the public tests on your files now (needs the course repository on the path):\n"
            "import importlib.util, subprocess, sys\n\n"
            "if importlib.util.find_spec('autograder') is None:\n"
            "    print('the public tests need the course repository: start Jupyter in its folder')\n"
            "else:\n"
            f"    r = subprocess.run([sys.executable, '-m', 'autograder.grade', '--impl', {PACKAGE!r},\n"
            f"                        '--part', '{part.number}'], capture_output=True, text=True)\n"
            "    print(r.stdout[-8000:] + r.stderr[-2000:])\n"
            "# Graded only by the course engine: the kit's nbgrader_config.py starts no kernel and stores only the\n"
            "# engine's points. This line is no defence on its own (a kernel run can be made to skip it).\n"
            f"raise AssertionError('part {part.number} is graded by the course engine (nbgrader autograde with the kit\\'s '\n"
            "                     'nbgrader_config.py), not by running this cell')"
        )
        cells.append(new_code_cell(test, metadata=_meta(part_grade_id(part.number), grade=True, locked=True,
                                                        points=float(part.points))))
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating gives the same bytes
        cell["id"] = cell.metadata["nbgrader"]["grade_id"].replace("_", "-")[:64] or f"cell-{i}"
    return nb


def render() -> str:
    return nbformat.writes(build_notebook(), version=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m instructor.make_notebook", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed notebook is out of date")
    ap.add_argument("--out", type=Path, default=NOTEBOOK)
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        current = a.out.read_text(encoding="utf-8") if a.out.is_file() else ""
        if current != text:
            print(f"{a.out} is out of date; run `python -m instructor.make_notebook`", file=sys.stderr)
            return 1
        print(f"{a.out} is up to date")
        return 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text, encoding="utf-8")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
