"""python -m instructor.redteam assemble DIR   (then: make autograde SUBMISSIONS=DIR)"""
import sys
from pathlib import Path

from autograder.grade import Parser, UsageError, run_cli, writable_folder

from . import assemble


def main(argv=None) -> int:
    ap = Parser(prog="python -m instructor.redteam")
    ap.add_argument("cmd", choices=["assemble"])
    ap.add_argument("dest", type=Path, help="an empty or new folder")
    a = ap.parse_args(argv)
    if a.dest.is_dir() and any(a.dest.iterdir()):
        raise UsageError(f"{a.dest} is not empty; choose a new folder")
    writable_folder(a.dest, "the corpus folder")  # before anything is written (one line if it cannot be)
    corpus = assemble(a.dest)
    print(f"{len(corpus)} submissions in {a.dest}: " + ", ".join(corpus))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
