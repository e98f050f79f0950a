"""Which graded files can a part's tests reach? (static, from every mention of a graded module)

A part's tests reach student code only through the proxy, and the engine only lets them call
the part's `files` and `uses` (rubric); the worker imports a graded module only when it is called
or imported by one that is. So part P can only run code from reach(P) = the closure of
files(P) ∪ uses(P) under the graded files' imports of each other (relative or absolute: any mention
of a graded module's name). An edit to a file outside reach(P) cannot change P's results: the tests are deterministic and the same code runs in the same order.
"""
from __future__ import annotations

import ast
import functools

from .rubric import Rubric


def relative_imports(source: str, graded: set[str]) -> set[str]:
    """Graded module names `source` may import: every mention of one, relative or absolute (from .x import
    ..., from . import x, import <package>.x, <package>.x as an attribute, "x" or "<package>.x" as a
    string for importlib). Names it computes ("flash" + "_decoding") are the residual (engine/reuse.py)."""
    return set(_relative_imports(source, frozenset(graded)))


@functools.lru_cache(maxsize=32)  # a grade parses each file once per part reaching it (at most 32 MiB kept)
def _relative_imports(source: str, graded: frozenset[str]) -> frozenset[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            # from .x import ..., from . import x, from <package>.x import ..., from <package> import x
            found.update((node.module or "").split("."))
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):  # import <package>.x (as ...)
            for a in node.names:
                found.update(a.name.split("."))
        elif isinstance(node, ast.Attribute):  # <package>.x, a module object's attribute
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a dynamic import by name ("..x", "x" or "<package>.x" passed to importlib) still counts
            found.update(node.value.split("."))
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
