"""Submission intake: take ONLY the graded files out of a student's folder or .zip.

A submission is one entry of the folder an instructor downloads from the LMS: a directory (a git
clone, an unpacked upload) or a .zip. Intake never extracts anything into the instructor's tree
and never follows a link: it walks the directory (or reads the zip's central directory), picks the
folder that holds the graded files, checks each of them, and writes clean copies into a fresh
destination folder that the grader (and its sandbox) sees instead of the original.

Rejected, each with a one-line reason shown in the student's feedback:
- a path that escapes the submission (absolute, or with `..`: a "zip slip");
- a symbolic or hard link, a device, a fifo (for a directory) or a link entry (for a zip);
- a graded file over `max_file_bytes`, not UTF-8 (a PEP 263 coding cookie other than utf-8
  included: the worker would decode the file by it, and the compiler's reading decides, so the bytes
  must compile to the code their UTF-8 text does; UTF-16 and UTF-32 are named as such), with NUL
  bytes, or not valid Python;
- a graded file that is ambiguous: a zip holding two members that name the same path (after
  '\\' -> '/', './' and '//' are normalised), or two folders with the graded files alike;
- a whole submission that is neither a directory nor a .zip, a corrupt or encrypted zip, or one
  with more than `max_entries` entries (counted from the zip's end record or while listing a
  folder, before anything else is read).
`take` never raises: anything unexpected becomes a rejection naming the exception's type (never a
traceback, never one of the instructor's paths).
The graded files are taken from the folder holding most of them; one that is not there but is
exactly once elsewhere is taken from there (a note says where), one that is elsewhere several times
is rejected as ambiguous. A zip member rejected where it is (two members for one path, encrypted,
too large) stands there: it counts in choosing the folder, and no other copy is graded in its place;
a link is no file and does not. `take(wanted=files_for_parts(parts))` takes and names only the
files of the parts graded; `take_for_parts` (what the channels use) also takes the graded files those
import, which their parts run. Other copies of graded files that lose the folder choice are named as
such (`passed_over`). Everything else (a conftest.py, a sitecustomize.py, a torch.py, notebooks, data)
is ignored and listed as such. A graded file that is absent, or rejected, costs that part its points.
"""
from __future__ import annotations

import codecs
import functools
import hashlib
import io
import os
import re
import shutil
import stat
import struct
import tokenize
import unicodedata
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from autograder.engine import sanitize

ROOT = Path(__file__).resolve().parent.parent
RUBRIC = ROOT / "autograder" / "rubric.toml"

# part -> graded file; the rubric (autograder/rubric.toml) is the authority when it names files.
DEFAULT_FILES: dict[int, str] = {
    1: "online_softmax.py",
    2: "flash_forward.py",
    3: "flash_kernel.py",
    4: "flash_backward.py",
    5: "kv_cache.py",
    6: "flash_decoding.py",
}

MAX_FILE_BYTES = 1 << 20  # a complete solution file is ~10 KB; 1 MiB leaves 100x headroom
MAX_ENTRIES = 10_000  # files + folders in one submission (a zip bomb has millions)
MAX_DEPTH = 12
BOM = b"\xef\xbb\xbf"  # Windows editors start UTF-8 files with it; intake drops it
PREFERRED = "starter"  # when two folders hold the graded files alike, the one named like the kit's folder wins
SKIP_DIRS = {".git", "__MACOSX", "__pycache__", ".ipynb_checkpoints", ".venv", "node_modules"}


