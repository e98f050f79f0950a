"""Where the engine lives (the engine folder, the autograder package, the repository root), and the
grader's own files by path relative to the repository root, named once here.

WORKER_TREES: what a worker imports besides its submission copy and the interpreter: the course
package, the scenarios and the engine's worker files. The worker's private import root links them
(processes.write_lib; of the engine it copies only the worker's files), its sandbox binds them
read-only (processes._worker_paths), and the sandbox self-test probes the same binds
(instructor/sandbox.py).

JUDGE_TREES: what the judge imports to grade: the worker's trees, the checks with their public
cases, and the rubric. The instructor's Gradescope zip holds these as the student release ships
them, plus the instructor-only code that grades (instructor/gradescope: GRADING_CODE).
"""
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parent
AUTOGRADER_DIR = ENGINE_DIR.parent
REPO_ROOT = AUTOGRADER_DIR.parent

WORKER_TREES = ("course", "autograder/scenarios", "autograder/engine")
JUDGE_TREES = ("autograder/__init__.py", "autograder/rubric.toml", "autograder/tests", *WORKER_TREES)


def worker_trees(root: Path = REPO_ROOT) -> list[Path]:
    """WORKER_TREES under `root`, in that order."""
    return [root / rel for rel in WORKER_TREES]
