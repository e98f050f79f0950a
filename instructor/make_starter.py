"""Generate starter/ from solutions/: every solution region becomes `raise NotImplementedError`.

    python -m instructor.make_starter            # (re)write starter/
    python -m instructor.make_starter --check    # exit 1 if starter/ is not what this would write

A region is the lines between `### BEGIN SOLUTION` and `### END SOLUTION` (nbgrader's markers, each
on its own line, indented like the code). It must be a whole statement block: the statements
between the markers are consecutive statements of one block, none of them continues past a
marker. Comments above a region (the hints) are kept. Each starter file starts with a header
for the student (`header`): which part it is, where its handout page is, how to grade and debug
it. starter/__init__.py gets the student's package docstring instead of the solutions' one.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HEADER = ("# Part {part} of the assignment: your implementation. Replace each `raise NotImplementedError`\n"
          "# below with your code ({handout}). `make grade PART={part}` grades this file;\n"
          "# `make debug PART={part}` runs its first failing test where breakpoint() and print work.\n")
PACKAGE_HEADER = "# Your implementation of the six graded parts, one file per part (docs/handout/README.md).\n"
PACKAGE_DOC = '"""Your implementation of the assignment: one file per part; `make grade` grades them."""\n'


def header(name: str) -> str:
    """The first lines of starter/<name>: the part, its handout page, how to grade and debug it."""
    import tomllib

    rubric = tomllib.loads((REPO / "autograder" / "rubric.toml").read_text(encoding="utf-8"))
    part = next((int(p["number"]) for p in rubric["part"] if name in p["files"]), None)
    if part is None:
        return PACKAGE_HEADER
    page = REPO / "docs" / "handout" / f"part{part}_{name.removesuffix('.py')}.md"
    handout = page.relative_to(REPO).as_posix() if page.is_file() else "docs/handout/README.md"
    return HEADER.format(part=part, handout=handout)


class RegionError(ValueError):
    """A solution region that cannot be turned into a stub; the message names file:line."""


def _statements(tree: ast.AST) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """Every statement with the body list that holds it."""
    out = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                out += [(s, block) for s in block if isinstance(s, (ast.stmt, ast.excepthandler, ast.match_case))]
    return out


def stub_source(text: str, name: str) -> str:
    """The starter text for one solution file (raises RegionError on a malformed region)."""
    lines = text.splitlines(keepends=True)
    try:
        tree = ast.parse(text, filename=name)
    except SyntaxError as e:
        raise RegionError(f"{name}:{e.lineno}: the solution does not parse: {e.msg}") from None
    stmts = _statements(tree)
    regions: list[tuple[int, int, str]] = []  # (begin line, end line) 1-based, marker indent
    open_at: tuple[int, str] | None = None
    for i, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("###") and "SOLUTION" in stripped and stripped not in (BEGIN, END):
            raise RegionError(f"{name}:{i}: malformed marker {stripped!r}; use {BEGIN!r} / {END!r} on their own lines")
        if stripped == BEGIN:
            if open_at:
                raise RegionError(f"{name}:{i}: {BEGIN} inside the region opened at line {open_at[0]}")
            open_at = (i, line[: len(line) - len(line.lstrip())])
        elif stripped == END:
            if not open_at:
                raise RegionError(f"{name}:{i}: {END} without {BEGIN}")
            indent = line[: len(line) - len(line.lstrip())]
            if indent != open_at[1]:
                raise RegionError(f"{name}:{i}: {END} is indented differently from {BEGIN} at line {open_at[0]}")
            regions.append((open_at[0], i, indent))
            open_at = None
    if open_at:
        raise RegionError(f"{name}:{open_at[0]}: {BEGIN} is never closed")

    for begin, end, indent in regions:
        inside = [s for s, _ in stmts if begin < s.lineno and s.end_lineno < end]
        last = max((s.end_lineno for s in inside), default=begin)
        # A statement that starts inside the region and ends after it, or one that starts before it
        # and ends inside it without enclosing it (an enclosing def may end on the region's last line).
        straddling = [s for s, _ in stmts
                      if (begin < s.lineno < end and s.end_lineno > end)
                      or (s.lineno < begin and begin < s.end_lineno < end and s.end_lineno < last)]
        if straddling:
            s = straddling[0]
            raise RegionError(f"{name}:{begin}: the region is not a whole statement block (the statement at line "
                              f"{s.lineno} crosses a marker); put the markers around complete statements")
        if not inside:
            raise RegionError(f"{name}:{begin}: the region holds no statement")
        top = [s for s in inside if not any(o is not s and o.lineno <= s.lineno and s.end_lineno <= o.end_lineno
                                            and begin < o.lineno for o in inside)]
        blocks = {id(block) for s, block in stmts if s in top}
        if len(blocks) != 1:
            raise RegionError(f"{name}:{begin}: the region's statements belong to different blocks")
        if any(s.col_offset != len(indent) for s in top):
            raise RegionError(f"{name}:{begin}: the markers must be indented like the region's statements")

    out = [header(name)]
    at = 1
    for begin, end, indent in regions:
        out += lines[at - 1 : begin - 1]
        out.append(f"{indent}raise NotImplementedError\n")
        at = end + 1
    out += lines[at - 1 :]
    result = "".join(out)
    try:
        ast.parse(result, filename=name)
    except SyntaxError as e:  # e.g. a region that was the only content of a block with trailing code
        raise RegionError(f"{name}:{e.lineno}: the generated stub does not parse: {e.msg}") from None
    return result


def generate(solutions: Path, out_dir: Path | None = None) -> dict[str, str]:
    """{file name: starter text} for every .py file of solutions/."""
    out = {p.name: stub_source(p.read_text(encoding="utf-8"), p.name) for p in sorted(solutions.glob("*.py"))}
    if "__init__.py" in out:  # the package docstring speaks of the reference solutions
        out["__init__.py"] = PACKAGE_HEADER + PACKAGE_DOC
    return out


def differences(solutions: Path, starter: Path) -> list[str]:
    """What differs between starter/ and what would be generated (empty when in sync)."""
    want = generate(solutions)
    have = {p.name: p.read_text(encoding="utf-8") for p in sorted(starter.glob("*.py"))} if starter.is_dir() else {}
    diffs = [f"{n}: missing from starter/" for n in want if n not in have]
    diffs += [f"{n}: differs from what solutions/{n} generates" for n in want if n in have and have[n] != want[n]]
    diffs += [f"{n}: in starter/ but not generated from solutions/" for n in have if n not in want]
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if starter/ is out of date")
    ap.add_argument("--solutions", type=Path, default=REPO / "solutions")
    ap.add_argument("--starter", type=Path, default=REPO / "starter")
    args = ap.parse_args(argv)
    try:
        if args.check:
            diffs = differences(args.solutions, args.starter)
            for d in diffs:
                print(f"starter/{d}", file=sys.stderr)
            if diffs:
                print("starter/ is out of date: run `make starter`", file=sys.stderr)
            return 1 if diffs else 0
        files = generate(args.solutions)
    except RegionError as e:
        print(f"error: solutions/{e}", file=sys.stderr)
        return 2
    args.starter.mkdir(parents=True, exist_ok=True)
    for stale in args.starter.glob("*.py"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        path = args.starter / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    print(f"wrote {len(files)} files to {args.starter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