def graded_files(rubric: Path = RUBRIC) -> dict[int, str]:
    """{part: its (first) graded file} from the rubric's [[part]] tables, else the six default names."""
    try:
        data = tomllib.loads(rubric.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return dict(DEFAULT_FILES)
    found: dict[int, str] = {}
    for part in data.get("part", []):
        try:
            files = [str(f) for f in part["files"]]
            found[int(part["number"])] = os.path.basename(files[0])
        except (KeyError, TypeError, ValueError, IndexError):
            return dict(DEFAULT_FILES)
    return found or dict(DEFAULT_FILES)


def files_for_parts(parts: list[int] | None, rubric: Path = RUBRIC) -> list[str]:
    """The graded files (and the files their tests use) of these parts, from the rubric, sorted;
    every graded file when `parts` is None. Intake takes, and talks about, only these."""
    if not parts:
        return all_graded_files(rubric)
    try:
        data = tomllib.loads(rubric.read_text(encoding="utf-8"))
        names = {os.path.basename(str(f)) for part in data.get("part", []) if int(part["number"]) in set(parts)
                 for f in [*part["files"], *part.get("uses", [])]}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError):
        names = {DEFAULT_FILES[n] for n in parts if n in DEFAULT_FILES}
    return sorted(n for n in names if n.endswith(".py"))


def all_graded_files(rubric: Path = RUBRIC) -> list[str]:
    """Every graded file name in the rubric (a part may have several), sorted."""
    try:
        data = tomllib.loads(rubric.read_text(encoding="utf-8"))
        names = {os.path.basename(str(f)) for part in data.get("part", []) for f in part["files"]}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        names = set()
    return sorted(n for n in names if n.endswith(".py")) or sorted(DEFAULT_FILES.values())


