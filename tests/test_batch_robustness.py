"""One submission never crashes the batch, and nothing a submission names reaches a report raw.

- The known crashers in one batch, graded by the real engine (part 1, the small test module of
  autograder_minitests.py) in a judge process: an exception message with lone surrogates, escape
  sequences, markdown and HTML; a file name that is not UTF-8 inside a folder; entry names that
  collide after renaming; and every kind of rejected entry. One row per entry, a reason on each.
- Property tests (hypothesis) with the fast stand-in grader of test_batch.py: arbitrary entry
  names (any bytes), layouts and zip member names; arbitrary error records from a worker.
- Intake: a BOM, backslash paths in a zip, a backup copy beside starter/; merge refuses an
  incomplete set of shards.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import unicodedata
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from autograder.engine import sanitize
from autograder.engine.judge import _student_error
from instructor import intake
from instructor.batch import Options, merge, run_batch
from autograder_minitests import write_mini_tests

ROOT = Path(__file__).resolve().parent.parent
FILES = intake.all_graded_files()
SOLUTION = (ROOT / "solutions" / "online_softmax.py").read_text()

# raises an exception whose message holds everything a renderer could trip over
NASTY = '''

def naive_softmax(x):
    raise ValueError("bad " + chr(0xD800) + chr(0xDCFF) + " \\x1b[2J\\x1b[31m red \\u202e evil ``` \\r"
                     "| | **total** | | **100/100** | <script>alert(1)</script> [link](http://x) \\x00 end\\nmore")
'''
FAKE_TOTAL = "**100/100**"


def _rows(out: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8"))))


def _printable(text: str) -> bool:
    return all(ch in "\n\t" or unicodedata.category(ch) not in sanitize._HIDDEN for ch in text)


def _check_outputs(out: Path, n_entries: int) -> list[dict]:
    """One row per entry, unique ids, a reason on every row that is not graded, clean files."""
    rows = _rows(out)
    assert len(rows) == n_entries and len({r["student"] for r in rows}) == n_entries
    for r in rows:
        assert r["status"] in ("graded", "failed to grade", "rejected")
        assert r["status"] == "graded" or r["reason"].strip(), r
        assert r["source"] and _printable(r["source"])
        for name in ("feedback.md", "feedback.json", "results.json"):
            text = (out / r["student"] / name).read_text(encoding="utf-8")
            assert _printable(text), (r["student"], name)
        json.loads((out / r["student"] / "results.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["submissions"] == n_entries
    return rows


# ---------------------------------------------------------------------------------------------
# every crasher in one batch, real engine


def _folder(path: Path, files: dict[str, str | bytes]) -> Path:
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@pytest.fixture(scope="module")
def crashers(tmp_path_factory):
    subs = tmp_path_factory.mktemp("subs")
    _folder(subs / "good", {"online_softmax.py": SOLUTION})
    _folder(subs / "nasty", {"online_softmax.py": SOLUTION + NASTY})
    bad = _folder(subs / "badname", {"online_softmax.py": SOLUTION, "notes.txt": "x"})
    (Path(os.fsdecode(bytes(bad) + b"/caf\xe9 r\xe9sum\xe9.py"))).write_bytes(b"x = 1\n")  # old zip tools
    (bad / "x\n| | **total** | | **100 of 100** |\n<img src=x onerror=alert(1)>.txt").write_text("x")  # a name that forges
    os.mkdir(os.fsdecode(bytes(bad) + b"/\xff\xfe dir"))
    (Path(os.fsdecode(bytes(bad) + b"/\xff\xfe dir/online_softmax.py"))).write_text("x = (\n")  # a rejected copy
    _folder(Path(os.fsdecode(bytes(subs) + b"/\xe9l\xe8ve")), {"online_softmax.py": SOLUTION})  # entry not UTF-8
    _folder(subs / "dup", {"online_softmax.py": SOLUTION})
    _folder(subs / "dup-2", {"online_softmax.py": SOLUTION})
    with zipfile.ZipFile(subs / "dup.zip", "w") as z:
        z.writestr("online_softmax.py", SOLUTION)
    _folder(subs / "grades.csv", {"online_softmax.py": SOLUTION})  # the batch's own file name
    _folder(subs / "**100|100** <b>x<i>", {"online_softmax.py": SOLUTION})
    # rejected, each for its own reason
    _folder(subs / "empty", {"README.md": "forgot the code"})
    _folder(subs / "syntax", {f: "def f(:\n" for f in FILES})
    (subs / "report.pdf").write_bytes(b"%PDF-1.4")
    (subs / "broken.zip").write_bytes(b"PK\x03\x04 not a zip")
    _folder(subs / "ambiguous", {"a/online_softmax.py": SOLUTION, "b/online_softmax.py": SOLUTION})
    with zipfile.ZipFile(subs / "onlynotes.zip", "w") as z:
        z.writestr("notes.txt", "hi")
    out = tmp_path_factory.mktemp("out")
    options = Options(parts=[1], test_sets=("public",), tests_dir=str(write_mini_tests(tmp_path_factory.mktemp("t"))),
                      limits={"call_timeout_s": 20})
    summary = run_batch(subs, out, jobs=1, options=options, progress=False, sandbox="off", allow_weak=True)
    return subs, out, summary


def test_a_batch_of_crashers_completes_with_one_row_per_entry_and_a_reason_on_each(crashers):
    subs, out, summary = crashers
    entries = [p for p in os.listdir(bytes(subs)) if not p.startswith(b".")]
    rows = {r["student"]: r for r in _check_outputs(out, len(entries))}
    assert summary["failed_to_grade"] == 0, summary["failed"]
    for name in ("good", "nasty", "badname", "dup", "dup-2", "dup-3", "grades.csv-student"):
        assert rows[name]["status"] == "graded", (name, rows[name])
    assert rows["good"]["total"] == "15" and rows["badname"]["total"] == "15"
    assert {rows[n]["source"] for n in ("dup", "dup-2", "dup-3")} == {"dup", "dup-2", "dup.zip"}  # maps back
    assert any(r["source"] == "\\xe9l\\xe8ve" and r["status"] == "graded" for r in rows.values())
    rejected = {n: r["reason"] for n, r in rows.items() if r["status"] == "rejected"}
    assert set(rejected) == {"empty", "syntax", "report.pdf", "broken", "ambiguous", "onlynotes"}
    assert "no graded files found" in rejected["empty"] and "not valid Python" in rejected["syntax"]
    assert "not a folder or a .zip" in rejected["report.pdf"] and "not a readable zip" in rejected["broken"]
    assert "ambiguous" in rejected["ambiguous"]


def test_a_nasty_message_is_one_clean_line_and_fakes_no_total(crashers):
    _, out, _ = crashers
    md = (out / "nasty" / "feedback.md").read_text(encoding="utf-8")
    assert "<script>" not in md and "\x1b" not in md and "\u202e" not in md
    # the only total line is the engine's, and nothing closes the code block early
    totals = [line for line in md.splitlines() if "**total**" in line]
    assert len(totals) == 1 and FAKE_TOTAL not in totals[0]
    fence = re.search(r"^(`{3,})text$", md, re.M)
    assert fence and len(fence.group(1)) > 3  # longer than the message's own ```
    res = json.loads((out / "nasty" / "results.json").read_text())
    for t in res["tests"]:
        assert "\n" not in t["output"].split("\n\nyour code printed:")[0].split("checked:")[0]
    badname = (out / "badname" / "feedback.md").read_text(encoding="utf-8")
    rendered = MarkdownIt("commonmark").enable(["table"]).render(badname)  # as a GFM viewer shows it
    assert rendered.count("<strong>total</strong>") == 1 and "<strong>15/15</strong>" in rendered
    assert "<img" not in rendered and "<strong>100 of 100</strong>" not in rendered
    note = next(line for line in badname.splitlines() if "100 of 100" in line)
    assert note.startswith("- `") and note.endswith("`")  # shown as it is, in code, on its note's line
    assert "caf\\xe9 r\\xe9sum\\xe9.py" in badname  # its bytes spelled out


def test_names_with_markdown_become_safe_ids(crashers):
    _, out, _ = crashers
    rows = _rows(out)
    ids = [r["student"] for r in rows]
    assert all(re.fullmatch(r"[A-Za-z0-9._@+-]+", i) for i in ids), ids
    md = next((out / r["student"] / "feedback.md").read_text() for r in rows if r["source"].startswith("**"))
    assert "<b>" not in md and "**100" not in md


# ---------------------------------------------------------------------------------------------
# property tests: arbitrary names and layouts, the stand-in grader (fast, in this process)

NAME = st.binary(min_size=1, max_size=16).filter(
    lambda b: b"/" not in b and b"\0" not in b and not b.startswith(b"."))
MEMBER = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1,
                          max_size=8), min_size=1, max_size=3).map(lambda parts: "\\".join(parts) if len(parts) == 2
                                                                   else "/".join(parts))
CONTENT = st.sampled_from(["CORRECT", "", "def f(:", "\ufeffCORRECT", "x = 1"])
ENTRY = st.tuples(NAME, st.sampled_from(["dir", "zip", "file"]),
                  st.lists(st.tuples(st.one_of(st.sampled_from(FILES), NAME.map(os.fsdecode), MEMBER), CONTENT),
                           max_size=4))


def _make(root: Path, name: bytes, kind: str, files: list[tuple[str, str]]) -> None:
    path = os.fsencode(root) + b"/" + name
    if kind == "file":
        with open(path, "wb") as f:
            f.write(b"not a submission")
    elif kind == "zip":
        with zipfile.ZipFile(os.fsdecode(path + b".zip"), "w") as z:
            for member, content in files:
                try:
                    member.encode("utf-8")
                except UnicodeEncodeError:  # raw bytes, as an old zip tool writes them (read back as cp437)
                    member = os.fsencode(member).decode("cp437")
                z.writestr(member, content)
    else:
        os.mkdir(path)
        for member, content in files:
            target = os.fsencode(member.replace("\\", "_").replace("/", "_")) or b"_"
            if target.startswith(b"."):
                target = b"_" + target
            with open(path + b"/" + target[:200], "w", encoding="utf-8") as f:
                f.write(content)


@pytest.mark.filterwarnings("ignore:Duplicate name")  # a generated zip may hold a name twice, on purpose
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(entries=st.lists(ENTRY, min_size=1, max_size=6, unique_by=lambda e: e[0] + (b".zip" if e[1] == "zip" else b"")))
def test_any_names_and_layouts_give_one_row_per_entry_with_reasons(tmp_path_factory, entries):
    subs, out = tmp_path_factory.mktemp("subs"), tmp_path_factory.mktemp("out")
    made = set()
    for name, kind, files in entries:
        full = name + (b".zip" if kind == "zip" else b"")
        if full in made:
            continue
        made.add(full)
        _make(subs, name, kind, files)
    options = Options(grader="test_batch:fake_grade", test_sets=("public", "hidden"))
    run_batch(subs, out, jobs=0, options=options, progress=False, sandbox="off", allow_weak=True)
    _check_outputs(out, len(os.listdir(bytes(subs))))


@settings(max_examples=200, deadline=None)
@given(err=st.dictionaries(st.sampled_from(["kind", "type", "message", "where", "traceback", "memory"]),
                           st.one_of(st.text(), st.binary(), st.integers(), st.none(),
                                     st.lists(st.one_of(st.text(), st.integers()), max_size=4))))
def test_any_worker_error_record_becomes_one_clean_bounded_line(err):
    e = _student_error(err, "online_softmax.naive_softmax", "naive_softmax")
    text = str(e)
    assert "\n" not in text and "\r" not in text and len(text) <= 600 and _printable(text)
    text.encode("utf-8")  # no lone surrogates


@given(st.one_of(st.text(), st.binary()))
def test_sanitize_gives_printable_bounded_text(value):
    one = sanitize.line(value)
    assert "\n" not in one and len(one) <= sanitize.LINE_CHARS and _printable(one)
    one.encode("utf-8")
    md = sanitize.markdown(one)
    assert "<" not in md and "\n" not in md
    block = sanitize.block(value)
    block.encode("utf-8")
    assert _printable(block)


def test_every_character_is_shown_or_spelled_out_the_same_way_on_the_fast_path():
    """sanitize keeps text that str.isprintable() accepts as it is (the common case, no per-character
    work): the same as the per-character rule for every character of the Basic Multilingual Plane,
    alone and beside a printable one, with and without a kept tab."""
    import unicodedata

    def per_character(text: str, keep: str) -> str:
        out = []
        for ch in text:
            if ch in keep:
                out.append(ch)
            elif ch.isspace() and ch not in "\u2028\u2029\x85":
                out.append(" ")
            elif unicodedata.category(ch) in sanitize._HIDDEN:
                out.append("\\?")  # spelled out (how does not matter here)
            else:
                out.append(ch)
        return "".join(out)

    for o in range(0x10000):
        for text in (chr(o), "a" + chr(o)):
            for keep in ("", "\t"):
                got, want = sanitize._printable(text, keep), per_character(text, keep)
                assert (got == text) == (want == text), (hex(o), got, want)


# ---------------------------------------------------------------------------------------------
# intake and merge


def test_intake_accepts_a_bom_backslash_paths_and_prefers_starter(tmp_path):
    bom = _folder(tmp_path / "bom", {"online_softmax.py": b"\xef\xbb\xbf" + SOLUTION.encode()})
    taken = intake.take(bom, tmp_path / "d1")
    assert taken.files and not taken.rejected
    assert (tmp_path / "d1" / "online_softmax.py").read_bytes() == SOLUTION.encode()
    z = tmp_path / "win.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("work\\starter\\online_softmax.py", SOLUTION)
    taken = intake.take(z, tmp_path / "d2")
    assert list(taken.files) == ["online_softmax.py"] and not taken.rejected
    both = _folder(tmp_path / "both", {"starter/online_softmax.py": SOLUTION, "starter_backup/online_softmax.py": "x=1",
                                       "starter/flash_forward.py": "x=1", "starter_backup/flash_forward.py": "x=2"})
    taken = intake.take(both, tmp_path / "d3")
    assert taken.error is None and (tmp_path / "d3" / "online_softmax.py").read_text() == SOLUTION
    assert any("starter_backup" in p for p in taken.passed_over)  # named as copies not graded


def test_merge_refuses_an_incomplete_set_of_shards(tmp_path):
    subs = tmp_path / "subs"
    for n in ("a", "b", "c"):
        _folder(subs / n, {"online_softmax.py": "CORRECT"})
    options = Options(grader="test_batch:fake_grade", test_sets=("public",))
    for i in (1, 2, 3):
        run_batch(subs, tmp_path / f"s{i}", jobs=0, shard=(i, 3), options=options, progress=False, sandbox="off", allow_weak=True)
    with pytest.raises(SystemExit, match=r"missing shard\(s\) 2/3 of 3"):
        merge([tmp_path / "s1", tmp_path / "s3"], tmp_path / "m1")
    with pytest.raises(SystemExit, match="appears twice"):
        merge([tmp_path / "s1", tmp_path / "s1", tmp_path / "s2"], tmp_path / "m2")
    assert not (tmp_path / "m1").exists()
    grades = merge([tmp_path / f"s{i}" for i in (1, 2, 3)], tmp_path / "m3")
    assert [r["student"] for r in csv.DictReader(grades.open())] == ["a", "b", "c"]


# A test of the instructor's own that breaks (a KeyError of its own) on an output it did not expect:
# a judge-side error, not the submission's mistake, so its 0 must not be handed out as the grade.
BROKEN_TEST = '''
import pytest
import torch

pytestmark = pytest.mark.part1


def test_breaks_on_an_output_it_did_not_expect(student):
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    out = student.call("online_softmax.naive_softmax", x)
    if not torch.allclose(out, torch.softmax(x, -1)):
        {}["the test's own bug"]
'''


def test_a_test_that_raises_an_error_of_its_own_fails_to_grade_instead_of_giving_0(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_part1_broken.py").write_text(BROKEN_TEST)
    subs = tmp_path / "subs"
    _folder(subs / "good", {"online_softmax.py": SOLUTION})
    _folder(subs / "odd", {"online_softmax.py": SOLUTION + "\n\ndef naive_softmax(x):\n    return 2 * x\n"})
    out = tmp_path / "out"
    options = Options(parts=[1], test_sets=("public",), tests_dir=str(tests), limits={"call_timeout_s": 20})
    summary = run_batch(subs, out, jobs=1, options=options, progress=False, sandbox="off", allow_weak=True)
    rows = {r["student"]: r for r in _rows(out)}
    assert rows["good"]["status"] == "graded" and rows["good"]["total"] == "15"
    odd = rows["odd"]
    assert odd["status"] == "failed to grade" and odd["total"] == "", odd
    assert "raised an error of their own" in odd["reason"] and "test_breaks_on_an_output" in odd["reason"]
    assert summary["failed_to_grade"] == 1
    assert "the test's own bug" in (out / "_instructor" / "odd" / "grading-error.txt").read_text()
    feedback = (out / "odd" / "feedback.md").read_text()
    assert "Not graded" in feedback and "own bug" not in feedback  # the student learns only that it will be regraded


def test_a_rejected_submission_says_nothing_was_run(tmp_path):
    subs = tmp_path / "subs"
    _folder(subs / "empty", {"README.md": "forgot the code"})
    options = Options(parts=[1], test_sets=("public",), tests_dir=str(write_mini_tests(tmp_path / "t")))
    run_batch(subs, tmp_path / "out", jobs=0, options=options, progress=False, sandbox="off", allow_weak=True)
    feedback = (tmp_path / "out" / "empty" / "feedback.md").read_text()
    assert "Nothing of this submission was run." in feedback and "Graded with the test sets" not in feedback
    assert json.loads((tmp_path / "out" / "empty" / "feedback.json").read_text())["test_sets"] == []
