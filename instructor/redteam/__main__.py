"""python -m instructor.redteam assemble DIR   (then: make autograde SUBMISSIONS=DIR)"""
import argparse
import sys
from pathlib import Path

from . import assemble

ap = argparse.ArgumentParser(prog="python -m instructor.redteam")
ap.add_argument("cmd", choices=["assemble"])
ap.add_argument("dest", type=Path, help="an empty or new folder")
a = ap.parse_args()
if a.dest.exists() and any(a.dest.iterdir()):
    sys.exit(f"error: {a.dest} is not empty; choose a new folder")
corpus = assemble(a.dest)
print(f"{len(corpus)} submissions in {a.dest}: " + ", ".join(corpus))