@dataclass
class Submission:
    """What intake made of one entry: a clean folder with the accepted graded files, and why the
    rest was left out. `error` set means the whole entry was rejected (every part scores 0)."""

    name: str  # student id: the entry's name, sanitised for use as a folder name
    source: str  # the entry as given (a path)
    dir: Path | None = None  # folder holding only the accepted graded files
    files: dict[str, str] = field(default_factory=dict)  # accepted file -> sha256 of its bytes
    missing: list[str] = field(default_factory=list)  # graded files not found
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (path in the submission, reason)
    ignored: list[str] = field(default_factory=list)  # other files (not graded), first 50
    ignored_count: int = 0
    error: str | None = None
    near: dict[str, str] = field(default_factory=dict)  # missing graded file -> the ignored file it resembles
    wanted: list[str] = field(default_factory=list)  # the graded files asked for (of the parts graded)
    elsewhere: dict[str, str] = field(default_factory=dict)  # graded file -> where it was taken from, when
    # it is not in the folder with the others (root)
    root: str = ""  # the folder the graded files were taken from ("." = the submission's top)
    passed_over: list[str] = field(default_factory=list)  # other copies of graded files, not graded (first 50)
    _ignored_names: list[str] = field(default_factory=list, repr=False)  # their base names (_ignore), for `near`

    @property
    def sha256(self) -> str:
        """Hash of the accepted graded files (names and bytes), independent of anything else."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name]}\n".encode())
        return h.hexdigest()

    def notes(self) -> list[str]:
        """One line per thing the student should know about intake (shown in the feedback)."""
        lines = []
        if self.error:
            lines.append(f"submission rejected: {self.error}")
        lines += [f"{path}: rejected: {why}" for path, why in self.rejected]
        where = "the top folder" if self.root in ("", ".") else f"'{self.root}'"
        lines += [f"{name}: taken from '{path}' (it is not in {where} with the other graded files)"
                  for name, path in sorted(self.elsewhere.items())]
        lines += [f"{name}: missing (that part scores 0)" + (
            f"; did you mean {self.near[name]!r}? graded files must have exactly these names"
            if name in self.near else "") for name in self.missing]
        if self.passed_over:
            shown = ", ".join(self.passed_over[:8]) + (" ..." if len(self.passed_over) > 8 else "")
            lines.append(f"graded the files in {where}; {len(self.passed_over)} other copy(ies) of graded files were "
                         f"NOT graded: {shown} (keep one copy of each, beside the others)")
        if self.ignored_count:
            shown = ", ".join(self.ignored[:8]) + (" ..." if self.ignored_count > 8 else "")
            lines.append(f"ignored {self.ignored_count} file(s) that are not graded: {shown}")
        return [sanitize.line(n, 600) for n in lines]

    def to_json(self) -> dict:
        return {
            "name": self.name, "source": self.source, "files": self.files, "missing": self.missing,
            "rejected": [list(r) for r in self.rejected], "ignored_count": self.ignored_count,
            "error": self.error, "sha256": self.sha256, "found_elsewhere": self.elsewhere,
            "passed_over": self.passed_over,
        }


def student_name(entry: Path) -> str:
    """A folder-safe student id from the entry name (`alice.zip` -> `alice`)."""
    name = entry.name[:-4] if entry.name.lower().endswith(".zip") else entry.name
    name = re.sub(r"[^A-Za-z0-9._@+-]", "_", name)
    # an id starts with a letter or digit: never with "+-@" (a spreadsheet formula, a CLI option)
    name = re.sub(r"^[._@+-]+", "", name).rstrip("._") or "submission"
    return name[:100]


def check_source(name: str, data: bytes, max_file_bytes: int = MAX_FILE_BYTES) -> str | None:
    """None if `data` is an acceptable graded Python file, else the reason it is not."""
    if len(data) > max_file_bytes:
        return f"file too large ({len(data)} bytes > {max_file_bytes})"
    wide = wide_encoding(data)
    if wide:
        return f"saved as {wide}: save it as UTF-8 (your editor's 'save with encoding')"
    if b"\0" in data:
        return "not a Python source file (contains NUL bytes)"
    try:
        data.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start}); save the file as UTF-8"
    why = _coding_cookie(data)
    if why:
        return why
    try:  # the bytes, as the worker's import reads them (the cookie was checked above)
        code = compile(data.removeprefix(BOM), name, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"not valid Python: {e.msg} (line {e.lineno}); fix the syntax error"
    except (ValueError, RecursionError, MemoryError) as e:  # pathological input
        return f"not valid Python ({type(e).__name__})"
    # The last word on the encoding is the compiler's: the bytes (decoded as the import will decode
    # them, by any declaration it finds) must compile to the same code as their UTF-8 text (where a
    # declaration means nothing). A declaration that the checks above did not see differs here.
    try:
        same = code == compile(data.removeprefix(BOM).decode("utf-8"), name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        same = False
    if not same:
        return ("Python reads it as other text than its UTF-8 (an encoding declaration on its first two lines?); "
                "save it as UTF-8 and declare utf-8 or nothing")
    return None


# UTF-32 before UTF-16: a UTF-32-LE byte order mark starts with UTF-16-LE's
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
              (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
_WIDE = (("utf-32-le", "UTF-32", 4), ("utf-32-be", "UTF-32", 4), ("utf-16-le", "UTF-16", 2), ("utf-16-be", "UTF-16", 2))


def wide_encoding(data: bytes) -> str | None:
    """"UTF-16" or "UTF-32" when `data` is text saved in that encoding (Windows editors, PowerShell's
    '>' redirection): by its byte order mark, or, without one, when it holds NUL bytes and decodes
    in that encoding to text without NUL characters, almost all printable. Else None."""
    for bom, name in _WIDE_BOMS:
        if data.startswith(bom):
            return name
    if b"\0" not in data:
        return None
    for codec, name, width in _WIDE:
        if len(data) % width:
            continue
        try:
            text = data.decode(codec)
        except UnicodeDecodeError:
            continue
        if "\0" not in text and sum(ch.isprintable() or ch in "\t\n\r\f" for ch in text) >= 0.95 * len(text):
            return name
    return None


# PEP 263's declaration; the compiler ends a line at "\r\n", "\r" or "\n" (tokenize only at "\n")
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_LINES = re.compile(rb"\r\n|\r|\n")
_BLANK_OR_COMMENT = re.compile(rb"^[ \t\f]*(#.*)?$", re.DOTALL)


def _coding_cookie(data: bytes) -> str | None:
    """Why the file's PEP 263 coding cookie is refused, or None. The worker's import decodes a file
    by its cookie, so a UTF-8 check of the bytes alone would grade other text than it checked.
    check_source backs this with the compiler itself (the same code from the bytes as from the text)."""
    try:
        enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:  # an unknown encoding, or a BOM with another cookie
        return f"bad coding declaration ({sanitize.line(e.msg, 80)}); remove it or declare utf-8"
    found = [enc]
    for i, line in enumerate(_LINES.split(data.removeprefix(BOM), 2)[:2]):
        m = _COOKIE.match(line)
        if m:
            found.append(m.group(1).decode("ascii", "replace"))
            break
        if i == 0 and not _BLANK_OR_COMMENT.match(line):  # the second line counts after a comment only
            break
    for name in found:
        try:
            known = codecs.lookup(name).name
        except LookupError:
            return f"bad coding declaration (unknown encoding {sanitize.line(name, 40)}); remove it or declare utf-8"
        if known not in ("utf-8", "utf-8-sig"):
            return (f"declares the encoding {sanitize.line(name, 40)} (a coding cookie); save it as UTF-8 and declare "
                    "utf-8 or nothing")
    return None


def _zip_name(name: str) -> str:
    """A member name with Windows separators ('a\\b.py', written by some Windows zip tools) as '/'."""
    return name.replace("\\", "/")


def _unsafe_member(name: str) -> str | None:
    """Why a zip member name (after _zip_name) may not be used, or None."""
    if "\0" in name:
        return "path contains a NUL character"
    p = PurePosixPath(name)
    if p.is_absolute() or re.match(r"^[A-Za-z]:", name):
        return "absolute path (escapes the submission folder)"
    if ".." in p.parts:
        return "path contains '..' (escapes the submission folder)"
    return None


def _describe(e: BaseException) -> str:
    """An exception as a short reason without paths: OSError's strerror, else type and message."""
    if isinstance(e, OSError):
        return sanitize.line(e.strerror or type(e).__name__, 100)
    return sanitize.line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, 160)


