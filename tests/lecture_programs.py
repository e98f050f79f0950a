"""How the tests run the lecture programs of code/lecture05/: as a student would (from the repository
root, no PYTHONPATH, a fixed terminal width), or imported as a module to call their functions."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "code" / "lecture05"


def run_program(name: str, *args: str, timeout: float = 300, root: Path = ROOT, env: dict | None = None) -> str:
    """Run <root>/code/lecture05/<name> (root: this repository, or a student release) and return its
    stdout; fail with its stderr's tail if it fails. env: extra environment variables."""
    proc = subprocess.run([sys.executable, str(root / "code" / "lecture05" / name), *args], cwd=root,
                          capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", **(env or {})})
    assert proc.returncode == 0, f"{name} {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def load_program(name: str) -> ModuleType:
    """Import code/lecture05/<name> as a module (its demos run only under __main__)."""
    spec = importlib.util.spec_from_file_location("lecture05_" + Path(name).stem.split("_", 1)[1], PROGRAMS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
