"""python -m instructor.gradescope build --out ZIP | run [--root /autograder]"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Sequence

from .. import intake
from ..batch import UID_BASE, environment, make_view
from ..sandbox import detect
from .results import results_json

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent

# What the autograder zip holds (paths relative to the repository; folders recursively). Gradescope
# unpacks it into /autograder/source. No solutions: the engine grades the submission alone.
CONTENTS = [
    "requirements.txt", "requirements.lock",
    "course",
    "autograder/__init__.py", "autograder/rubric.toml", "autograder/engine", "autograder/scenarios",
    "autograder/tests",  # the checks, their public cases, conftest
    "instructor/__init__.py", "instructor/hidden_tests",  # the hidden cases
    "instructor/intake.py", "instructor/sandbox.py", "instructor/batch.py", "instructor/gradescope",
]
SKIP = {"__pycache__", ".pytest_cache", ".hypothesis"}
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # reproducible zip: same inputs, same bytes


def _files(rel: str) -> list[Path]:
    p = ROOT / rel
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise SystemExit(f"error: {p} is missing; the Gradescope zip needs it")
    return sorted(f for f in p.rglob("*") if f.is_file() and not SKIP & set(f.relative_to(ROOT).parts)
                  and f.suffix not in (".pyc", ".pyo"))


def build(out: Path) -> Path:
    """Write the autograder zip: setup.sh and run_autograder at its root, then the source tree."""
    out.parent.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[str, bytes, int]] = [
        ("setup.sh", (HERE / "setup.sh").read_bytes(), 0o755),
        ("run_autograder", (HERE / "run_autograder").read_bytes(), 0o755),
    ]
    for rel in CONTENTS:
        for f in _files(rel):
            entries.append((f.relative_to(ROOT).as_posix(), f.read_bytes(), 0o644))
    tmp = out.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in sorted(entries, key=lambda e: e[0]):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, out)
    return out


def run(root: Path, parts: Sequence[int] | None = None) -> dict:
    """Grade root/submission; write root/results/results.json (always, even when grading fails)."""
    t0 = time.perf_counter()
    results_dir = root / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    try:
        from autograder.engine import grade

        box = detect()
        info = box.describe()
        with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
            sub = intake.take(root / "submission", Path(tmp) / "files")
            report = None
            if sub.files and not sub.error:
                report = grade(sub.dir, parts=parts, test_sets=("public", "hidden"),
                               worker_prefix=box.with_uid(UID_BASE))
            view, _ = make_view("submission", sub, report, None, info, environment(), parts)
        result = results_json(view, notes=view["intake"]["notes"], execution_time=time.perf_counter() - t0)
        print(f"sandbox: {info['sandbox']}; process limit: {info['process_limit']}")  # stdout: hidden from students
    except Exception:  # noqa: BLE001 -- students must always get a results.json
        traceback.print_exc(file=sys.stdout)
        result = {"score": 0.0, "output": "The autograder itself failed on this submission; your instructor has "
                  "the details (this is not a problem with your code's grade).", "visibility": "visible",
                  "stdout_visibility": "hidden", "tests": []}
    (results_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m instructor.gradescope")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the autograder zip to upload to Gradescope")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "gradescope-autograder.zip")
    r = sub.add_parser("run", help="grade one submission the way Gradescope does (called by run_autograder)")
    r.add_argument("--root", type=Path, default=Path(os.environ.get("GRADESCOPE_ROOT", "/autograder")))
    r.add_argument("--parts", default=os.environ.get("AUTOGRADER_PARTS") or None,
                   help="comma-separated parts (default: all; for checking the set-up only)")
    a = ap.parse_args(argv)
    if a.cmd == "build":
        print(build(a.out))
        return 0
    parts = [int(x) for x in a.parts.split(",")] if a.parts else None
    result = run(a.root, parts)
    print(f"score {result['score']:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
