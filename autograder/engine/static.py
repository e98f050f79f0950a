"""Static rules on the submitted source text, checked in the judge with `ast` (never executed).

The dispatch-level tracer cannot see numpy, and some code is plainly aimed at the harness rather
than at the assignment. A graded file that breaks a rule is refused: every test of its part fails
with the one-line reason. The rules are deliberately few and name-based; anything subtler is the
job of the tracer and of the worker isolation.
"""
from __future__ import annotations

import ast

SDPA = "scaled_dot_product_attention"
TRACER_NAMES = {"_python_dispatch", "TorchDispatchMode", "TorchFunctionMode", "__torch_dispatch__",
                "__torch_function__", "flop_counter", "FlopCounterMode"}
NUMPY_WHY = "the graded PyTorch parts must use torch only (the grader traces torch ops and cannot see numpy)"


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def violations(source: str, filename: str, *, numpy_allowed: bool) -> list[str]:
    """Each violation as 'file:line: what; why'. A file that does not parse has none here: the
    worker's import reports the SyntaxError itself, with its line."""
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[int, str]] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append((getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and _dotted(node.func) in {"__import__", "importlib.import_module",
                                                                    "import_module", "getattr"}:
            modules = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for m in modules:
            root = m.split(".")[0]
            if root == "numpy" and not numpy_allowed:
                flag(node, f"imports numpy; {NUMPY_WHY}")
            elif root == "autograder":
                flag(node, "imports the grader (autograder); graded files may import torch, the standard "
                           "library, course and each other")
            elif root == "builtins":
                flag(node, "imports builtins; patching builtins is not allowed")
            elif root == "ctypes":
                flag(node, "imports ctypes; graded files may not call native code")
            elif SDPA in m:
                flag(node, f"uses {SDPA} (SDPA); write the attention yourself")
            elif any(t in m.split(".") for t in TRACER_NAMES):
                flag(node, "touches torch's dispatch/flop-counting machinery, which the grader uses to trace calls")
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            dotted = _dotted(node)
            if SDPA in name:
                flag(node, f"uses {SDPA} (SDPA); write the attention yourself")
            elif name in TRACER_NAMES:
                flag(node, f"uses {name}, part of the machinery the grader uses to trace calls")
            elif dotted == "sys.modules":
                flag(node, "manipulates sys.modules")
            elif name == "__builtins__":
                flag(node, "touches __builtins__; patching builtins is not allowed")
            elif not numpy_allowed and (dotted.startswith("np.") or name in ("numpy", "from_numpy")):
                flag(node, f"uses numpy ({dotted or name}); {NUMPY_WHY}")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                root = _dotted(t).split(".")[0] if isinstance(t, ast.Attribute) else ""
                if root in ("torch", "math", "sys", "os", "course", "F"):
                    flag(node, f"assigns to {_dotted(t)}; monkeypatching libraries is not allowed")
        if isinstance(node, ast.Call) and _dotted(node.func) in ("setattr", "delattr") and node.args:
            root = _dotted(node.args[0]).split(".")[0]
            if root in ("torch", "math", "sys", "os", "course", "F", "builtins"):
                flag(node, f"calls {_dotted(node.func)} on {_dotted(node.args[0])}; monkeypatching libraries is not allowed")
    seen: set[tuple[int, str]] = set()
    out = []
    for line, what in sorted(found):
        if (line, what) not in seen:
            seen.add((line, what))
            out.append(f"{filename}:{line}: {what}")
    return out


def refusal(violation_list: list[str]) -> str:
    """One line for the feedback: the first violation, and how many more there are."""
    more = f" (and {len(violation_list) - 1} more)" if len(violation_list) > 1 else ""
    return f"refused: {violation_list[0]}{more}"