def _pick_root(candidates: dict[str, list[str]], wanted: set[str]) -> tuple[str | None, str | None]:
    """Choose the folder (posix relative path) that holds the graded files: the one with the most
    of them, then the shallowest. Returns (folder, error)."""
    by_dir: dict[str, set[str]] = {}
    for name, paths in candidates.items():
        for path in paths:
            parent = str(PurePosixPath(path).parent)
            by_dir.setdefault(parent, set()).add(name)
    if not by_dir:
        return None, None
    depth = lambda d: 0 if d == "." else d.count("/") + 1  # noqa: E731
    starter = lambda d: PurePosixPath(d).name == PREFERRED  # noqa: E731
    ranked = sorted(by_dir, key=lambda d: (-len(by_dir[d]), depth(d), not starter(d), d))
    best = ranked[0]
    if len(ranked) > 1:
        second = ranked[1]
        same = len(by_dir[second]) == len(by_dir[best]) and depth(second) == depth(best)
        if same and (not starter(best) or starter(second)):  # two starter/ folders: no winner either
            a, b = _apart(best, second)
            return None, (f"ambiguous: graded files in both '{a}' and '{b}'; "
                          f"submit one folder with the graded files (a folder named {PREFERRED}/ is preferred)")
    return best, None


def _apart(a: str, b: str) -> tuple[str, str]:
    """Two different names as a reason shows them: as they are, or escaped (ascii) where they would
    look alike (Unicode normalisation: 'café' composed and decomposed; characters sanitize drops)."""
    if unicodedata.normalize("NFKC", sanitize.name(a, 120)) == unicodedata.normalize("NFKC", sanitize.name(b, 120)):
        return ascii(a)[1:-1], ascii(b)[1:-1]
    return a, b


