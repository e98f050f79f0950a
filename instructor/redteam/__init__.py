"""The red-team corpus (see README.md here): attacks on the grader, and honest submissions to
grade next to them. `python -m instructor.redteam assemble DIR` writes the full corpus."""
from __future__ import annotations

import ast
import re
import shutil
import tomllib
from pathlib import Path, PurePosixPath

from autograder.grade import UsageError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MARK = "# ---- red-team attack (instructor/redteam): everything below is the attack ----\n"
BASE = "# redteam-base:"  # first line of an attack file in the edit form (see apply_edits)
ADD = "# redteam-add:"  # its optional second line: the names the attack adds (the others replace)
BASE_FOLDERS = ("solutions", "starter")
HONEST_MUTATION = "forward_no_rescale"  # from instructor/mutations, applied to honest_wrong when present

# honest_wrong's part-1 mistake: merge_partial adds the partial outputs without rescaling them.
HONEST_PART1_BUG = '''

# An honest mistake (red-team corpus, honest_wrong): the outputs are added without rescaling them
# to the common max, so merge_partial is wrong whenever the two maxima differ.
def merge_partial(a, b):
    (ma, la, oa), (mb, lb, ob) = a, b
    return torch.maximum(ma, mb), la + lb, oa + ob
'''


class EditError(UsageError):
    """An attack file in the edit form cannot be applied; the message is one line naming the file."""


def _defined_name(node: ast.stmt) -> str | None:
    """The one name a top-level statement defines (def, class, `name = ...`, an import of one name), else None."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, (ast.Import, ast.ImportFrom)) and len(node.names) == 1 and node.names[0].name != "*":
        alias = node.names[0]
        return alias.asname or alias.name.split(".")[0]
    return None


def _span(node: ast.stmt, lines: list[str]) -> tuple[int, int]:
    """The 0-based slice of `lines` a top-level statement takes: its decorators to its last line, and the
    indented comment lines right after it (the end of its body, e.g. `### END SOLUTION`)."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    end = node.end_lineno
    while end < len(lines) and lines[end][:1] in (" ", "\t") and lines[end].lstrip().startswith("#"):
        end += 1
    return start, end


def _base_spans(text: str) -> dict[str, list[tuple[int, int]]]:
    """{name: [(start, end), ...]}: the line slices (_span) of the base's top-level definitions of one name."""
    lines = text.splitlines(keepends=True)
    spans: dict[str, list[tuple[int, int]]] = {}
    for node in ast.parse(text).body:
        if (name := _defined_name(node)) is not None:
            spans.setdefault(name, []).append(_span(node, lines))
    return spans


def apply_edits(text: str, where: str) -> str:
    """The full text of an attack file in the edit form (`text`; `where` names it in errors).

    The file's leading comment lines are its header, which is not copied: first
    `# redteam-base: solutions/NAME.py` (or starter/NAME.py), then optionally
    `# redteam-add: NAME ...` (names apart by spaces or commas); any other header line is a note.
    After a blank line, the file holds only top-level definitions of one name each (def, class,
    `NAME = ...`, an import of one name), each with the comment lines directly above it. The result
    is the base's text where
    - a definition whose name the base defines (once) takes the place of the base's lines for it:
      decorators to last line, and the indented comments right after it (`### END SOLUTION`); the
      base's comments above it stay;
    - the definitions named in redteam-add follow the base, in the file's order, two blank lines apart;
    and every other byte of the base is kept. A missing base, a name the base does not define (or
    defines twice) and not in redteam-add, or a line outside the definitions raises EditError."""
    lines = text.splitlines(keepends=True)
    n_header = next((i for i, ln in enumerate(lines) if not ln.startswith("#")), len(lines))
    header = {key: ln[len(key):].strip() for ln in lines[:n_header] for key in (BASE, ADD) if ln.startswith(key)}
    base = header.get(BASE, "")
    path = PurePosixPath(base)
    if len(path.parts) != 2 or path.parts[0] not in BASE_FOLDERS or not (ROOT / path).is_file():
        raise EditError(f"{where}: base {base!r} is not a file of solutions/ or starter/")
    add = [name for name in re.split(r"[\s,]+", header.get(ADD, "")) if name]
    base_text = (ROOT / path).read_text(encoding="utf-8")
    spans = _base_spans(base_text)
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise EditError(f"{where}:{e.lineno}: {e.msg}") from None

    replaced: dict[tuple[int, int], list[str]] = {}  # (start, end) of a base definition -> the attack's lines
    appended: dict[str, list[str]] = {}
    covered = set(range(n_header))
    for node in tree.body:
        name = _defined_name(node)
        if name is None:
            raise EditError(f"{where}:{node.lineno}: not a definition of one name (the edit form holds only those)")
        start, end = _span(node, lines)
        while start > n_header and lines[start - 1].startswith("#"):  # the comments directly above it
            start -= 1
        chunk = lines[start:end]
        chunk[-1] = chunk[-1].rstrip("\n") + "\n"
        covered.update(range(start, end))
        if name in add:
            if name in spans or name in appended:
                raise EditError(f"{where}:{node.lineno}: {name} is in '{ADD}' but is defined already "
                                f"(in {base} or above)")
            appended[name] = chunk
        else:
            found = spans.get(name, [])
            if len(found) != 1:
                why = f"defines it {len(found)} times" if found else f"does not define it (list a new name in '{ADD}')"
                raise EditError(f"{where}:{node.lineno}: cannot replace {name}: {base} {why}")
            if found[0] in replaced:
                raise EditError(f"{where}:{node.lineno}: {name} is defined twice in this file")
            replaced[found[0]] = chunk
    if stray := [i + 1 for i, ln in enumerate(lines) if i not in covered and ln.strip()]:
        raise EditError(f"{where}:{stray[0]}: a line outside every definition (move it into one, or just above one)")
    if missing := [name for name in add if name not in appended]:
        raise EditError(f"{where}: {missing[0]} is in '{ADD}' but the file does not define it")

    out = base_text.splitlines(keepends=True)
    for (start, end), chunk in sorted(replaced.items(), reverse=True):  # bottom-up: earlier lines stay put
        out[start:end] = chunk
    result = "".join(out)
    if appended:
        result = result.rstrip("\n") + "\n" + "".join("\n\n" + "".join(chunk) for chunk in appended.values())
    return result


