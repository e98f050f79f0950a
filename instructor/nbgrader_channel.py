"""nbgrader channel: submitted notebooks are graded by the SAME engine as `make grade`.

Design (the engine, not the notebook kernel, decides the points):
- The source notebook (instructor/make_notebook.py) has one solution cell per graded file and one
  locked autograded test cell per part, worth the rubric's points.
- instructor/nbgrader_course/nbgrader_config.py replaces nbgrader's `Execute` preprocessor in
  `Autograde.autograde_preprocessors` with `EngineGrade` below. So `nbgrader autograde` runs its
  usual pipeline (sanitize: clear outputs, restore locked cells from the source, check metadata;
  then grade, limit output, save grades to the gradebook, late penalties), except that nothing of
  the student's runs in a kernel on the instructor's machine. EngineGrade writes the graded .py
  files as running the notebook top to bottom would write them (`extract`: every `%%writefile`
  cell in order, `-a` appends included, or a refusal naming the cell), grades them with
  autograder.engine.grade (public + hidden tests, workers in the sandbox of instructor/sandbox.py)
  and writes into each part's test cell the engine's feedback for that part plus an
  execute_result holding the points. nbgrader's SaveAutoGrades reads that number as the cell's
  partial credit, so the gradebook, `nbgrader export` and `nbgrader generate_feedback` all show
  the engine's points and messages.
- Fail closed: EngineGrade first replaces every test cell's outputs with an error (0 points) and
  only the engine's result replaces that. A kernel run is NOT a defence (a student's cell can
  rewrite the later cells before they run, e.g. with get_ipython().input_transformers_cleanup), so
  the defence is outside the kernel, in nbgrader_config.py, and holds whatever preprocessor list
  is given on the command line: no kernel can start (NO_KERNEL), and `guard_save_autogrades`
  makes nbgrader's SaveAutoGrades store, for each autograded cell, the points EngineGrade gave it
  in this process, and 0 for any cell it did not grade. A config or engine import error stops
  nbgrader with a non-zero exit (nbgrader_config.py); a sandbox that is not available stops the
  run unless c.EngineGrade.allow_weak_sandbox = True; so do options with which the reference
  solutions do not score full marks (checked once per run, before the first notebook; that grade
  also scales the call time limits, as in the batch). A refused run first turns the gradebook's
  earlier autograded scores of the notebook at hand into 'not graded': an old grade never stands
  in for a re-grade that did not happen. A course that grades the notebook with a
  config of its own runs none of this: the notebook says so on top.

    python -m instructor.nbgrader_channel extract NOTEBOOK --out DIR   # the .py files of a notebook
"""
from __future__ import annotations

import copy
import hashlib
import posixpath
import re
import shlex
import sys
import textwrap
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_output
from traitlets import Bool, Dict, List, Unicode

# Imported here, not lazily: an engine that cannot be imported must stop nbgrader when it loads
# nbgrader_config.py (which imports this module), before any notebook is touched.
from autograder.engine import load_rubric, sanitize

from . import intake
from .grading import Options, grade_one
from .make_notebook import PACKAGE, file_grade_id, part_grade_id
from .sandbox import SandboxError, require

try:  # nbgrader is only needed for the preprocessor (extract works without it)
    from nbgrader.preprocessors import NbGraderPreprocessor
except ImportError:  # pragma: no cover
    NbGraderPreprocessor = object  # type: ignore[assignment,misc]


WRITEFILE = "%%writefile"
NO_FILE = "no cell of the notebook writes"  # the start of the problem of a file no cell writes ("missing")


def _nbgrader_meta(cell: Any) -> dict:
    """A cell's nbgrader metadata, or {} where the notebook holds something else there (a student can
    edit a notebook's JSON: a cell, its metadata or its nbgrader entry may be any value)."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    found = meta.get("nbgrader") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def _source(cell: Any) -> str:
    """A code cell's text: nbformat's str, or its list of lines; anything else holds no code."""
    source = cell.get("source") if isinstance(cell, dict) else None
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return "".join(source)
    return source if isinstance(source, str) else ""


def _cells(nb: Any) -> list:
    """The notebook's cells, or ValueError (one line) when it is not a notebook."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError("not a Jupyter notebook (no list of cells); give the .ipynb file a student submitted")
    return cells