def take_for_parts(entry: Path, dest: Path, parts: list[int] | None, **kwargs) -> Submission:
    """take() the graded files of `parts` (files_for_parts) and every graded file those import, as the
    engine follows imports (autograder.engine.deps: a file that reaches others by a computed name
    brings them all): part 4 graded alone still runs flash_forward.py, which its file imports."""
    from autograder.engine import deps

    stems = {f.removesuffix(".py") for f in all_graded_files()}
    wanted = set(files_for_parts(parts))
    while True:
        sub = take(entry, dest, wanted=sorted(wanted), **kwargs)
        if parts is None or sub.error or sub.dir is None:
            return sub
        more: set[str] = set()
        for name in sub.files:
            try:
                text = (Path(sub.dir) / name).read_text(encoding="utf-8-sig")
                more |= stems if deps.dynamic(text) else deps.relative_imports(text, stems)
            except Exception:  # noqa: BLE001 -- a file it cannot analyse may import anything: take them all
                more |= stems
        more = {m + ".py" for m in more} - wanted
        if not more:
            return sub
        wanted |= more
        shutil.rmtree(dest, ignore_errors=True)


def take(entry: Path, dest: Path, *, wanted: list[str] | None = None,
         max_file_bytes: int = MAX_FILE_BYTES, max_entries: int = MAX_ENTRIES) -> Submission:
    """Validate one submission entry and copy its graded files into `dest` (created, must not exist).

    Never raises: problems land in the returned Submission. Whatever escapes the checks below (a
    zipfile or OS quirk nobody listed) rejects the entry with the exception's type, so that one
    hostile upload costs its own grade, never the batch."""
    wanted = sorted(set(wanted or all_graded_files()))
    sub = Submission(name=student_name(entry), source=str(entry), wanted=wanted)
    try:
        return _take(entry, dest, sub, wanted, max_file_bytes, max_entries)
    except Exception as e:  # noqa: BLE001 -- see above; MemoryError and RecursionError included
        sub.files, sub.dir, sub.missing = {}, None, []
        sub.error = f"intake could not read the submission ({type(e).__name__}); check that it is a plain folder or zip"
        return sub


def _take(entry: Path, dest: Path, sub: Submission, wanted: list[str], max_file_bytes: int,
          max_entries: int) -> Submission:
    # Every graded file takes part in choosing the folder they are taken from, also when only some
    # parts are graded (the same folder as a run of all parts); only the wanted ones are read, and
    # only they are named in the notes (missing, rejected, ...).
    known = set(all_graded_files()) | set(wanted)
    try:
        st = os.lstat(entry)
    except OSError as e:
        sub.error = f"cannot read the submission ({e.strerror})"
        return sub
    if stat.S_ISLNK(st.st_mode):
        sub.error = "the submission is a symbolic link"
        return sub
    try:
        if stat.S_ISDIR(st.st_mode):
            contents = _read_dir(entry, known, sub, max_file_bytes, max_entries)
        elif stat.S_ISREG(st.st_mode) and entry.name.lower().endswith(".zip"):
            contents = _read_zip(entry, known, sub, max_file_bytes, max_entries)
        else:
            sub.error = "not a folder or a .zip file"
            return sub
    except _Reject as e:
        sub.error = sanitize.line(e, 400)
        return sub
    except OSError as e:  # the entry changed while it was read, or cannot be read
        sub.error = f"cannot read the submission ({sanitize.line(e.strerror or type(e).__name__, 100)})"
        return sub

    dest.mkdir(parents=True)
    os.chmod(dest, 0o755)  # readable by the sandbox's unprivileged user
    for name in wanted:
        data = contents.get(name)
        if data is None:
            if not any(os.path.basename(p) == name for p, _ in sub.rejected):
                sub.missing.append(name)
            continue
        (dest / name).write_bytes(data)
        os.chmod(dest / name, 0o644)
        sub.files[name] = hashlib.sha256(data).hexdigest()
    for name in sub.missing:
        found = near_miss(name, sub._ignored_names)
        if found:
            sub.near[name] = sanitize.name(found, 120)
    sub.dir = dest
    return sub