def attacks() -> dict[str, dict]:
    """{attack name: its ATTACK.toml}, sorted."""
    out = {}
    for d in sorted(HERE.iterdir()):
        if (d / "ATTACK.toml").is_file():
            out[d.name] = tomllib.loads((d / "ATTACK.toml").read_text(encoding="utf-8"))
    return out


def _graded_files() -> list[str]:
    from ..intake import all_graded_files

    return all_graded_files()


def _apply_mutation(folder: Path, name: str) -> bool:
    """Apply instructor/mutations/<name>.toml in place to `folder`; False if there is no such mutation."""
    from .. import catalogue

    path = ROOT / "instructor" / "mutations" / f"{name}.toml"
    if not path.is_file():
        return False
    catalogue.apply_edits(catalogue.load_mutation(path), folder)
    return True


def assemble(dest: Path, *, honest: bool = True) -> dict[str, dict]:
    """Write every attack (laid over the current starter) and the honest submissions into `dest`.

    An attack folder's files are written over a copy of starter/, each in one of three forms:
    - the edit form: first line `# redteam-base: solutions/NAME.py` (or starter/NAME.py), optionally
      `# redteam-add: NAME ...`, then only the top-level definitions the attack replaces or adds: the
      base's text with those definitions swapped in, the added ones at the end (see apply_edits; a
      missing base or name raises EditError, one line);
    - the MARK form (ATTACK.toml's `file` only): the block after MARK appended to the current starter;
    - anything else: written as it is.
    Returns {submission name: {"kind": "attack"|"honest", ...}}; an attack's ATTACK.toml `kind`
    (cheat or harm) is under "goal"."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = _graded_files()
    corpus: dict[str, dict] = {}
    for name, spec in attacks().items():
        d = dest / name
        d.mkdir()
        for f in files:
            if (ROOT / "starter" / f).is_file():
                shutil.copyfile(ROOT / "starter" / f, d / f)
        src = HERE / name
        for f in sorted(src.iterdir()):
            if f.name == "ATTACK.toml" or f.is_dir():
                continue
            text = f.read_text(encoding="utf-8")
            if text.startswith(BASE):  # base + edits
                text = apply_edits(text, str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f))
            elif f.name == spec.get("file") and MARK in text:  # the attack block over the CURRENT starter
                block = text.split(MARK, 1)[1]
                text = (ROOT / "starter" / f.name).read_text(encoding="utf-8").rstrip("\n") + "\n\n\n" + MARK + block
            (d / f.name).write_text(text, encoding="utf-8")
        corpus[name] = {**spec, "kind": "attack", "goal": spec.get("kind")}  # goal: cheat | harm
    if honest:
        for name, base in (("honest_solutions", "solutions"), ("honest_starter", "starter"), ("honest_wrong", "solutions")):
            d = dest / name
            d.mkdir()
            for f in files:
                if (ROOT / base / f).is_file():
                    shutil.copyfile(ROOT / base / f, d / f)
            corpus[name] = {"kind": "honest", "base": base}
        wrong = dest / "honest_wrong"
        with (wrong / "online_softmax.py").open("a", encoding="utf-8") as fh:
            fh.write(HONEST_PART1_BUG)
        corpus["honest_wrong"]["mutation"] = HONEST_MUTATION if _apply_mutation(wrong, HONEST_MUTATION) else None
    return corpus


def grade_part(job: tuple[str, int]) -> dict:
    """grade(folder, parts=[part]) with public and hidden tests: one job of the measurement test's pool
    (a module-level function, so that spawned processes can run it)."""
    from autograder.engine.runner import grade

    folder, part = job
    return grade(folder, parts=[part], test_sets=("public", "hidden"))

