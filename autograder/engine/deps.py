"""Which graded files can a part's tests reach? (static, from the relative imports)

A part's tests reach student code only through the proxy, and the engine only lets them call
the part's `files` and `uses` (rubric); the worker imports a graded module only when it is called
or imported by one that is. So part P can only run code from reach(P) = the closure of
files(P) ∪ uses(P) under the graded files' relative imports. An edit to a file outside reach(P)
cannot change P's results: the tests are deterministic and the same code runs in the same order.
"""
from __future__ import annotations

import ast
import functools

from .rubric import Rubric


def relative_imports(source: str, graded: set[str]) -> set[str]:
    """Graded module names imported by `source` (from .x import ..., from . import x, import_module)."""
    return set(_relative_imports(source, frozenset(graded)))


@functools.lru_cache(maxsize=32)  # a grade parses each file once per part reaching it (at most 32 MiB kept)
def _relative_imports(source: str, graded: frozenset[str]) -> frozenset[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a dynamic import by name ("..x" or "x" passed to importlib) still counts
            name = node.value.lstrip(".")
            if name in graded:
                found.add(name)
    return frozenset(found & graded)


def reach(rubric: Rubric, part: int, sources: dict[str, str]) -> set[str]:
    """Graded file names part `part` can run, given the submission's sources {file: text}."""
    graded = {f.removesuffix(".py") for f in rubric.all_files()}
    rule = rubric.part(part)
    todo = [f.removesuffix(".py") for f in [*rule.files, *rule.uses]]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += sorted(relative_imports(sources.get(module + ".py", ""), graded) - seen)
    return {m + ".py" for m in seen}


def parts_reaching(rubric: Rubric, files: set[str], sources: dict[str, str]) -> list[int]:
    """The parts whose tests can run any of `files`."""
    return [p.number for p in rubric.parts if reach(rubric, p.number, sources) & set(files)]