def near_miss(wanted: str, names: list[str]) -> str | None:
    """The file name among `names` that is most likely `wanted` misnamed: the same name in another
    case, a download's copy ("flash_forward (1).py", "flash_forward-2.py"), an editor's extra
    extension ("flash_forward.py.txt"), or a close spelling; None if none is close."""
    import difflib

    stem = wanted.removesuffix(".py").casefold()
    def plain(n: str) -> str:
        n = n.casefold()
        n = re.sub(r"(\.py)?(\.(txt|bak|orig|save|swp|py~?))+$|~$", "", n)
        return re.sub(r"[\s_-]*(\(\d+\)|copy( \d+)?|-\d+|_\d+)$", "", n.removesuffix(".py"))
    exact = [n for n in names if n != wanted and plain(n) == stem]
    if exact:
        return sorted(exact)[0]
    close = difflib.get_close_matches(stem, [plain(n) for n in names], n=1, cutoff=0.85)
    return next((n for n in sorted(names) if close and plain(n) == close[0]), None)


class _Reject(Exception):
    """The whole submission is rejected (message = the reason)."""


def _read_dir(root: Path, known: set[str], sub: Submission, max_bytes: int, max_entries: int) -> dict[str, bytes]:
    candidates: dict[str, list[str]] = {}
    count = 0
    stack: list[tuple[Path, str, int]] = [(root, "", 0)]
    while stack:
        folder, rel, depth = stack.pop()
        entries = []
        try:
            with os.scandir(folder) as it:
                for e in it:  # counted while listing: a folder of a million files stops early
                    entries.append(e)
                    if count + len(entries) > max_entries:
                        raise _Reject(f"more than {max_entries} files and folders; submit only your code")
        except OSError as e:
            _reject(sub, rel or ".", f"cannot read folder ({_describe(e)})")
            continue
        count += len(entries)
        for e in sorted(entries, key=lambda e: e.name):
            path = f"{rel}/{e.name}" if rel else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except OSError as err:
                _reject(sub, path, f"cannot read ({_describe(err)})")
                continue
            if stat.S_ISLNK(st.st_mode):
                _reject(sub, path, "symbolic link (links are not followed)")
            elif stat.S_ISDIR(st.st_mode):
                if e.name in SKIP_DIRS:
                    continue
                if depth + 1 > MAX_DEPTH:
                    _reject(sub, path, f"folder nested deeper than {MAX_DEPTH} levels")
                    continue
                stack.append((Path(e.path), path, depth + 1))
            elif not stat.S_ISREG(st.st_mode):
                _reject(sub, path, "not a regular file (device, fifo or socket)")
            elif e.name in known:
                if st.st_nlink > 1:
                    _reject(sub, path, "hard link (copy the file instead)")
                else:
                    candidates.setdefault(e.name, []).append(path)
            else:
                _ignore(sub, path)
    return _collect(candidates, known, sub, max_bytes, lambda p: _read_capped(root / p, max_bytes))


def _read_capped(path: Path, max_bytes: int) -> bytes:
    # O_NOFOLLOW: the file was checked with lstat, but could be swapped for a link since then
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes + 1)


EOCD = struct.Struct("<4s4H2LH")  # end of central directory: signature, disks, entries here, entries, size, offset
ZIP64_LOCATOR = struct.Struct("<4sLQL")
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
CD_ENTRY_MAX_BYTES = 1024  # an honest central directory spends ~100 bytes per entry


