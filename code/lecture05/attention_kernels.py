"""The attention kernels the lecture programs run: YOUR implementation of the six graded files.

    import attention_kernels as ak
    ak.flash_forward(q, k, v, causal=True)     # the flash_forward of the chosen folder
    with ak.part_demo():                       # a part that is not implemented yet: one line, go on
        ...

Which folder (the programs take `--impl DIR`; `LECTURE_IMPL=DIR` in the environment does the same):
- `solutions/` where it exists (the instructor's repository), else `starter/` (the student's);
- any folder with the six files (online_softmax.py, flash_forward.py, flash_kernel.py,
  flash_backward.py, kv_cache.py, flash_decoding.py), e.g. `--impl mine`.

The folder is imported as one package (so `from .flash_forward import flash_forward` inside it
works), lazily: a name is imported from its file the first time a program uses it, so a file that
is still a stub costs only the demos that need it. A stub raises NotImplementedError; `part_demo`
turns that into one line per part ("part 3 is not implemented yet: make grade PART=3") and the
program goes on with its next demo. This is the lecture, not the grader: nothing here is a grade.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
import tomllib
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENV = "LECTURE_IMPL"
PACKAGE = "lecture05_impl"  # the chosen folder, imported under this name


def _parts() -> dict[str, int]:
    """Graded file -> part number, from the rubric (autograder/rubric.toml)."""
    rubric = tomllib.loads((ROOT / "autograder" / "rubric.toml").read_text(encoding="utf-8"))
    return {f: int(p["number"]) for p in rubric["part"] for f in p["files"]}


PART_OF_FILE = _parts()

_impl: Path | None = None
_reported: set[int] = set()
_where: dict[str, str | None] = {}  # name -> defining module, for the folder in use


def default_impl() -> Path:
    """$LECTURE_IMPL, else solutions/ where it exists, else starter/."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return ROOT / "solutions" if (ROOT / "solutions").is_dir() else ROOT / "starter"


def use(folder: str | os.PathLike | None) -> Path:
    """Choose the implementation folder (None: `default_impl()`). Exits with one line if it is not one."""
    global _impl
    path = Path(folder) if folder is not None else default_impl()
    if not path.is_absolute() and not path.is_dir() and (ROOT / path).is_dir():
        path = ROOT / path  # a folder named relative to the repository root
    path = path.resolve()
    if not path.is_dir():
        raise SystemExit(f"error: {folder or path} is not a folder; use --impl starter or --impl DIR "
                         f"(a folder with {', '.join(sorted(PART_OF_FILE))})")
    if path != _impl:
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        package = types.ModuleType(PACKAGE, f"the implementation folder {path}")
        package.__path__ = [str(path)]
        sys.modules[PACKAGE] = package
        _impl = path
        _where.clear()
    return path


def impl() -> Path:
    """The folder in use (chosen by `use`, else the default)."""
    return _impl if _impl is not None else use(None)


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """An ArgumentParser for a lecture program, with `--impl DIR` already added."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    ap.add_argument("--impl", metavar="DIR", default=None,
                    help=f"the folder with your six files (default: ${ENV}, else solutions/ where it exists, "
                         "else starter/)")
    return ap


def setup(doc: str | None, argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None):
    """Parse a program's arguments, choose the folder, print which one runs. Returns the arguments."""
    args = (parser or argument_parser(doc)).parse_args(argv)
    path = use(args.impl)
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    print(f"implementation: {shown}/ (another folder: --impl DIR)")
    return args


def _defined_in(name: str) -> str | None:
    """The graded file (module name) that defines `name` at top level, found without importing."""
    for file in sorted(PART_OF_FILE):
        src = impl() / file
        try:
            tree = ast.parse(src.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            if name in names:
                return file.removesuffix(".py")
    return None


class PartUnavailable(Exception):
    """A part's file cannot be used (missing, or it fails to import)."""

    def __init__(self, part: int, reason: str) -> None:
        super().__init__(reason)
        self.part, self.reason = part, reason


def module(name: str) -> types.ModuleType:
    """The implementation's module `name` (e.g. "flash_forward"), imported on first use."""
    file = name + ".py"
    part = PART_OF_FILE[file]
    if not (impl() / file).is_file():
        raise PartUnavailable(part, f"part {part}: {file} is missing from {impl()}")
    try:
        return importlib.import_module(f"{PACKAGE}.{name}")
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 -- the student's file: say what failed, in one line
        sys.modules.pop(f"{PACKAGE}.{name}", None)
        raise PartUnavailable(part, f"part {part}: importing {file} failed: {type(exc).__name__}: {exc}") from None


def __getattr__(name: str) -> Any:
    """`attention_kernels.flash_forward` etc.: the object of that name in the implementation."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _where:
        _where[name] = _defined_in(name)
    where = _where[name]
    if where is None:
        raise AttributeError(f"no graded file in {impl()} defines {name!r}")
    return getattr(module(where), name)


def _part_of(tb: types.TracebackType | None) -> int | None:
    """The part whose file raised: the innermost frame of the traceback in the implementation."""
    part = None
    for frame, _ in traceback.walk_tb(tb):
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith(PACKAGE + "."):
            part = PART_OF_FILE.get(mod.split(".", 1)[1] + ".py", part)
    return part


def report(part: int, reason: str | None = None) -> None:
    """Print the one line for a missing part (once per part and program)."""
    if part in _reported:
        return
    _reported.add(part)
    print(reason + f" (make grade PART={part})" if reason else
          f"part {part} is not implemented yet: make grade PART={part}", flush=True)


@contextmanager
def part_demo() -> Iterator[None]:
    """Run a demo; if a part it needs is not implemented yet (or does not import), print the one
    line for that part and skip the rest of this demo. Any other error is a real error: it propagates."""
    try:
        yield
    except PartUnavailable as e:
        report(e.part, e.reason)
    except NotImplementedError as e:
        part = _part_of(e.__traceback__)
        if part is None:
            raise
        report(part)
