"""The handout's signature blocks match the code: docs/handout/partN_*.md vs solutions/ and starter/.

Every ```python block of a part page is parsed; each `def` / `class` in it (and each method of a
class) must exist in the part's graded file with the same parameters (names, kinds, order,
defaults), the same return and parameter annotations, the same base classes, and, where the
handout gives a docstring (it states the shapes), the same docstring. Compared with ast, in
solutions/ AND starter/, so handout, stubs and solutions cannot drift apart.
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from autograder.engine.rubric import load_rubric

REPO = Path(__file__).resolve().parent.parent
HANDOUT = REPO / "docs" / "handout"
RUBRIC = load_rubric()
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def page(part: int) -> Path:
    pages = sorted(HANDOUT.glob(f"part{part}_*.md"))
    assert len(pages) == 1, f"expected one docs/handout/part{part}_<name>.md, found {[p.name for p in pages]}"
    return pages[0]


def handout_defs(part: int) -> list[ast.AST]:
    text = page(part).read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    assert blocks, f"{page(part).name} has no ```python signature block"
    defs = []
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError as e:
            pytest.fail(f"{page(part).name}: the python block does not parse: {e}")
        defs += [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defs, f"{page(part).name}: no def or class in its python block"
    return defs


def signature(fn: ast.FunctionDef) -> dict:
    a = fn.args
    un = lambda n: ast.unparse(n) if n is not None else None  # noqa: E731
    return {
        "posonly": [(p.arg, un(p.annotation)) for p in a.posonlyargs],
        "args": [(p.arg, un(p.annotation)) for p in a.args],
        "defaults": [un(d) for d in a.defaults],
        "vararg": (a.vararg.arg, un(a.vararg.annotation)) if a.vararg else None,
        "kwonly": [(p.arg, un(p.annotation)) for p in a.kwonlyargs],
        "kw_defaults": [un(d) for d in a.kw_defaults],
        "kwarg": (a.kwarg.arg, un(a.kwarg.annotation)) if a.kwarg else None,
        "returns": un(fn.returns),
        "decorators": [un(d) for d in fn.decorator_list],
        "async": isinstance(fn, ast.AsyncFunctionDef),
    }


def compare(want: ast.AST, module: ast.Module, where: str) -> list[str]:
    found = {n.name: n for n in module.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return _compare(want, found, where)


def _compare(want, found: dict, where: str) -> list[str]:
    have = found.get(want.name)
    if have is None or type(have) is not type(want):
        return [f"{where}: {want.name} ({type(want).__name__}) is in the handout but not in the code"]
    problems = []
    doc = ast.get_docstring(want)
    if doc is not None and inspect.cleandoc(doc) != inspect.cleandoc(ast.get_docstring(have) or ""):
        problems.append(f"{where}: the docstring of {want.name} differs from the handout's")
    if isinstance(want, ast.FunctionDef):
        sw, sh = signature(want), signature(have)
        for key in sw:
            if sw[key] != sh[key]:
                problems.append(f"{where}: {want.name}: {key} {sh[key]} in the code, {sw[key]} in the handout")
    else:
        bases_w = [ast.unparse(b) for b in want.bases]
        bases_h = [ast.unparse(b) for b in have.bases]
        if bases_w != bases_h:
            problems.append(f"{where}: class {want.name} has bases {bases_h}, the handout says {bases_w}")
        members = {n.name: n for n in have.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for member in want.body:
            if isinstance(member, (ast.FunctionDef, ast.ClassDef)):
                problems += _compare(member, members, f"{where}: {want.name}")
    return problems


@pytest.mark.parametrize("folder", ["solutions", "starter"])
@pytest.mark.parametrize("part", RUBRIC.numbers)
def test_handout_signatures_exist_in_code(part, folder):
    rule = RUBRIC.part(part)
    modules = {}
    for f in rule.files:
        path = REPO / folder / f
        assert path.exists(), f"{folder}/{f} is missing"
        modules[f] = ast.parse(path.read_text(encoding="utf-8"))
    problems = []
    for want in handout_defs(part):
        per_file = [compare(want, tree, f"{folder}/{f}") for f, tree in modules.items()]
        if not any(not p for p in per_file):  # must match in one of the part's files
            problems += per_file[0]
    assert not problems, f"{page(part).name} vs {folder}/:\n" + "\n".join(problems)


def test_the_comparison_catches_drift():
    code = ast.parse("def f(x: int, y: float = 1.0) -> int:\n    '''Shapes (N,).'''\n")
    same = ast.parse("def f(x: int, y: float = 1.0) -> int:\n    '''Shapes (N,).'''\n    ...\n").body[0]
    assert compare(same, code, "m.py") == []
    for drift in ("def f(x: int, y: float = 2.0) -> int: ...", "def f(x: int, z: float = 1.0) -> int: ...",
                  "def f(x: int, y: float = 1.0) -> float: ...", "def g(x: int, y: float = 1.0) -> int: ...",
                  "def f(x: int, y: float = 1.0) -> int:\n    '''Shapes (N, d).'''\n    ...",
                  "class f: ..."):
        assert compare(ast.parse(drift).body[0], code, "m.py"), drift


_TORCH_NAME = {"_softmax": "torch.softmax", "_log_softmax": "torch.log_softmax", "logsumexp": "torch.logsumexp"}


@pytest.mark.parametrize("part", RUBRIC.numbers)
def test_the_handout_names_the_ops_its_part_refuses(part):
    """Each op the grader refuses in a part only (replay.REFUSED_IN) is named on that part's page, and
    a page that names such a rule names only ops that are refused there: a correct variant that uses
    one then loses points for a rule the student could read."""
    from autograder.engine.replay import REFUSED_IN

    text = page(part).read_text(encoding="utf-8")
    refused = {_TORCH_NAME.get(op, f"torch.{op}") for op in REFUSED_IN.get(part, ())}
    assert all(f"`{name}`" in text for name in refused), (part, refused)
    if not refused:
        assert "are refused in parts" not in text, part
    else:
        said = re.search(r"are refused in parts ([\d, and]+)", text)
        assert said and {int(n) for n in re.findall(r"\d", said.group(1))} == set(REFUSED_IN), said
