"""Intake never raises, and refuses what the worker would read differently from what it checked.

- A seeded mutation fuzz of a valid zip (the tester's 4 000 mutations found 29 escaping exceptions):
  every mutant gives a Submission, never an exception, and a one-line reason without paths.
- The causes it found: a member named '.' or '', a member whose "version needed" zipfile refuses.
- Any unexpected exception inside intake becomes a rejection naming its type (the general guard).
- The entry bound is checked from the zip's end record before the central directory is parsed,
  and while a folder is listed.
- A PEP 263 coding cookie other than utf-8; members that name one path twice (after normalising);
  two starter/ folders alike.
"""
from __future__ import annotations

import os
import random
import struct
import zipfile
import zlib
from pathlib import Path

import pytest

from instructor import intake

FILES = intake.all_graded_files()


def _rawzip(path: Path, members: list[tuple[bytes, bytes]], version_needed: int = 20,
            claimed_entries: int | None = None) -> Path:
    """A stored zip written by hand: any member name, any "version needed", any entry count."""
    out, cd = bytearray(), bytearray()
    for name, data in members:
        crc, off = zlib.crc32(data), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, version_needed, 0, 0, 0, 0, crc, len(data), len(data),
                           len(name), 0) + name + data
        cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, version_needed, 0, 0, 0, 0, crc, len(data),
                          len(data), len(name), 0, 0, 0, 0, 0, off) + name
    n = len(members) if claimed_entries is None else claimed_entries
    out += cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n & 0xFFFF, n & 0xFFFF, len(cd), len(out), 0)
    path.write_bytes(bytes(out))
    return path


def _good(name: str = "x") -> list[tuple[bytes, bytes]]:
    return [(f"{name}/{f}".encode(), f"# {f}\nx = 1\n".encode()) for f in FILES]


def _one_line_without_paths(text: str, *paths: Path) -> None:
    assert "\n" not in text and "Traceback" not in text
    for p in paths:
        assert str(p) not in text and str(p.parent) not in text, text