def _cell_name(number: int, cell: Any) -> str:
    meta = _nbgrader_meta(cell)
    gid = meta.get("grade_id")
    return f"cell {number}" + (f" ({sanitize.line(gid, 60)})" if isinstance(gid, str) and gid else "")


def _writefile(source: str) -> tuple[str, str] | None:
    """(the magic's argument line, the cell body it writes) when the cell is a %%writefile cell, else
    None, as IPython reads a cell (IPython.core.inputtransformer2): a trailing newline added, leading
    blank lines dropped, the common indentation removed, then `%%NAME ARGS` on the first line. One
    difference, kept on purpose: a BOM before the magic (pasted from a Windows editor) is ignored."""
    source = source.removeprefix("\ufeff")
    if not source.endswith("\n"):
        source += "\n"
    lines = source.splitlines(keepends=True)
    while lines and lines[0].isspace():
        lines.pop(0)
    lines = textwrap.dedent("".join(lines)).splitlines(keepends=True)
    if not lines or not lines[0].startswith("%%"):
        return None
    magic, _, args = lines[0][2:].rstrip().partition(" ")
    if magic != WRITEFILE.removeprefix("%%"):
        return None
    return args, "".join(lines[1:])


def _target(args: str) -> tuple[bool, str] | str:
    """(append, filename) as IPython's %%writefile parses `args`, or why it cannot be told here."""
    if "$" in args or "{" in args:
        return "its file name is computed from variables ($ or {...}) when the cell runs"
    if "\\" in args:
        return "its line holds a backslash; write the path with / (submission/<file>)"
    try:
        words = shlex.split(args)
    except ValueError as e:
        return f"its line cannot be read ({e})"
    append = False
    names = []
    for w in words:
        if w == "-a" or (len(w) > 2 and "--append".startswith(w)):
            append = True
        elif w.startswith("-"):
            return f"it has the option {w!r}, which %%writefile does not take (only -a)"
        else:
            names.append(w)
    if len(names) != 1:
        return "it must name exactly one file"
    name = names[0]
    if re.match(r"^('.*')|(\".*\")$", name):  # IPython strips one more pair of quotes
        name = name[1:-1]
    return append, name


