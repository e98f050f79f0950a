"""The submission copy: ONLY the graded files of a submission, in a fresh private package."""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .worker import PACKAGE
from .processes import write_lib

MAX_SOURCE_BYTES = 1 << 20  # a graded file larger than 1 MiB is refused




@dataclass
class SubmissionCopy:
    root: Path  # private temp folder
    package_dir: Path  # root/sub/<PACKAGE>: the graded files only
    lib_dir: Path  # root/lib: worker code + links to course and autograder.scenarios (a direct worker's)
    present: dict[str, str]  # graded file name -> source text
    problems: dict[str, str]  # graded file name -> why it was not taken
    sha256: str

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def prepare_submission(impl_dir: Path, graded_files: Sequence[str], workdir: Path) -> SubmissionCopy:
    """Copy ONLY the graded files of impl_dir into a fresh private package.

    Anything else the submission brings (conftest.py, pytest.ini, sitecustomize.py, numpy.py, an
    __init__.py with code in it) is never copied, so nothing else of it can run anywhere. The
    package's __init__.py is written here, empty, so one broken file cannot break the others.
    """
    impl_dir = Path(impl_dir)
    package_dir = workdir / "sub" / PACKAGE
    package_dir.mkdir(parents=True)
    (package_dir / "__init__.py").write_text('"""The graded files of one submission (a private copy)."""\n')
    present: dict[str, str] = {}
    problems: dict[str, str] = {}
    digest = hashlib.sha256()
    for name in sorted(graded_files):
        src = impl_dir / name
        if src.is_symlink():
            problems[name] = f"{name} is a symbolic link; submit the file itself"
        elif not src.is_file():
            problems[name] = f"{name} is missing from the submission"
        elif src.stat().st_size > MAX_SOURCE_BYTES:
            problems[name] = f"{name} is larger than {MAX_SOURCE_BYTES >> 20} MiB"
        else:
            raw = src.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                problems[name] = f"{name} is not UTF-8 text"
                continue
            (package_dir / name).write_bytes(raw)
            present[name] = text
            digest.update(name.encode() + b"\0" + raw + b"\0")
    lib_dir = workdir / "lib"
    write_lib(lib_dir)  # a directly started worker's import root (fork servers have their own)
    return SubmissionCopy(workdir, package_dir, lib_dir, present, problems, digest.hexdigest())
