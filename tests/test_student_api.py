"""The student-API seam (autograder/student_api.py): every target the tests and scenarios use is
listed there, and every entry matches solutions/, starter/ and the handout."""
from __future__ import annotations

import ast
import importlib
import inspect
import tomllib
from pathlib import Path

import pytest
import torch

from autograder.student_api import API, MODULES, TARGETS

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "autograder" / "tests").glob("*.py")) + sorted((ROOT / "autograder" / "scenarios").glob("*.py"))
RUBRIC = tomllib.loads((ROOT / "autograder" / "rubric.toml").read_text())
PART_OF_MODULE = {f.removesuffix(".py"): int(p["number"]) for p in RUBRIC["part"] for f in p["files"]}


def _constants(tree: ast.Module) -> dict[str, object]:
    """Module-level NAME = "str" / {..: "str"} / ("str", ...) assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _values(node: ast.expr, consts: dict) -> list[str] | None:
    """The strings an expression can be: a constant, a module constant, a dict constant's values
    (COUNTED[which]), or an f-string of those. None if it is not known statically."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and isinstance(consts.get(node.id), str):
        return [consts[node.id]]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(consts.get(node.value.id), dict):
        return [v for v in consts[node.value.id].values() if isinstance(v, str)]
    if isinstance(node, ast.JoinedStr):
        out = [""]
        for part in node.values:
            vals = _values(part.value, consts) if isinstance(part, ast.FormattedValue) else [part.value]
            if vals is None:
                return None
            out = [a + b for a in out for b in vals]
        return out
    return None


def static_targets() -> tuple[dict[str, set[str]], list[str]]:
    """{target: {file, ...}} for every student.call/function/module target and every attribute
    read on a module that student.module(...) returned; plus the call sites whose target is not a
    static string (checked by the in-process run below)."""
    found: dict[str, set[str]] = {}
    dynamic = []
    for f in SOURCES:
        tree = ast.parse(f.read_text())
        consts = _constants(tree)
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            modules: dict[str, str] = {}  # local name -> student module
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("call", "function", "module") and node.args
                        and isinstance(node.func.value, (ast.Name, ast.Call))):
                    # replay.call(student, "module.function", ...): the judge records and replays the call
                    replayed = isinstance(node.func.value, ast.Name) and node.func.value.id == "replay"
                    if replayed and len(node.args) < 2:
                        continue
                    vals = _values(node.args[1] if replayed else node.args[0], consts)
                    if vals is None:
                        dynamic.append(f"{f.name}:{node.lineno}")
                        continue
                    for v in vals:
                        found.setdefault(v, set()).add(f.name)
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "module"
                        and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                    vals = _values(node.value.args[0], consts)
                    if vals:
                        modules[node.targets[0].id] = vals[0]
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                        and not node.attr.startswith("__"):
                    found.setdefault(f"{modules[node.value.id]}.{node.attr}", set()).add(f.name)
    return found, dynamic


def test_every_static_target_is_in_the_api():
    found, _ = static_targets()
    assert len(found) >= 15, "the scan finds the tests' targets"
    unknown = {t: sorted(files) for t, files in found.items() if t not in TARGETS and t not in MODULES}
    assert not unknown, f"add these to autograder/student_api.py (or fix the test): {unknown}"


def test_every_target_used_in_a_real_run_is_in_the_api():
    """All public cases, run in this process on solutions/ (autograder.debug's LocalStudent, as
    `make debug` runs them), with every target recorded: this covers targets built at run time
    (f"{FN}.{fn}") that the static scan cannot read."""
    from autograder.debug import LocalStudent
    from autograder.engine.cases import CASES_MARK
    from autograder.engine.rubric import load_rubric

    used: set[str] = set()

    class Recording(LocalStudent):
        def call(self, target, *args, **kwargs):
            used.add(target)
            return super().call(target, *args, **kwargs)

    rubric = load_rubric()
    threads = torch.get_num_threads()
    ran = 0
    try:
        for f in sorted((ROOT / "autograder" / "tests").glob("test_part*.py")):
            part = int(f.stem.split("_")[1].removeprefix("part"))
            module = importlib.import_module(f"autograder.tests.{f.stem}")
            for name, fn in vars(module).items():
                marks = [m for m in getattr(fn, "pytestmark", []) if m.name == CASES_MARK] if name.startswith("test_") else []
                for case in marks[0].args if marks else []:
                    st = Recording(ROOT / "solutions", part, rubric.part(part).reachable_modules(), name)
                    worker = st._worker
                    orig_module, orig_function = worker.module, worker.function
                    worker.module = lambda n, _m=orig_module: (used.add(n), _m(n))[1]
                    worker.function = lambda t, _f=orig_function: (used.add(t), _f(t))[1]
                    fn(st, case)  # the solutions pass every public case in-process too (make debug's fidelity)
                    ran += 1
    finally:
        torch.set_num_threads(threads)
    assert ran > 30
    assert used - TARGETS - MODULES == set(), "add these to autograder/student_api.py"
    # every entry is reached by some test: directly, or (the methods) through student.module(...);
    # the kernel itself runs inside run_flash_kernel
    # (part 4's scenario swaps flash_backward's flash_forward for a correct one, by name)
    reached = used | set(static_targets()[0]) | {"flash_kernel.flash_forward_kernel", "flash_backward.flash_forward"}
    reached |= {t for t in TARGETS if t.count(".") == 2 and t.rsplit(".", 1)[0] in reached}  # members of a class used
    assert TARGETS - reached == set(), "entries no test uses: remove them from autograder/student_api.py"


def _params(obj, member: str | None) -> str:
    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        sig = inspect.signature(obj.forward)
        params = list(sig.parameters.values())[1:]  # no ctx
    elif isinstance(obj, property):
        return ""
    else:
        params = list(inspect.signature(obj).parameters.values())

    def show(p: inspect.Parameter) -> str:
        if p.default is inspect.Parameter.empty:
            return p.name
        d = p.default
        return f"{p.name}={d.__name__}" if inspect.isfunction(d) else f"{p.name}={d!r}"
    return "(" + ", ".join(show(p) for p in params) + ")"


@pytest.mark.parametrize("folder", ["solutions", "starter"])
@pytest.mark.parametrize("graded", API, ids=lambda g: g.target)
def test_each_entry_matches_the_code(graded, folder):
    module, *names = graded.target.split(".")
    obj = importlib.import_module(f"{folder}.{module}")
    for i, n in enumerate(names):
        obj = vars(obj)[n] if i == len(names) - 1 and isinstance(vars(obj).get(n), property) else getattr(obj, n)
    assert _params(obj, names[-1]) == graded.params, f"{folder}/{module}.py: {graded.target}{_params(obj, names[-1])}"
    assert PART_OF_MODULE[module] == graded.part


@pytest.mark.parametrize("graded", [g for g in API if g.implement], ids=lambda g: g.target)
def test_each_entry_is_in_its_part_of_the_handout(graded):
    module, *names = graded.target.split(".")
    page = ROOT / "docs" / "handout" / f"part{graded.part}_{module}.md"
    assert page.is_file(), page
    assert names[-1] in page.read_text(), f"{page.name} does not mention {names[-1]}"