def extract(nb: nbformat.NotebookNode, dest: Path, graded: list[str] | None = None) -> dict[str, str]:
    """Write the graded files into `dest` as running the notebook top to bottom (in a fresh folder)
    writes them into the package submission/: every code cell that starts with `%%writefile
    submission/FILE` (in any cell, the solution cell or another) replaces FILE with the cell's body,
    and `%%writefile -a submission/FILE` appends to it, in cell order. Only %%writefile cells count:
    code that writes files in another way (open(), shell commands) is not followed.

    Returns {file: problem} for files that could not be taken; the engine then scores those parts 0.
    The problem names the cell: a %%writefile whose target cannot be told refuses the files it may
    write (a file name computed from variables: every graded file; options %%writefile does not take,
    several names, a backslash: the graded files the line names), and so does one that names a graded
    file by another path than submission/FILE; a file that no cell writes is "missing" (with the cell that should, when its
    solution cell lost its %%writefile line)."""
    graded = graded or intake.all_graded_files()
    by_id = {file_grade_id(f): f for f in graded}
    written: dict[str, str] = {}
    problems: dict[str, str] = {}
    solution_cells: dict[str, str] = {}
    for number, cell in enumerate(_cells(nb), 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = _nbgrader_meta(cell)
        gid = meta.get("grade_id")
        own = by_id.get(gid) if meta.get("solution") and isinstance(gid, str) else None
        if own is not None:
            solution_cells.setdefault(own, _cell_name(number, cell))
        magic = _writefile(_source(cell))
        if magic is None:
            continue
        args, body = magic
        target = _target(args)
        if isinstance(target, str):  # a computed name may be any file; a literal line, the files it names
            computed = "$" in args or "{" in args
            for name in [n for n in graded if computed or n in args]:
                problems.setdefault(name, f"{_cell_name(number, cell)} starts with `%%writefile {sanitize.line(args, 80)}`"
                                          f", whose file cannot be told: {target}; write "
                                          f"`%%writefile submission/<file>` (or -a to append)")
            continue
        append, filename = target
        norm = posixpath.normpath(filename)
        name = norm.removeprefix(f"{PACKAGE}/")
        if norm == f"{PACKAGE}/{name}" and name in graded:
            written[name] = (written.get(name, "") + body) if append else body
        elif posixpath.basename(norm) in graded and posixpath.basename(posixpath.dirname(norm)) in ("", PACKAGE):
            name = posixpath.basename(norm)  # submission/F by another path, or F beside the package
            problems.setdefault(name, f"{_cell_name(number, cell)} writes {sanitize.line(filename, 120)}, not "
                                      f"{PACKAGE}/{name} (the file that is graded); write "
                                      f"`%%writefile {PACKAGE}/{name}` on its first line")
    dest.mkdir(parents=True, exist_ok=True)
    for name in graded:
        if name in problems:
            continue
        if name not in written:
            where = solution_cells.get(name)
            problems[name] = (f"{NO_FILE} {PACKAGE}/{name}" + (
                f": its solution cell, {where}, must start with `%%writefile {PACKAGE}/{name}`" if where else
                f" (add a cell that starts with `%%writefile {PACKAGE}/{name}`)"))
            continue
        try:
            data = written[name].encode("utf-8")
        except UnicodeEncodeError:
            problems[name] = "its cells hold text that cannot be saved as UTF-8 (a lone surrogate); retype it"
            continue
        why = intake.check_source(name, data)
        if why:
            problems[name] = why
            continue
        (dest / name).write_bytes(data)
    dest.chmod(0o755)
    return problems


def part_feedback(part: dict, tests: list[dict], notes: list[str]) -> str:
    """The text shown under a part's test cell: the points, the tests by name (hidden ones named,
    not revealed), and the part's lines of `make grade`'s feedback (the engine's renderer)."""
    from autograder.engine.feedback import part_lines

    lines = [f"Part {part['part']}: {part['points']:g} / {part['max_points']:g} points "
             f"({part['passed']}/{part['total']} tests passed) — graded by the course's engine", *notes]
    if part["total"] == 0 and (part.get("first_failure") or {}).get("message"):
        lines.append(part["first_failure"]["message"])
    lines += [f"  {'passed' if t['outcome'] == 'passed' else 'FAILED':6} {t['id']}" for t in tests]
    details = part_lines(part)
    if details:
        lines += [""] + details
    return "\n".join(lines) + "\n"


# The kernel name nbgrader_config.py gives every notebook client: no such kernel exists, so any
# kernel execution (nbgrader's Execute, nbconvert's ExecutePreprocessor) fails before it starts.
NO_KERNEL = "no-kernel--the-kits-nbgrader_config-grades-with-EngineGrade"

# The points EngineGrade gave each autograded cell in this process, by (assignment, student,
# notebook, grade_id); the SaveAutoGrades guard takes each entry once. Nothing a notebook holds can
# add an entry: it lives in the grading process, not in the notebook.
_ENGINE_POINTS: dict[tuple[str, str, str, str], float] = {}


def _points_key(resources: dict, grade_id: str) -> tuple[str, str, str, str]:
    nb = resources.get("nbgrader", {})
    return (str(nb.get("assignment")), str(nb.get("student")), str(nb.get("notebook")), str(grade_id))


def accept_bom() -> None:
    """Let nbgrader read a notebook saved with a UTF-8 byte-order mark (Windows editors write one), as
    the batch intake reads such .py files: nbformat refuses it as "not JSON", autograde skips the
    student, and `nbgrader export` then lists them with 0 points, the same as a graded 0. Patched from
    nbgrader_config.py (nbgrader reads every notebook through nbformat.reads before any preprocessor)."""
    import nbformat

    if getattr(nbformat.reads, "accepts_bom", False):
        return
    original = nbformat.reads

    def reads(s: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(s, str):
            s = s.removeprefix("\ufeff")
        elif isinstance(s, (bytes, bytearray)):
            s = bytes(s).removeprefix(b"\xef\xbb\xbf")
        return original(s, *args, **kwargs)

    reads.accepts_bom = True  # type: ignore[attr-defined]
    nbformat.reads = reads


def guard_save_autogrades() -> None:
    """Make nbgrader's SaveAutoGrades store the engine's points only: a cell EngineGrade did not
    grade in this process scores 0, whatever its outputs say. Why here, patched from
    nbgrader_config.py: `--Autograde.autograde_preprocessors=[...Execute, ...SaveAutoGrades]` on
    the command line replaces the list the config sets, but the config file still loads, and this
    class is the one that writes autograder scores to the gradebook."""
    from nbgrader.preprocessors import SaveAutoGrades

    if getattr(SaveAutoGrades._add_score, "engine_guard", False):
        return
    original = SaveAutoGrades._add_score

    def _add_score(self: Any, cell: Any, resources: dict) -> None:
        original(self, cell, resources)
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        engine = _ENGINE_POINTS.pop(_points_key(resources, grade_id), None)
        grade = self.gradebook.find_grade(grade_id, self.notebook_id, self.assignment_id, self.student_id)
        if engine is not None and grade.auto_score == engine:
            return
        if grade.auto_score:
            self.log.error("refusing %s points for %s of %s: not the course engine's grade (grade only with the "
                           "kit's nbgrader_config.py, which runs EngineGrade); scored 0",
                           grade.auto_score, grade_id, self.student_id)
        grade.auto_score = 0.0
        grade.needs_manual_grade = grade.manual_score is not None
        self.gradebook.db.commit()

    _add_score.engine_guard = True  # type: ignore[attr-defined]
    SaveAutoGrades._add_score = _add_score


class EngineGrade(NbGraderPreprocessor):
    """nbgrader preprocessor: grade the notebook's code with instructor.grading.grade_one and put
    each part's points and feedback into its autograded test cell (replaces kernel execution).

    Fail closed: every test cell first gets an error output (0 points); only the engine's result
    replaces it, and is recorded in _ENGINE_POINTS, the only points guard_save_autogrades lets
    SaveAutoGrades store. A sandbox that is not available stops the run (checked_options: nbgrader
    exits non-zero) unless `allow_weak_sandbox` is set; so does a configuration with which the
    reference solutions would not score full marks (checked_options)."""

    test_sets = List(["public", "hidden"], help="engine test sets").tag(config=True)
    parts = List([], help="part numbers to grade (default: all in the rubric)").tag(config=True)
    limits = Dict({}, help="engine limit overrides, e.g. {'call_timeout_s': 10}").tag(config=True)
    sandbox = Unicode("auto", help="auto (bubblewrap if it works, else the unprivileged uid), bubblewrap, uid or "
                                   "rlimits (needs allow_weak_sandbox); a mode that is not available refuses to grade"
                      ).tag(config=True)
    allow_weak_sandbox = Bool(False, help="grade even when the workers get resource limits only "
                              "(no file system isolation)").tag(config=True)
    tests_dir = Unicode("", help="another assignment-tests folder (default: autograder/tests)").tag(config=True)

    def preprocess(self, nb: nbformat.NotebookNode, resources: dict) -> tuple[nbformat.NotebookNode, dict]:
        test_cells = {_nbgrader_meta(c)["grade_id"]: c for c in _cells(nb)
                      if isinstance(c, dict) and c.get("cell_type") == "code" and _nbgrader_meta(c).get("grade")
                      and isinstance(_nbgrader_meta(c).get("grade_id"), str)}
        student = resources.get("nbgrader", {}).get("student", "?")
        for grade_id in test_cells:  # nothing recorded before for this notebook counts
            _ENGINE_POINTS.pop(_points_key(resources, grade_id), None)
        for cell in test_cells.values():  # nothing of a kernel run counts: only what the engine writes below
            cell.outputs = [_error("NotGraded", "this cell was not graded by the course's engine")]
            cell.execution_count = None
        try:
            options = checked_options(self)
        except SystemExit:  # a refused run: no grade of an earlier run may stand in for this one
            self._void_stored_grades(resources, list(test_cells))
            raise
        with tempfile.TemporaryDirectory(prefix="nbgrader-engine-") as tmp:
            graded = grade_one(None, Path(tmp), options, name=str(student), take=lambda dest: take_notebook(nb, dest))
        if graded.status == "failed to grade":  # fail closed: 0 points with a reason
            self.log.error("engine grading failed for %s: %s\n%s", student, graded.reason,
                           (graded.failure or {}).get("traceback", ""))
            for cell in test_cells.values():
                cell.outputs = [_error("GradingError", "the grading engine failed on this notebook; the "
                                       "instructor has the details")]
            return nb, resources
        view = graded.view
        notes = view["intake"]["notes"]
        for row in view["parts"]:
            cell = test_cells.get(part_grade_id(row["part"]))
            if cell is None:
                continue
            tests = [t for t in view["tests"] if t["part"] == row["part"]]
            max_points = float(cell.metadata["nbgrader"]["points"])
            points = min(max(float(row["points"]), 0.0), max_points)
            mine = [n for n in notes if any(n.startswith(f) for f in _files_of(row["part"]))]
            cell.outputs = [
                new_output("stream", name="stdout", text=part_feedback(row, tests, mine) + f"sandbox: {view['sandbox']}\n"),
                new_output("execute_result", data={"text/plain": repr(round(points, 4))}, execution_count=None),
            ]
            _ENGINE_POINTS[_points_key(resources, part_grade_id(row["part"]))] = round(points, 4)
        self.log.info("engine grade for %s: %s / %s (%s; sandbox: %s)", student, view["total"], view["max_total"],
                      graded.status, view["sandbox"])
        return nb, resources

    def _void_stored_grades(self, resources: dict, grade_ids: list[str]) -> None:
        """The gradebook's autograded scores of this notebook, from an earlier run, become 'not graded'
        (no score, needs grading): a re-grade that refuses (a sandbox not available, options the
        reference fails with) must not leave the old points standing in `nbgrader export`."""
        info = resources.get("nbgrader") or {}
        if not info.get("db_url"):
            return
        try:
            from nbgrader.api import Gradebook, MissingEntry

            with Gradebook(info["db_url"]) as gb:
                for grade_id in grade_ids:
                    try:
                        grade = gb.find_grade(grade_id, info["notebook"], info["assignment"], info["student"])
                    except MissingEntry:  # graded for the first time: nothing stored
                        continue
                    grade.auto_score = None
                    grade.needs_manual_grade = True
                gb.db.commit()
        except Exception as e:  # noqa: BLE001 -- the refusal itself must still stop the run
            self.log.error("could not clear the earlier grades of %s: %s", info.get("student"),
                           sanitize.line(f"{type(e).__name__}: {e}", 200))

    def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:  # pragma: no cover
        return cell, resources


# The set-up of this nbgrader run, checked once per process and per configuration (checked_options):
# the options to grade with (the call time limits scaled from the reference's own times), or why
# grading is refused.
_SETUP: dict[str, Options | str] = {}


def checked_options(cfg: Any) -> Options:
    """The grading options of EngineGrade `cfg`, checked before the first notebook as the batch checks
    its own (instructor/batch.py): the sandbox must isolate (or allow_weak_sandbox be set), and the
    reference solutions, graded in this process with exactly these options, must score full marks,
    or every student would get 0 for the instructor's mistake (a wrong tests_dir, parts or limits).
    That grade also scales each call's time limit from the reference's own time, so a hanging
    notebook costs seconds per call, not the rubric's 20 s. A refusal stops nbgrader at once (one
    line, exit status 1: SystemExit passes nbgrader's per-notebook error handling), before any
    grade is stored. The check runs once per process and configuration, not once per student."""
    key = repr((cfg.sandbox, bool(cfg.allow_weak_sandbox), list(cfg.parts), list(cfg.test_sets),
                sorted(dict(cfg.limits).items()), cfg.tests_dir))
    if key not in _SETUP:
        _SETUP[key] = _check_setup(cfg)
    found = _SETUP[key]
    if isinstance(found, str):
        raise SystemExit(f"error: {found}")
    return Options(parts=found.parts, test_sets=found.test_sets, limits=copy.deepcopy(found.limits),
                   sandbox=found.sandbox, tests_dir=found.tests_dir)


def _check_setup(cfg: Any) -> Options | str:
    from .batch import check_reference, scaled_call_timeouts

    try:  # the mode asked for, or a refusal: bubblewrap asked for never grades in another mode
        box = require(cfg.sandbox or "auto", bool(cfg.allow_weak_sandbox),
                      to_accept="set c.EngineGrade.allow_weak_sandbox = True")
    except SandboxError as e:  # (the mode asked for by GRADER_SANDBOX, under "auto", is named in e itself)
        asked = f" (c.EngineGrade.sandbox = {sanitize.line(cfg.sandbox, 40)!r})" if (cfg.sandbox or "auto") != "auto" else ""
        return f"sandbox not available{asked}: {e}"
    try:
        options = Options(parts=[int(p) for p in cfg.parts] or None, test_sets=tuple(cfg.test_sets),
                          limits=dict(cfg.limits), sandbox=box, tests_dir=cfg.tests_dir or None)
    except (TypeError, ValueError) as e:
        return f"c.EngineGrade.parts must be part numbers ({sanitize.line(e, 200)})"
    info = scaled_call_timeouts(options)  # grades the reference; sets options.limits["call_timeouts"]
    try:
        check_reference(info.pop("reference"), options)
    except SystemExit as e:
        return str(e).removeprefix("error: ").replace("fix the options", "fix c.EngineGrade's options in "
                                                       "nbgrader_config.py or on the command line")
    return options


def _error(name: str, text: str) -> Any:
    return new_output("error", ename=name, evalue=text, traceback=[])


def _files_of(part: int) -> list[str]:
    return list(load_rubric().part(part).files)


def take_notebook(nb: nbformat.NotebookNode, dest: Path) -> intake.Submission:
    """The notebook's solution cells as an intake result (grading.grade_one's `take`)."""
    graded = load_rubric().all_files()
    problems = extract(nb, dest, graded)
    sub = intake.Submission(name="notebook", source="notebook", dir=dest)
    for name in graded:
        if name in problems:
            if problems[name].startswith(NO_FILE):
                sub.missing.append(name)
            else:
                sub.rejected.append((name, sanitize.line(problems[name], 300)))
        elif (dest / name).is_file():
            sub.files[name] = hashlib.sha256((dest / name).read_bytes()).hexdigest()
    return sub


def main(argv: list[str] | None = None) -> int:
    from autograder.grade import Parser  # the kit's one-line argparse errors

    ap = Parser(prog="python -m instructor.nbgrader_channel")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract", help="write the graded .py files held by a notebook")
    e.add_argument("notebook", type=Path)
    e.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        nb = nbformat.read(a.notebook, as_version=4)
    except RecursionError:
        raise ValueError("not a Jupyter notebook (its JSON is nested too deeply)") from None
    except (AttributeError, KeyError, TypeError, IndexError):  # JSON of another shape (nbformat's reader assumes a dict)
        raise ValueError("not a Jupyter notebook (its JSON is not a notebook's); give the .ipynb file a student "
                         "submitted") from None
    problems = extract(nb, a.out)
    for name, why in problems.items():
        print(f"{name}: {why}", file=sys.stderr)
    print(a.out)
    return 0


if __name__ == "__main__":
    from autograder.grade import run_cli  # bad input: one line, never a traceback

    sys.exit(run_cli(main))
