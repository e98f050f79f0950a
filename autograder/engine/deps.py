"""Which graded files can a part's tests reach? (static, from every mention of a graded module)

A part's tests reach student code only through the proxy, and the engine only lets them call
the part's `files` and `uses` (rubric); the worker imports a graded module only when it is called
or imported by one that is. So part P can only run code from reach(P) = the closure of
files(P) ∪ uses(P) under the graded files' imports of each other (relative or absolute: any mention
of a graded module's name), or every graded file when one of those files could reach another by a
name it computes or read it as data (DYNAMIC). An edit to a file outside reach(P) cannot change P's
results: the tests are deterministic and the same code runs in the same order.

The analysis is not trusted to be complete (Python's reflective surface has no end: typing.ForwardRef
evaluates a string). Part P's workers are GIVEN reach(P)'s files only (SubmissionCopy.code_for), so
whatever the code does, a file outside reach(P) is not there to run or read: the reuse key
(reuse.part_key) holds everything P's code can use, and a file the analysis missed makes P fail alike
whoever submitted it, never take another submission's result.
"""
from __future__ import annotations

import ast
import functools

from .rubric import Rubric
from .worker import PACKAGE


def relative_imports(source: str, graded: set[str]) -> set[str]:
    """Graded module names `source` may import: every mention of one, relative or absolute (from .x import
    ..., from . import x, import <package>.x, <package>.x as an attribute, "x" or "<package>.x" as a
    string for importlib). A name it computes ("flash" + "_decoding") needs one of the DYNAMIC names, which
    reach answers with every graded file."""
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


# What a graded file may import and still be followed by its mentions alone: the modules the assignment
# computes with and the kit's own. Any other import (fileinput, configparser, os, importlib, ...) may
# read or run another graded file by a name it computes: no list of readers is complete, so an import
# outside this list counts as dynamic. Relative imports (siblings) are always followed.
PLAIN_IMPORTS = frozenset({"torch", "math", "numpy", "typing", "__future__", "dataclasses", "functools",
                           "itertools", "collections", "abc", "enum", "numbers", "operator", "course"})
# Builtins and attributes (of the modules above too) through which code can reach a module, or a file's
# bytes, by a name it computes: imports by name, exec/eval, namespaces, reflection, file readers.
DYNAMIC = frozenset("""
__import__ importlib import_module exec eval compile open globals locals vars getattr setattr delattr modules
builtins breakpoint input help load_module exec_module spec_from_file_location find_spec read_text read_bytes
load loads loadtxt genfromtxt fromfile fromregex from_file memmap DataSource mmap hub package load_library
load_inline cpp_extension jit serialization load_checkpoint save_checkpoint CHECKPOINT
""".split())  # (the last three: the kit's own file readers, course.tiny_transformer; torch.load's error tells a byte)
PLAIN_DUNDERS = frozenset({"__name__", "__init__", "__doc__", "__all__", "__future__", "__main__"})


@functools.lru_cache(maxsize=32)
def dynamic(source: str) -> bool:
    """Whether `source` could reach a graded file by a name it computes, or read one as data: it imports
    a module outside PLAIN_IMPORTS (absolutely), or names one of DYNAMIC, or a dunder other than the plain
    ones (__builtins__, __class__, __subclasses__, ...). Unparsable source counts as dynamic (it never
    runs, but nothing is claimed about it)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Import):
            if any(a.name.split(".")[0] not in PLAIN_IMPORTS | {PACKAGE} for a in node.names):
                return True
            names = [n for a in node.names for n in (a.name.split(".") + [a.asname or ""])]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] not in PLAIN_IMPORTS | {PACKAGE}:
                return True
            names = [n for a in node.names for n in (a.name, a.asname or "")] + (node.module or "").split(".")
        for name in names:
            if name in DYNAMIC or (name.startswith("__") and name.endswith("__") and name not in PLAIN_DUNDERS):
                return True
    return False


def reach(rubric: Rubric, part: int, sources: dict[str, str]) -> set[str]:
    """Graded file names part `part` can run, given the submission's sources {file: text}: the closure
    of its files and `uses` under every mention of a graded module, or every graded file where one
    of those reads files or resolves names it computes (dynamic)."""
    graded = {f.removesuffix(".py") for f in rubric.all_files()}
    rule = rubric.part(part)
    todo = [f.removesuffix(".py") for f in [*rule.files, *rule.uses]]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        source = sources.get(module + ".py", "")
        if dynamic(source):
            return {m + ".py" for m in graded}
        todo += sorted(relative_imports(source, graded) - seen)
    return {m + ".py" for m in seen}


def parts_reaching(rubric: Rubric, files: set[str], sources: dict[str, str]) -> list[int]:
    """The parts whose tests can run any of `files`."""
    return [p.number for p in rubric.parts if reach(rubric, p.number, sources) & set(files)]