def test_a_mutation_fuzz_of_a_valid_zip_never_raises(tmp_path):
    src = _rawzip(tmp_path / "valid.zip", _good()).read_bytes()
    with zipfile.ZipFile(tmp_path / "deflated.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in _good():
            z.writestr(name.decode(), data * 20)
    sources = [src, (tmp_path / "deflated.zip").read_bytes()]
    cd0 = [s.find(b"PK\x01\x02") for s in sources]
    rng = random.Random(20240601)
    outcomes = {"accepted": 0, "rejected": 0}
    for it in range(1200):
        k = it % 2
        b = bytearray(sources[k])
        for _ in range(rng.randint(1, 6)):
            where = rng.choice(["cd", "head", "any"])
            lo = cd0[k] if where == "cd" else 0
            hi = min(len(b), 200) if where == "head" else len(b)
            b[rng.randrange(lo, hi)] = rng.randrange(256)
        p = tmp_path / f"m{it}.zip"
        p.write_bytes(b)
        sub = intake.take(p, tmp_path / f"o{it}")  # raises nothing: that is the test
        outcomes["rejected" if sub.error else "accepted"] += 1
        for line in sub.notes():
            _one_line_without_paths(line, p)
        p.unlink()
    assert outcomes["rejected"] > 50 and outcomes["accepted"] > 50, outcomes  # the fuzz reaches both sides


def test_the_members_the_fuzz_found_are_rejected_not_raised(tmp_path):
    dot = intake.take(_rawzip(tmp_path / "dot.zip", _good() + [(b".", b"x")]), tmp_path / "d1")
    assert dot.error is None and sorted(dot.files) == sorted(FILES)
    assert (".", "member has no file name") in dot.rejected
    empty = intake.take(_rawzip(tmp_path / "empty.zip", _good() + [(b"", b"x")]), tmp_path / "d2")
    assert empty.error is None and any(why == "member has no file name" for _, why in empty.rejected)
    v64 = intake.take(_rawzip(tmp_path / "v64.zip", _good(), version_needed=64), tmp_path / "d3")
    assert "not a readable zip file" in v64.error and "NotImplementedError" in v64.error


def test_any_unexpected_exception_becomes_a_rejection_naming_its_type(tmp_path, monkeypatch):
    folder = tmp_path / "alice"
    folder.mkdir()
    (folder / FILES[0]).write_text("x = 1\n")

    def boom(*a, **k):
        raise KeyError(str(tmp_path / "secret" / "path"))

    monkeypatch.setattr(intake, "_collect", boom)
    sub = intake.take(folder, tmp_path / "dest")
    assert sub.error and "KeyError" in sub.error and sub.files == {} and sub.dir is None
    _one_line_without_paths(sub.error, tmp_path / "secret" / "path")


def test_an_unreadable_zip_names_no_path(tmp_path, monkeypatch):
    z = _rawzip(tmp_path / "unread.zip", _good())

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(intake.zipfile, "ZipFile", denied)
    sub = intake.take(z, tmp_path / "dest")
    assert sub.error == "not a readable zip file (Permission denied)"


def test_the_entry_bound_is_checked_before_the_central_directory_is_parsed(tmp_path, monkeypatch):
    z = _rawzip(tmp_path / "bomb.zip", _good(), claimed_entries=60000)
    parsed = []
    monkeypatch.setattr(intake.zipfile, "ZipFile", lambda *a, **k: parsed.append(a) or 1 / 0)
    sub = intake.take(z, tmp_path / "dest")
    assert "60000 entries" in sub.error and parsed == []
    assert "more than 10000" in sub.error


def test_a_huge_folder_is_refused_while_it_is_listed(tmp_path, monkeypatch):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(40):
        (folder / f"f{i}.txt").write_text("x")
    seen = []
    real = os.scandir

    class Counting:
        def __init__(self, path):
            self.it = real(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.it.close()

        def __iter__(self):
            for e in self.it:
                seen.append(e.name)
                yield e

    monkeypatch.setattr(intake.os, "scandir", Counting)
    sub = intake.take(folder, tmp_path / "dest", max_entries=10)
    assert "more than 10 files" in sub.error and len(seen) == 11  # stopped at the first one too many


@pytest.mark.parametrize("cookie, accepted", [
    (b"# -*- coding: utf-8 -*-\n", True), (b"# coding=UTF8\n", True), (b"", True),
    (b"# coding: latin-1\n", False), (b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n", False),
    (b"# coding: bogus\n", False), (b"# coding: utf-16\n", False)])
def test_a_coding_cookie_other_than_utf8_is_rejected(tmp_path, cookie, accepted):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / FILES[0]).write_bytes(cookie + "s = 'caf\u00e9'\n".encode())
    sub = intake.take(folder, tmp_path / "dest")
    assert (FILES[0] in sub.files) is accepted, sub.rejected
    if not accepted:
        (path, why), = sub.rejected
        assert path == FILES[0] and ("encoding" in why or "coding" in why)


@pytest.mark.parametrize("second", [b"a/x/F", b"a/./x/F", b"a\\x\\F", b"a//x/F", b"./a/x/F"])
def test_two_members_for_one_graded_path_are_ambiguous(tmp_path, second):
    f = FILES[0].encode()
    members = [(b"a/x/" + f, b"x = 1\n"), (second.replace(b"F", f), b"x = 2\n"), (b"a/x/" + FILES[1].encode(), b"y = 1\n")]
    sub = intake.take(_rawzip(tmp_path / "dup.zip", members), tmp_path / "dest")
    assert FILES[0] not in sub.files and FILES[1] in sub.files  # the other file is still graded
    assert any(p == "a/x/" + FILES[0] and why.startswith("ambiguous") for p, why in sub.rejected), sub.rejected
    assert FILES[0] not in sub.missing  # it is there, rejected: not "missing"


def test_two_starter_folders_alike_are_ambiguous(tmp_path):
    for side in ("a", "b"):
        (tmp_path / "s" / side / "starter").mkdir(parents=True)
        for f in FILES:
            (tmp_path / "s" / side / "starter" / f).write_text(f"# {side}\n")
    sub = intake.take(tmp_path / "s", tmp_path / "dest")
    assert sub.error and sub.error.startswith("ambiguous") and "a/starter" in sub.error and "b/starter" in sub.error


@pytest.mark.parametrize("upload, sid", [("+cmd", "cmd"), ("-2+3", "2+3"), ("@SUM(1)", "SUM_1_"),
                                         ("=HYPERLINK(x)", "HYPERLINK_x_"), ("alice.zip", "alice"), ("..", "submission")])
def test_student_ids_start_with_a_letter_or_digit(upload, sid):
    assert intake.student_name(Path(upload)).rstrip("_") == sid.rstrip("_")


# ---------------------------------------------------------------------------------------------
# a graded file beside the chosen folder; only the parts graded; UTF-16/32


def _tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_graded_file_outside_the_chosen_folder_is_taken_when_it_is_there_once(tmp_path):
    """starter/ holds five graded files, the sixth is one level up: it is graded (the note says where
    it was found), not reported as missing and ignored."""
    moved = FILES[0]
    s = _tree(tmp_path / "s", {**{f"starter/{f}": f"# {f}\nx = 1\n" for f in FILES[1:]}, moved: "y = 2\n"})
    sub = intake.take(s, tmp_path / "d1")
    assert sorted(sub.files) == sorted(FILES) and not sub.missing and not sub.rejected
    assert (tmp_path / "d1" / moved).read_text() == "y = 2\n"
    notes = "\n".join(sub.notes())
    assert f"{moved}: taken from '{moved}'" in notes and "'starter'" in notes and "missing" not in notes
    assert not any(moved in line for line in sub.notes() if line.startswith("ignored")), notes  # not also ignored
    z = tmp_path / "s.zip"  # the same in a zip, deeper
    with zipfile.ZipFile(z, "w") as zf:
        for f in FILES[1:]:
            zf.writestr(f"hw/code/starter/{f}", "x = 1\n")
        zf.writestr(f"hw/notes/{moved}", "y = 3\n")
    sub = intake.take(z, tmp_path / "d2")
    assert sorted(sub.files) == sorted(FILES) and sub.elsewhere == {moved: f"hw/notes/{moved}"}, sub.notes()


def test_a_graded_file_outside_the_chosen_folder_twice_is_named_ambiguous_not_missing(tmp_path):
    moved = FILES[0]
    s = _tree(tmp_path / "s", {**{f"starter/{f}": "x = 1\n" for f in FILES[1:]}, f"a/{moved}": "y = 1\n",
                               f"b/{moved}": "y = 2\n"})
    sub = intake.take(s, tmp_path / "d")
    assert moved not in sub.files and moved not in sub.missing and sorted(sub.files) == sorted(FILES[1:])
    (path, why), = sub.rejected
    assert path == moved and "2 copies elsewhere" in why and f"'a/{moved}'" in why and f"'b/{moved}'" in why
    assert "missing" not in "\n".join(sub.notes())
    # a copy beside the chosen folder's own is not graded (the starter/ rule is unchanged), and the note says
    # which folder was graded and names the copy passed over, apart from the files that are not graded at all
    s2 = _tree(tmp_path / "s2", {**{f"starter/{f}": "x = 1\n" for f in FILES}, f"old/{moved}": "y = 1\n"})
    sub = intake.take(s2, tmp_path / "d2")
    assert (tmp_path / "d2" / moved).read_text() == "x = 1\n" and not sub.elsewhere
    assert sub.passed_over == [f"old/{moved}"] and f"old/{moved}" not in sub.ignored
    assert any(n.startswith("graded the files in 'starter'; 1 other copy(ies) of graded files were NOT graded: old/")
               for n in sub.notes()), sub.notes()


def test_only_the_files_of_the_parts_graded_are_taken_and_named(tmp_path):
    """--parts 1: the other parts' files are neither missing nor rejected nor ignored in the notes,
    and a rejected entry's reason names only part 1's file; the folder is chosen as for all parts."""
    from instructor.grading import Options, grade_one

    one = intake.files_for_parts([1])
    assert one == ["online_softmax.py"] and intake.files_for_parts(None) == FILES
    s = _tree(tmp_path / "s", {"work/online_softmax.py": "x = 1\n", "work/flash_forward.py": "def f(:\n",
                               "work/flash_kernel.py": "k = 1\n", "online_softmax.py": "old = 1\n", "notes.txt": "x"})
    os.link(s / "notes.txt", s / "kv_cache.py")  # a hard link: rejected, were part 5 graded
    sub = intake.take(s, tmp_path / "d", wanted=one)
    assert list(sub.files) == one and not sub.missing and not sub.rejected, (sub.missing, sub.rejected)
    assert (tmp_path / "d" / "online_softmax.py").read_text() == "x = 1\n"  # work/ holds most graded files
    notes = "\n".join(sub.notes())
    assert not any(f in notes for f in FILES if f not in one), notes
    empty = _tree(tmp_path / "e", {"README.md": "forgot"})
    g = grade_one(empty, tmp_path / "w", Options(parts=[1]), name="e")
    assert g.status == "rejected" and g.reason == "no graded files found (expected online_softmax.py)", g.reason
    assert not any(f in " ".join(g.view["intake"]["notes"]) for f in FILES if f not in one)


@pytest.mark.parametrize("codec, name", [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"),
                                         ("utf-32", "UTF-32"), ("utf-32-le", "UTF-32"), ("utf-32-be", "UTF-32")])
def test_a_file_saved_as_utf16_or_utf32_is_named_so(tmp_path, codec, name):
    folder = _tree(tmp_path / "s", {})
    (folder / FILES[0]).write_bytes("# caf\u00e9\ndef f(x):\n    return x\n".encode(codec))
    sub = intake.take(folder, tmp_path / "d")
    (path, why), = sub.rejected
    assert why.startswith(f"saved as {name}: save it as UTF-8"), why
    assert intake.check_source("a.py", b"x = 1\0\n") == "not a Python source file (contains NUL bytes)"
    assert intake.check_source("a.py", "s = '\u00e9\u4e2d'\n".encode()) is None  # UTF-8 text is not mistaken


# ---------------------------------------------------------------------------------------------
# the compiler's own reading; a rejected copy stands; an ambiguous zip is ambiguous


@pytest.mark.parametrize("head", [b"\r# coding: latin-1\n", b"\xef\xbb\xbf\r# coding: latin-1\n",
                                  b"#!/usr/bin/env python\r# vim: set fileencoding=cp1252 :\n", b"\x0c# coding: latin-1\n"])
def test_a_coding_declaration_the_compiler_sees_is_seen(tmp_path, head, monkeypatch):
    """tokenize ends a line at "\\n" only, the compiler (what the worker's import runs) at "\\r" too: a
    declaration after a lone CR is still the file's encoding. The reading is the compiler's: with the
    declaration check switched off, the file is still refused, because its bytes do not compile to the
    code its UTF-8 text does."""
    data = head + "s = 'caf\u00e9'\n".encode()
    why = intake.check_source(FILES[0], data)
    assert why and "encoding" in why, why
    monkeypatch.setattr(intake, "_coding_cookie", lambda data: None)
    why = intake.check_source(FILES[0], data)
    assert why and "other text than its UTF-8" in why, why


@pytest.mark.parametrize("text", [b'x = 1\r# coding: latin-1\ns = "caf\xc3\xa9"\n',  # code first: no declaration
                                  b'"""doc."""\n# Flash-Decoding: split the keys\n', b"x = 1\r\ny = 2\r\n",
                                  b"# -*- coding: utf-8 -*-\rs = 'caf\xc3\xa9'\n"])
def test_what_the_compiler_reads_as_utf8_is_accepted(text):
    assert intake.check_source(FILES[0], text) is None


def _files_of(folder: str, text: str = "x = 1\n") -> dict[str, str]:
    return {f"{folder}/{f}": text for f in FILES}


def test_a_graded_file_rejected_where_it_is_is_not_taken_from_another_copy(tmp_path):
    """The zip member that would be graded is rejected (two members for one path; encrypted): the file
    stays rejected, and a copy elsewhere (a backup, maybe another version) is not graded in its place.
    A link is no file: the file it stands for is looked for as if it were not there."""
    f = FILES[0].encode()
    rest = [(b"sol/" + g.encode(), b"y = 1\n") for g in FILES[1:]]
    for first in ([(b"sol/" + f, b"x = 1\n"), (b"sol\\" + f, b"x = 2\n")], [(b"sol/" + f, b"x = 1\n")]):
        z = _rawzip(tmp_path / "z.zip", first + [(b"old/backup/" + f, b"x = 3\n")] + rest)
        if len(first) == 1:  # the encrypted flag on sol/F
            data = bytearray(z.read_bytes())
            cd = data.index(b"PK\x01\x02")
            data[cd + 8] |= 1
            z.write_bytes(bytes(data))
        sub = intake.take(z, tmp_path / f"d{len(first)}")
        assert FILES[0] not in sub.files and not sub.elsewhere and sorted(sub.files) == sorted(FILES[1:])
        assert [p for p, why in sub.rejected] == [f"sol/{FILES[0]}"] and FILES[0] not in sub.missing, sub.rejected
        assert f"old/backup/{FILES[0]}" in sub.passed_over and f"sol/{FILES[0]}" not in sub.passed_over + sub.ignored  # listed once
    s = _tree(tmp_path / "s", {**{f"starter/{g}": "x = 1\n" for g in FILES[1:]}, f"old/{FILES[0]}": "x = 3\n"})
    (s / f"{FILES[0]}").symlink_to(s / "old" / FILES[0])  # a link at the top: the file is old/'s
    sub = intake.take(s, tmp_path / "d3")
    assert sorted(sub.files) == sorted(FILES) and sub.elsewhere == {FILES[0]: f"old/{FILES[0]}"}
    assert [p for p, _ in sub.rejected] == [FILES[0]]


def test_an_ambiguous_zip_says_ambiguous_and_shows_look_alike_names_apart(tmp_path):
    import unicodedata

    z = tmp_path / "two.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for folder in (unicodedata.normalize("NFC", "caf\u00e9"), unicodedata.normalize("NFD", "caf\u00e9")):
            for f in FILES:
                zf.writestr(f"{folder}/{f}", "x = 1\n")
    sub = intake.take(z, tmp_path / "d")
    assert sub.error.startswith("ambiguous: graded files in both") and "corrupt" not in sub.error, sub.error
    assert "_Reject" not in sub.error and "caf\\xe9" in sub.error and "cafe\\u0301" in sub.error, sub.error
