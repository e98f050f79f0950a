"""The submission copy: ONLY the graded files of a submission, in a fresh private package."""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import sanitize
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

    def code_for(self, files: Iterable[str]) -> Path:
        """A folder that holds the package with only `files` (those present): what one part's workers
        import from. A part reaches the graded files deps.reach finds, and its reused result
        (reuse.part_key) is keyed on exactly those; a worker that had the other files too could run
        or read one by a name no static analysis sees (typing.ForwardRef evaluates a string, and the
        list of such gadgets has no end). So the key is not a guess of what the code can read: it is
        what the code is given. Made once per distinct set, 0700 until a sandbox opens it to its
        worker; the copy's own package (package_dir) is the judge's and no worker's."""
        return self._code(sorted(set(files) & set(self.present)))

    def _code(self, names: list[str]) -> Path:
        key = hashlib.sha256("\0".join(names).encode()).hexdigest()[:16]
        code = self.root / f"code-{key}"
        if not code.is_dir():
            package = code / PACKAGE
            code.mkdir(mode=0o700)
            package.mkdir(mode=0o700)
            shutil.copyfile(self.package_dir / "__init__.py", package / "__init__.py")
            for name in names:
                shutil.copyfile(self.package_dir / name, package / name)
        return code


def prepare_submission(impl_dir: Path, graded_files: Sequence[str], workdir: Path,
                       not_taken: dict[str, str] | None = None) -> SubmissionCopy:
    """Copy ONLY the graded files of impl_dir into a fresh private package. not_taken: why a channel's
    intake left a graded file out (its reason replaces "missing").

    Anything else the submission brings (conftest.py, pytest.ini, sitecustomize.py, numpy.py, an
    __init__.py with code in it) is never copied, so nothing else of it can run anywhere. The
    package's __init__.py is written here, empty, so one broken file cannot break the others.
    """
    impl_dir = Path(impl_dir)
    # The copy is the judge's: no worker reads it (each reads a code folder of its part's files,
    # SubmissionCopy.code_for). The root is traversable, not listable (a uid-mode worker reaches its
    # own folders below it); the copy's folder stays 0700.
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o711)
    package_dir = workdir / "sub" / PACKAGE
    (workdir / "sub").mkdir(mode=0o700)
    package_dir.mkdir(mode=0o700)
    (package_dir / "__init__.py").write_text('"""The graded files of one submission (a private copy)."""\n')
    present: dict[str, str] = {}
    problems: dict[str, str] = {}
    digest = hashlib.sha256()
    for name in sorted(graded_files):
        src = impl_dir / name
        if src.is_symlink():
            problems[name] = f"{name} is a symbolic link; submit the file itself"
        elif not src.is_file():
            why = (not_taken or {}).get(name)
            problems[name] = (f"{name} was not accepted: {sanitize.line(why, 200)}" if why
                              else f"{name} is missing from the submission")
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
