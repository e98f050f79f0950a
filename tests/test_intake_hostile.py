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