def _zip_directory_size(path: Path) -> tuple[int, int] | None:
    """(entries, central directory bytes) from the zip's end record, read from the file's last
    64 KiB before the central directory is parsed (a zip bomb's directory may hold millions of
    entries); None when no end record is found (zipfile then says why)."""
    with open(path, "rb", buffering=0) as f:
        size = f.seek(0, os.SEEK_END)
        tail_at = max(0, size - (EOCD.size + 0xFFFF))
        f.seek(tail_at)
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < EOCD.size:
            return None
        _, _, _, _, entries, cd_size, _, _ = EOCD.unpack_from(tail, at)
        loc = at - ZIP64_LOCATOR.size
        if loc >= 0 and tail[loc:loc + 4] == b"PK\x06\x07":
            _, _, eocd64_at, _ = ZIP64_LOCATOR.unpack_from(tail, loc)
            f.seek(min(eocd64_at, size))
            rec = f.read(ZIP64_EOCD.size)
            if len(rec) == ZIP64_EOCD.size and rec[:4] == b"PK\x06\x06":
                fields = ZIP64_EOCD.unpack(rec)
                entries, cd_size = max(entries, fields[7]), max(cd_size, fields[8])
        return entries, cd_size


def _member_path(name: str) -> str:
    """A member's path as intake uses it: '/' separators, no '.' or empty components. Two members
    that normalise alike name the same file (which of them would be graded is ambiguous)."""
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def _read_zip(path: Path, known: set[str], sub: Submission, max_bytes: int, max_entries: int) -> dict[str, bytes]:
    counted = _zip_directory_size(path)
    if counted and (counted[0] > max_entries or counted[1] > max_entries * CD_ENTRY_MAX_BYTES):
        raise _Reject(f"zip has {counted[0]} entries in a {counted[1]}-byte directory (more than {max_entries} "
                      "entries allowed); submit only your code")
    try:
        zf = zipfile.ZipFile(path)
    except Exception as e:  # noqa: BLE001 -- BadZipFile, OSError, and the rest (NotImplementedError: a version > 6.3)
        raise _Reject(f"not a readable zip file ({_describe(e)})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > max_entries:
            raise _Reject(f"zip has {len(infos)} entries (more than {max_entries}); submit only your code")
        graded: dict[str, list[zipfile.ZipInfo]] = {}  # normalised path -> its members
        candidates: dict[str, list[str]] = {}
        blocked: set[str] = set()  # graded files rejected where they are (_stands)
        for info in infos:
            name = _zip_name(info.filename)
            why = _unsafe_member(name)
            if why:
                _reject(sub, info.filename, why)
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                _reject(sub, name, "symbolic link entry (links are not followed)")
                continue
            if name.endswith("/") or stat.S_ISDIR(info.external_attr >> 16):
                continue
            norm = _member_path(name)
            if not norm:  # "" or ".": zipfile's own is_dir() would fail on the first
                _reject(sub, info.filename, "member has no file name")
                continue
            parts = norm.split("/")
            if any(p in SKIP_DIRS for p in parts[:-1]):
                continue
            if parts[-1] in known:
                graded.setdefault(norm, []).append(info)
            else:
                _ignore(sub, name)
        members: dict[str, zipfile.ZipInfo] = {}
        for norm, found in sorted(graded.items()):
            info = found[0]
            why = None
            if len(found) > 1:  # zipfile would silently read the last one: refuse to guess
                why = (f"ambiguous: the zip holds {len(found)} members for this path (after normalising '\\', './' "
                       "and '//'); zip one copy of each file")
            elif info.flag_bits & 0x1:
                why = "encrypted zip entry"
            elif info.file_size > max_bytes:
                why = f"file too large ({info.file_size} bytes > {max_bytes})"
            if why:
                _reject(sub, norm, why)
                _stands(candidates, blocked, norm.rsplit("/", 1)[-1], norm)
            else:
                candidates.setdefault(norm.rsplit("/", 1)[-1], []).append(norm)
                members[norm] = info

        def read(p: str) -> bytes:
            with zf.open(members[p]) as f:  # read at most max_bytes+1: the header's size may lie
                return f.read(max_bytes + 1)

        try:
            return _collect(candidates, known, sub, max_bytes, read, blocked)
        except _Reject:  # the submission's own reason (ambiguous folders): not a corrupt zip
            raise
        except Exception as e:  # noqa: BLE001 -- BadZipFile (a bad CRC), zlib.error, EOFError, ...
            raise _Reject(f"corrupt zip file ({_describe(e)})") from None


def _ignore(sub: Submission, path: str) -> None:
    sub.ignored_count += 1
    if len(sub._ignored_names) < 2000:
        sub._ignored_names.append(path.rsplit("/", 1)[-1])
    if len(sub.ignored) < 50:
        sub.ignored.append(sanitize.name(path, 200))


def _reject(sub: Submission, path: str, why: str) -> None:
    """Record a rejected path; the name is the submission's choice (any bytes): sanitized here. A
    graded file of a part that is not graded now is not the student's concern in this run: left out."""
    base = _zip_name(path).rstrip("/").rsplit("/", 1)[-1]
    if sub.wanted and base not in sub.wanted and base in _graded_names():
        return
    sub.rejected.append((sanitize.name(path, 200), sanitize.line(why, 300)))


@functools.lru_cache(maxsize=1)
def _graded_names() -> frozenset[str]:
    return frozenset(all_graded_files())


def _stands(candidates: dict[str, list[str]], blocked: set[str], name: str, path: str) -> None:
    """A zip member that is a graded file but rejected where it is (two members for one path, an
    encrypted or too large one) still stands there: it counts where the student put it when the
    folder is chosen, and when it is the copy that would be graded the file stays rejected; another
    copy elsewhere (a backup, maybe another version) is not graded in its place. A link or a device
    is no file: the file is looked for as if it were not there."""
    candidates.setdefault(name, []).append(path)
    blocked.add(path)


def _collect(candidates: dict[str, list[str]], known: set[str], sub: Submission, max_bytes: int, read,
             blocked: set[str] = frozenset()) -> dict[str, bytes]:
    """Read the wanted graded files from the folder that holds most graded files (_pick_root). A
    wanted file that is not there but is exactly once elsewhere in the submission is taken from
    there (the note says where); one that is elsewhere several times is rejected as ambiguous,
    naming the copies: never "missing" when the student did submit it. A copy in `blocked` was
    rejected already (_stands): chosen, it leaves the file rejected."""
    root, error = _pick_root(candidates, known)
    if error:
        raise _Reject(error)
    sub.root = sanitize.name(root or ".", 200)
    out: dict[str, bytes] = {}
    wanted = set(sub.wanted or known)
    for name, paths in sorted(candidates.items()):
        if name not in wanted:
            continue
        here = [p for p in sorted(paths) if str(PurePosixPath(p).parent) == root]
        there = [p for p in sorted(paths) if str(PurePosixPath(p).parent) != root]
        if here:
            for p in there:
                if p not in blocked and len(sub.passed_over) < 50:  # (a rejected one is listed as rejected already)
                    sub.passed_over.append(sanitize.name(p, 200))  # a second copy elsewhere: named, not graded
            p = here[0]
        elif len(there) == 1:
            p = there[0]
        else:
            shown = ", ".join(f"'{sanitize.name(x, 120)}'" for x in there[:4]) + (" ..." if len(there) > 4 else "")
            where = "the top folder" if root in (None, ".") else f"'{root}'"
            _reject(sub, name, f"not in {where} with the other graded files, and {len(there)} copies elsewhere "
                               f"({shown}): which one to grade is ambiguous; keep one, beside the other graded files")
            continue
        if p in blocked:
            continue
        try:
            data = read(p)
        except OSError as e:
            _reject(sub, p, f"cannot read ({_describe(e)})")
            continue
        why = check_source(name, data, max_bytes)
        if why:
            _reject(sub, p, why)
        else:
            out[name] = data.removeprefix(BOM)
            if p in there:
                sub.elsewhere[name] = sanitize.name(p, 200)
    return out
