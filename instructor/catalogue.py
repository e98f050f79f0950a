"""The mutation catalogues (instructor/mutations/*.toml, instructor/mutations2/*.toml): bugs the tests
must catch; and the equivalence catalogue (instructor/equivalents/*.toml): correct but different
implementations that must score full points.

    python -m instructor.catalogue [NAME ...]     # grade mutations, print the verdicts

    python -m instructor.catalogue --full [NAME ...]  # also grade the parts that import the bug

    python -m instructor.catalogue --rates [DIR]  # kill rate, right-part rate, rate of first messages
                                                  # that name the bug, misleading ones (default mutations2/)

    python -m instructor.catalogue --equivalents [NAME ...]  # every equivalent scores full points

A mutation is the reference solution with one bug (format in instructor/mutations/README.md).
Running one: copy solutions/*.py to a temp folder, apply the edits (each `old` must occur exactly
once), grade the declared part with public + hidden tests (fail-fast), and check that it loses
points with the declared hint in its feedback. The other parts:
- a part that cannot reach an edited file (deps.py) runs exactly the code it runs for the
  solutions (which score 100/100), so it cannot lose points: not graded;
- a part that imports the edited file (part 4 runs the student's flash_forward) may lose points by
  design; with full=True these dependents are graded too and must keep full points unless listed
  in `also`.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from autograder.engine.deps import parts_reaching
from autograder.engine.feedback import part_lines
from autograder.engine.judge import REPO_ROOT
from autograder.engine.rubric import Rubric, load_rubric

MUTATIONS_DIR = REPO_ROOT / "instructor" / "mutations"
MUTATIONS2_DIR = REPO_ROOT / "instructor" / "mutations2"
EQUIVALENTS_DIR = REPO_ROOT / "instructor" / "equivalents"
SOLUTIONS_DIR = REPO_ROOT / "solutions"
_KEYS = {"part", "description", "hint", "edit", "also"}
_EQUIVALENT_KEYS = {"description", "edit", "blocked_by"}


class MutationError(ValueError):
    """A malformed mutation file (the message names the file)."""


@dataclass(frozen=True)
class Edit:
    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    part: int
    description: str
    hint: str
    edits: list[Edit]
    also: list[int] = field(default_factory=list)  # other parts allowed to lose points (they call the bug)

    @property
    def files(self) -> set[str]:
        return {e.file for e in self.edits}


def load_mutation(path: Path, rubric: Rubric | None = None) -> Mutation:
    rubric = rubric or load_rubric()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MutationError(f"{path.name}: cannot read: {e}") from None
    unknown = set(data) - _KEYS
    if unknown:
        raise MutationError(f"{path.name}: unknown keys {sorted(unknown)} (allowed: {sorted(_KEYS)})")
    try:
        edits = [Edit(str(e["file"]), str(e["old"]), str(e["new"])) for e in data["edit"]]
        m = Mutation(path.stem, int(data["part"]), str(data["description"]), str(data["hint"]), edits,
                     [int(p) for p in data.get("also", [])])
    except (KeyError, TypeError, ValueError) as e:
        raise MutationError(f"{path.name}: missing or bad field {e}; see instructor/mutations/README.md") from None
    if m.part not in rubric.numbers or any(p not in rubric.numbers for p in m.also):
        raise MutationError(f"{path.name}: part {m.part} / also {m.also} not in the rubric {rubric.numbers}")
    if not m.edits or not m.hint.strip():
        raise MutationError(f"{path.name}: needs at least one [[edit]] and a non-empty hint")
    for e in m.edits:
        if e.file not in rubric.all_files():
            raise MutationError(f"{path.name}: {e.file!r} is not a graded file {rubric.all_files()}")
    return m


def all_mutations(directory: Path = MUTATIONS_DIR) -> list[Path]:
    return sorted(directory.glob("*.toml"))


def apply(m: Mutation, dest: Path, solutions: Path = SOLUTIONS_DIR) -> dict[str, str]:
    """Write the mutated copy of solutions/*.py into dest; returns {file: source} of the copy."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in solutions.glob("*.py"):
        shutil.copyfile(p, dest / p.name)
    apply_edits(m, dest)
    return {p.name: p.read_text(encoding="utf-8") for p in dest.glob("*.py")}


def apply_edits(m: Mutation, folder: Path) -> None:
    """Apply m's edits in place to the files of `folder` (a copy of solutions/, possibly changed)."""
    for e in m.edits:
        path = folder / e.file
        if not path.exists():
            raise MutationError(f"{m.name}: {e.file} does not exist in solutions/")
        text = path.read_text(encoding="utf-8")
        count = text.count(e.old)
        if count != 1:
            raise MutationError(f"{m.name}: `old` occurs {count} times in solutions/{e.file}, must be exactly once: "
                                f"{e.old[:80]!r}")
        path.write_text(text.replace(e.old, e.new), encoding="utf-8")


@dataclass
class Verdict:
    mutation: Mutation
    graded_parts: list[int]
    points: dict[int, tuple[float, float]]  # part -> (points, max)
    feedback: str
    problems: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems


def run(m: Mutation, *, solutions: Path = SOLUTIONS_DIR, rubric: Rubric | None = None, full: bool = False) -> Verdict:
    from autograder.engine.runner import grade

    rubric = rubric or load_rubric()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{m.name}-") as tmp:
        sources = apply(m, Path(tmp) / "sub", solutions)
        reached = parts_reaching(rubric, m.files, sources)
        problems: list[str] = []
        if m.part not in reached:
            problems.append(f"part {m.part} cannot reach {sorted(m.files)}; declared in the wrong part?")
        graded = sorted({*reached, m.part}) if full else [m.part]
        report = grade(Path(tmp) / "sub", parts=graded, test_sets=("public", "hidden"), fail_fast=True,
                       rubric=rubric.path)
    rows = {p["part"]: p for p in report["parts"]}
    points = {n: (rows[n]["points"], rows[n]["max_points"]) for n in rows}
    declared = rows[m.part]
    feedback = "\n".join(part_lines(declared))
    if report["errors"]:
        problems.append("grading errors: " + "; ".join(report["errors"])[:500])
    if declared["points"] >= declared["max_points"]:
        problems.append(f"not caught: part {m.part} kept all its points")
    elif m.hint not in feedback:
        problems.append(f"caught, but the hint {m.hint!r} is not in part {m.part}'s feedback:\n{feedback}")
    for n, row in rows.items():
        if n != m.part and n not in m.also and row["points"] < row["max_points"]:
            problems.append(f"part {n} also lost points ({row['points']}/{row['max_points']}); if it calls the "
                            f"buggy code by design, list it in `also`:\n" + "\n".join(part_lines(row)))
    return Verdict(m, graded, points, feedback, problems, time.perf_counter() - started)


def verdict_dict(path: Path, full: bool = False) -> dict:
    """run() as plain data, for a process pool (tests/test_mutations.py grades in 2 processes)."""
    v = run(load_mutation(path), full=full, solutions=SOLUTIONS_DIR)
    return {"name": path.stem, "ok": v.ok, "problems": v.problems, "graded": v.graded_parts,
            "seconds": v.seconds, "description": v.mutation.description}


# ---------------------------------------------------------------------------------------------------
# The equivalence catalogue: the mirror of the mutation catalogue


@dataclass(frozen=True)
class Equivalent:
    name: str
    description: str
    edits: list[Edit]
    blocked_by: str | None = None  # a known false failure another branch fixes (the test xfails it)

    @property
    def files(self) -> set[str]:
        return {e.file for e in self.edits}


def load_equivalent(path: Path, rubric: Rubric | None = None) -> Equivalent:
    rubric = rubric or load_rubric()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MutationError(f"{path.name}: cannot read: {e}") from None
    unknown = set(data) - _EQUIVALENT_KEYS
    if unknown:
        raise MutationError(f"{path.name}: unknown keys {sorted(unknown)} (allowed: {sorted(_EQUIVALENT_KEYS)})")
    try:
        edits = [Edit(str(e["file"]), str(e["old"]), str(e["new"])) for e in data["edit"]]
        eq = Equivalent(path.stem, str(data["description"]), edits, data.get("blocked_by"))
    except (KeyError, TypeError, ValueError) as e:
        raise MutationError(f"{path.name}: missing or bad field {e}") from None
    for e in eq.edits:
        if e.file not in rubric.all_files():
            raise MutationError(f"{path.name}: {e.file!r} is not a graded file {rubric.all_files()}")
    return eq


def run_equivalent(eq: Equivalent, *, solutions: Path = SOLUTIONS_DIR, rubric: Rubric | None = None) -> dict:
    """Grade every part that can reach an edited file, public + hidden, fail-fast: all must keep full points."""
    from autograder.engine.runner import grade

    rubric = rubric or load_rubric()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"equivalent-{eq.name}-") as tmp:
        sources = apply(eq, Path(tmp) / "sub", solutions)  # type: ignore[arg-type]
        graded = parts_reaching(rubric, eq.files, sources)
        report = grade(Path(tmp) / "sub", parts=graded, test_sets=("public", "hidden"), fail_fast=True,
                       rubric=rubric.path)
    rows = {p["part"]: p for p in report["parts"]}
    problems = []
    if report["errors"]:
        problems.append("grading errors: " + "; ".join(report["errors"])[:500])
    for n, row in rows.items():
        if row["points"] < row["max_points"]:
            problems.append(f"part {n}: {row['points']}/{row['max_points']}\n" + "\n".join(part_lines(row)))
    return {"name": eq.name, "ok": not problems, "problems": problems, "graded": graded,
            "points": {n: (r["points"], r["max_points"]) for n, r in rows.items()},
            "blocked_by": eq.blocked_by, "seconds": time.perf_counter() - started, "description": eq.description}


def equivalent_dict(path: Path) -> dict:
    return run_equivalent(load_equivalent(path))


# ---------------------------------------------------------------------------------------------------
# Rates over a catalogue of new bugs (issue: diagnosis that generalizes)


def first_message(feedback: str) -> str:
    """The first failure's message: the lines before the list of failing tests."""
    return feedback.split("    failing tests (")[0]


def classify(v: Verdict) -> str:
    """killed-named | killed-neutral | killed-misleading | wrong-part | not-killed.

    named: the first message contains the mutation's hint substring; neutral: it makes no claim (the
    probes found nothing, or only the part's generic recipe); misleading: it names something else."""
    from autograder.tests import probes as pb

    row_points = v.points.get(v.mutation.part)
    if row_points is None or row_points[0] >= row_points[1]:
        return "not-killed"
    if any("also lost points" in p for p in v.problems):
        return "wrong-part"
    first = first_message(v.feedback)
    if v.mutation.hint in first:
        return "killed-named"
    hint_line = next((line for line in first.splitlines() if line.strip().startswith("hint:")), "")
    if not hint_line or pb.NEUTRAL in hint_line:
        return "killed-neutral"
    return "killed-misleading"


def rates(directory: Path) -> tuple[dict[str, str], dict[str, float]]:
    """{mutation: class}, and the kill, right-part, named and misleading rates over the directory."""
    rubric = load_rubric()
    classes = {}
    for path in all_mutations(directory):
        classes[path.stem] = classify(run(load_mutation(path, rubric), rubric=rubric))
    n = len(classes) or 1
    killed = [c for c in classes.values() if c != "not-killed"]
    k = len(killed) or 1
    return classes, {
        "kill": len(killed) / n,
        "right_part": sum(c != "wrong-part" for c in killed) / k,
        "named": sum(c == "killed-named" for c in killed) / k,
        "misleading": sum(c == "killed-misleading" for c in killed) / k,
    }


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if args[:1] == ["--rates"]:
        directory = Path(args[1]) if len(args) > 1 else MUTATIONS2_DIR
        classes, r = rates(directory)
        for name, c in classes.items():
            print(f"{c:18} {name}")
        print(f"{len(classes)} mutations in {directory}: kill rate {r['kill']:.0%}, right part {r['right_part']:.0%}, "
              f"first message names the bug {r['named']:.0%}, misleading {r['misleading']:.0%}")
        return 0
    if args[:1] == ["--equivalents"]:
        names, bad = set(args[1:]), 0
        for path in sorted(EQUIVALENTS_DIR.glob("*.toml")):
            if names and path.stem not in names:
                continue
            v = equivalent_dict(path)
            pts = ", ".join(f"part {n} {p:g}/{m:g}" for n, (p, m) in v["points"].items())
            status = "full" if v["ok"] else ("BLOCKED:" + v["blocked_by"] if v["blocked_by"] else "LOSES")
            print(f"{status:14} {path.stem:40} {pts}  {v['seconds']:.1f} s")
            for p in v["problems"]:
                print("    " + p.replace("\n", "\n    ")[:1500])
            bad += not v["ok"] and not v["blocked_by"]
        return 1 if bad else 0
    full = "--full" in args
    names = {a for a in args if a != "--full"}
    rubric = load_rubric()
    failed = 0
    for path in all_mutations():
        if names and path.stem not in names:
            continue
        v = run(load_mutation(path, rubric), rubric=rubric, full=full)
        status = "caught" if v.ok else "PROBLEM"
        print(f"{status:8} {path.stem:40} part {v.mutation.part}  graded {v.graded_parts}  {v.seconds:.1f} s")
        for p in v.problems:
            print("    " + p.replace("\n", "\n    "))
        failed += not v.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
