"""Where the engine lives: the engine folder, the autograder package, the repository root."""
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parent
AUTOGRADER_DIR = ENGINE_DIR.parent
REPO_ROOT = AUTOGRADER_DIR.parent

