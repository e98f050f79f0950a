"""A part's result is reused only for byte-identical reached files and settings (engine/reuse.py); a
test's pass only for the same replies, reply for reply (engine/transcripts.py).

A tiny three-part assignment is written to a temp folder and graded through autograder.engine.grade
as the real one is: part 2's file imports part 1's, part 3's stands alone.
"""
from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from autograder.engine import grade
from autograder.engine.reuse import PartResults
from autograder.engine.transcripts import is_transcript
from instructor.grading import Options, grade_one

REPO = Path(__file__).resolve().parent.parent

RUBRIC = """
[limits]
call_timeout_s = 2

[[part]]
number = 1
name = "A"
points = 10
marker = "part1"
files = ["a.py"]

[[part]]
number = 2
name = "B"
points = 10
marker = "part2"
files = ["b.py"]

[[part]]
number = 3
name = "C"
points = 10
marker = "part3"
files = ["c.py"]
"""

TESTS = {
    "test_part1_a.py": '''
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part1

@pytest.mark.parametrize("n", [1, 2])
def test_twice(student, n):
    check(student.call("a.twice", n) == 2 * n, what="twice(n)")
''',
    "test_part2_b.py": '''
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part2

def test_four_times(student):
    check(student.call("b.four_times", 3) == 12, what="four_times(3)")
''',
    "test_part3_c.py": '''
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part3

def test_plus_one(student):
    check(student.call("c.plus_one", 1) == 2, what="plus_one(1)")

def test_default_dtype(student):
    got = student.call("c.default_dtype")
    check(got == "torch.float32", what="torch's default dtype in part 3's worker", detail=f"got {got}")

def test_plus_one_twice(student):
    first, second = student.call("c.plus_one", 1), student.call("c.plus_one", 41)
    check((first, second) == (2, 42), what="plus_one(1), then plus_one(41)", detail=f"got {first}, {second}")

def test_plus_one_without_magic(student):
    got = student.call("c.plus_one", 2)
    check(got == 3 and "magic" not in student.source("c.py"), what="plus_one(2) with no magic in c.py")
''',
}

A = "def twice(n):\n    return 2 * n\n"
B = "from .a import twice\n\ndef four_times(n):\n    return twice(twice(n))\n"
C = ("def plus_one(n):\n    print('adding one')\n    return n + 1\n\n"
     "def default_dtype():\n    import torch\n    return str(torch.get_default_dtype())\n")


@pytest.fixture(scope="module")
def assignment(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("reuse")
    (root / "rubric.toml").write_text(RUBRIC)
    (root / "tests").mkdir()
    for name, text in TESTS.items():
        (root / "tests" / name).write_text(textwrap.dedent(text))
    return {"rubric": root / "rubric.toml", "tests_dir": root / "tests", "hidden_dir": root / "no-hidden"}


def submission(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True)
    for name, text in {"a": A, "b": B, "c": C, **files}.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def graded(report: dict) -> str:
    """What a student or the grades.csv could see of a report (timings differ from run to run)."""
    return json.dumps({k: report[k] for k in ("parts", "tests", "total", "max_total", "errors")}, sort_keys=True)


def test_identical_reached_files_take_the_earlier_result(assignment, tmp_path):
    store = PartResults()
    first = grade(submission(tmp_path / "one"), reuse=store, **assignment)
    assert first["total"] == 30 and first["timing"]["reused_parts"] == []
    other_c = C.replace("n + 1", "1 + n")  # part 3's file differs; parts 1 and 2 reach a.py and b.py only
    second_dir = submission(tmp_path / "two", c=other_c)
    second = grade(second_dir, reuse=store, **assignment)
    assert second["timing"]["reused_parts"] == [1, 2]
    assert graded(second) == graded(grade(second_dir, **assignment))  # the same report as a fresh grade
    assert any(t.get("output") for t in second["tests"] if t["part"] == 3)


def test_an_edit_to_an_imported_file_grades_every_part_that_reaches_it(assignment, tmp_path):
    store = PartResults()
    grade(submission(tmp_path / "one"), reuse=store, **assignment)
    wrong = grade(submission(tmp_path / "two", a="def twice(n):\n    return n + n + 1\n"), reuse=store, **assignment)
    assert wrong["timing"]["reused_parts"] == [3]  # b.py imports a.py: part 2 runs again, and fails
    assert [p["points"] for p in wrong["parts"]] == [0.0, 0.0, 10.0]


def test_settings_are_part_of_the_key(assignment, tmp_path):
    store = PartResults()
    sub = submission(tmp_path / "one")
    grade(sub, reuse=store, **assignment)
    assert grade(sub, reuse=store, limits={"call_timeout_s": 3}, **assignment)["timing"]["reused_parts"] == []
    assert grade(sub, reuse=store, parts=[3], **assignment)["timing"]["reused_parts"] == [3]
    assert grade(sub, reuse=store, redact_sets=(), **assignment)["timing"]["reused_parts"] == []


def test_a_part_whose_calls_were_lost_is_never_kept(assignment, tmp_path):
    """A timeout depends on the machine's load: the next identical submission is graded afresh."""
    store = PartResults()
    slow = submission(tmp_path / "slow", c=C.replace("    print('adding one')\n", "    while True:\n        pass\n"))
    first = grade(slow, reuse=store, **assignment)
    assert "timed out" in next(t["message"] for t in first["tests"] if t["part"] == 3)
    again = grade(slow, reuse=store, **assignment)
    assert again["timing"]["reused_parts"] == [1, 2]
    assert graded(again) == graded(first)


def test_a_test_answered_as_a_stored_pass_is_reused_and_grades_alike(assignment, tmp_path):
    """b.py changed (so part 2 is graded again) but returns what it returned: its test stops at its reply,
    passed, and the report is a fresh grade's."""
    store = PartResults()
    first = grade(submission(tmp_path / "one"), reuse=store, **assignment)
    assert first["total"] == 30 and first["timing"]["reused_tests"] == 0
    other_b = B.replace("return twice(twice(n))", "return 2 * twice(n)")
    second_dir = submission(tmp_path / "two", b=other_b)
    second = grade(second_dir, reuse=store, **assignment)
    assert second["timing"]["reused_parts"] == [1, 3] and second["timing"]["reused_tests"] == 1
    assert graded(second) == graded(grade(second_dir, **assignment))
    without = grade(second_dir, reuse=PartResults(), **assignment)  # nothing stored: graded in full
    assert without["timing"]["reused_tests"] == 0 and graded(without) == graded(second)


def test_a_test_is_reused_only_through_its_last_reply_and_read(assignment, tmp_path):
    """Part 3's first call is answered as before in each submission below, then a later event differs: a
    second call (plus_one(41) is wrong), the text of c.py (it names magic). Both tests are graded in full
    and fail; the tests whose every event matches are reused (not the one that reads c.py, changed in both)."""
    store = PartResults()
    grade(submission(tmp_path / "one"), reuse=store, **assignment)
    late_bug = C.replace("    return n + 1\n", "    return n + 1 if n < 10 else n\n")
    magic = C + "\n# magic\n"
    for name, c in (("late-bug", late_bug), ("magic", magic)):
        sub = submission(tmp_path / name, c=c)
        report = grade(sub, reuse=store, parts=[3], **assignment)
        outcomes = {t["id"].rsplit("::", 1)[-1]: t["outcome"] for t in report["tests"]}
        failing = "test_plus_one_twice" if name == "late-bug" else "test_plus_one_without_magic"
        assert outcomes.pop(failing) == "failed" and set(outcomes.values()) == {"passed"}, (name, outcomes)
        # every passing test but the one that reads c.py (its text changed in both) stopped at its last reply
        assert report["timing"]["reused_tests"] == len(set(outcomes) - {"test_plus_one_without_magic"}), name
        assert graded(report) == graded(grade(sub, parts=[3], **assignment))


def test_a_failed_or_lost_test_is_never_kept(assignment, tmp_path):
    """Only passes are kept: a correct submission after a wrong one and after a hanging one is graded in full."""
    store = PartResults()
    wrong = grade(submission(tmp_path / "wrong", c=C.replace("n + 1", "n + 2")), reuse=store, parts=[3], **assignment)
    assert wrong["timing"]["reused_tests"] == 0
    slow = submission(tmp_path / "slow", c=C.replace("    print('adding one')\n", "    while True:\n        pass\n"))
    assert grade(slow, reuse=store, parts=[3], **assignment)["parts"][0]["points"] < 10
    right = grade(submission(tmp_path / "right"), reuse=store, parts=[3], **assignment)
    assert right["timing"]["reused_tests"] == 1  # test_default_dtype: passed in both earlier submissions
    assert right["parts"][0]["points"] == 10.0


def test_a_transcript_stops_only_in_the_body_at_a_stored_pass():
    from autograder.engine.errors import StudentError
    from autograder.engine.transcripts import Reused, Transcript

    stored = Transcript("t")
    stored.add(b"ask-1", b"reply-1")
    stored.add(b"ask-2", b"reply-2")
    assert stored.keepable()
    passes = {stored.chain}
    outside = Transcript("t", passes.__contains__)  # not live: a fixture's call never stops a test
    outside.add(b"ask-1", b"reply-1")
    outside.add(b"ask-2", b"reply-2")
    body = Transcript("t", passes.__contains__)
    body.live = True
    body.add(b"ask-1", b"reply-1")  # a prefix of the pass: goes on
    with pytest.raises(Reused):
        body.add(b"ask-2", b"reply-2")
    differs = Transcript("t", passes.__contains__)
    differs.live = True
    differs.add(b"ask-1", b"other")  # differs at once: graded in full, whatever comes after
    differs.add(b"ask-2", b"reply-2")
    other_test = Transcript("u", passes.__contains__)  # the same events in another test: another chain
    other_test.live = True
    other_test.add(b"ask-1", b"reply-1")
    other_test.add(b"ask-2", b"reply-2")
    lost = Transcript("t", passes.__contains__)
    lost.live = True
    lost.add(None, b"")  # an event it could not digest: never matched afterwards
    lost.add(b"ask-1", b"reply-1")
    lost.add(b"ask-2", b"reply-2")
    assert not lost.keepable()
    timed_out = Transcript("t")
    timed_out.add(b"ask-1", b"reply-1")
    timed_out.lost(StudentError("timed out", kind="timeout", target="c.plus_one"))
    assert not timed_out.keepable() and not Transcript("t").keepable()


def test_two_different_passes_of_a_test_are_both_kept(assignment, tmp_path):
    """twice(n) may return 2n as an int or as a float (the test accepts both): the replies differ, so
    each kind of pass is kept on its own, and a later submission answering either way is reused."""
    store = PartResults()
    runs = {}
    for name, a in (("int", A), ("float", "def twice(n):\n    return float(2 * n)\n"),
                    ("float-again", "def twice(n):\n    return 2.0 * n\n"), ("int-again", "def twice(n):\n    return n + n\n")):
        sub = submission(tmp_path / name, a=a)
        runs[name] = grade(sub, reuse=store, parts=[1], **assignment)
        assert runs[name]["total"] == 10 and graded(runs[name]) == graded(grade(sub, parts=[1], **assignment))
    assert [runs[n]["timing"]["reused_tests"] for n in runs] == [0, 0, 2, 2]


def test_a_reused_test_shows_the_output_of_its_own_calls(assignment, tmp_path):
    store = PartResults()
    grade(submission(tmp_path / "one"), reuse=store, parts=[3], **assignment)
    noisy = submission(tmp_path / "noisy", c=C.replace("print('adding one')", "print('plus one')"))
    report = grade(noisy, reuse=store, parts=[3], **assignment)
    assert report["timing"]["reused_tests"] == 3  # all but the test that reads c.py (its text changed)
    assert "plus one" in json.dumps(report["tests"]) and "adding one" not in json.dumps(report["tests"])
    assert graded(report) == graded(grade(noisy, parts=[3], **assignment))


def test_a_worker_serves_one_part(assignment, tmp_path):
    """Part 1's file changes torch's default dtype when it is imported. Part 3 runs after it: with a
    worker of its own it never sees that (so part 3's result depends on its own files alone)."""
    sub = submission(tmp_path / "one", a="import torch\ntorch.set_default_dtype(torch.float64)\n\n" + A)
    own = grade(sub, **assignment)
    assert [p["points"] for p in own["parts"]] == [10.0, 10.0, 10.0]
    shared = grade(sub, limits={"worker_per_part": False}, **assignment)  # the old behaviour
    failure = next(t for t in shared["tests"] if t["id"].endswith("test_default_dtype"))
    assert failure["outcome"] == "failed" and "torch.float64" in failure["message"]


# c.py reaches a.py by a name it computes, through a gadget of a plain import (typing evaluates a string):
# no static analysis of c.py sees it, so part 3's key (reuse.part_key) holds c.py alone
GADGET = ("import typing\n\n"
          "def plus_one(n):\n"
          "    name = __name__.rpartition('.')[0] + '.' + chr(97)\n"
          "    m = typing.ForwardRef('__imp' + 'ort__(' + repr(name) + ', fromlist=[\"_\"])')._evaluate({}, None, frozenset())\n"
          "    return m.twice(n) - n + 1\n")


def test_a_part_worker_holds_only_the_files_its_part_reaches(assignment, tmp_path):
    """A part's worker imports from a folder with the graded files deps.reach finds for the part, no
    others: a file reached by a name no analysis sees is not there, so the part cannot depend on a file
    its reuse key leaves out (a colluder's a.py would otherwise grade a starter's part 3)."""
    from autograder.engine import deps
    from autograder.engine.rubric import load_rubric

    sources = {"a.py": A, "b.py": B, "c.py": GADGET}
    assert deps.reach(load_rubric(assignment["rubric"]), 3, sources) == {"c.py"}  # the gadget is not seen
    report = grade(submission(tmp_path / "one", c=GADGET), parts=[3], **assignment)
    failure = next(t for t in report["tests"] if t["id"].endswith("test_plus_one"))
    assert failure["outcome"] == "failed" and "ModuleNotFoundError" in failure["message"], failure
    # the same file with every other file present or not grades alike: its key is all it could use
    store = PartResults()
    first = grade(submission(tmp_path / "two", c=GADGET), parts=[3], reuse=store, **assignment)
    alone = tmp_path / "three"
    alone.mkdir()
    (alone / "c.py").write_text(GADGET)
    second = grade(alone, parts=[3], reuse=store, **assignment)
    assert second["timing"]["reused_parts"] == [3] and graded(second) == graded(grade(alone, parts=[3], **assignment))
    assert graded(first) == graded(second)


def test_a_code_folder_holds_the_files_asked_for_and_is_private(tmp_path):
    from autograder.engine.submission import prepare_submission
    from autograder.engine.worker import PACKAGE

    impl = submission(tmp_path / "impl")
    sub = prepare_submission(impl, ["a.py", "b.py", "c.py"], tmp_path / "work")
    code = sub.code_for({"b.py", "a.py", "missing.py"})
    assert sorted(p.name for p in (code / PACKAGE).iterdir()) == ["__init__.py", "a.py", "b.py"]
    assert sub.code_for(["a.py", "b.py"]) == code and sub.code_for(["c.py"]) != code
    assert (code.stat().st_mode & 0o777) == 0o700 and (sub.package_dir.parent.stat().st_mode & 0o777) == 0o700
    assert (sub.root.stat().st_mode & 0o777) == 0o711  # traversable to a uid-mode worker, not listable


def test_the_store_is_bounded():
    store = PartResults(total_bytes=3000, entry_bytes=1200)
    assert not store.put("big", {"tests": ["x" * 2000]})  # larger than one entry may be
    for i in range(5):
        assert store.put(f"k{i}", {"tests": ["x" * 900]})
    assert len(store) == 3 and store.size <= 3000  # the least recently used went first
    assert store.get("k0") is None and store.get("k4") is not None
    got = store.get("k4")
    got["tests"].append("changed")
    assert store.get("k4") == {"tests": ["x" * 900]}  # callers get copies


def test_the_channels_reuse_through_grade_one(tmp_path):
    """grade_one (every channel's one function) passes its process's store to the engine; --no-reuse
    (Options.reuse=False) grades every part."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / "solutions" / "flash_decoding.py", tmp_path / name / "flash_decoding.py")
    options = Options(parts=[6], test_sets=("public",))
    first = grade_one(tmp_path / "one", tmp_path / "work-one", options)
    second = grade_one(tmp_path / "two", tmp_path / "work-two", options)
    assert first.view["total"] == second.view["total"] == 15.0
    assert second.timing["reused_parts"] == [6]
    assert second.view["tests"] == first.view["tests"]
    third = grade_one(tmp_path / "two", tmp_path / "work-three", Options(parts=[6], test_sets=("public",), reuse=False))
    assert third.timing["reused_parts"] == [] and third.view["tests"] == first.view["tests"]


def test_a_batch_counts_its_reused_parts_and_grades_alike_without_them(tmp_path):
    """Two identical submissions and one that differs: the batch reuses the repeated part, the
    summary counts it, and --no-reuse (Options.reuse=False) writes byte-identical grades."""
    from instructor.batch import run_batch

    subs = tmp_path / "subs"
    for name, source in (("ann", "solutions"), ("ben", "solutions"), ("cat", "starter")):
        (subs / name).mkdir(parents=True)
        shutil.copy(REPO / source / "flash_decoding.py", subs / name / "flash_decoding.py")
    summaries = {}
    for reuse in (True, False):
        options = Options(parts=[6], test_sets=("public",), reuse=reuse)
        summaries[reuse] = run_batch(subs, tmp_path / f"out-{reuse}", jobs=0, options=options, progress=False,
                                     sandbox="auto")  # the sandbox a batch would use here
    assert summaries[True]["parts_reused"] >= 1 and summaries[False]["parts_reused"] == 0
    assert summaries[False]["tests_reused"] == 0  # --no-reuse: no test's pass either
    assert (tmp_path / "out-True" / "grades.csv").read_bytes() == (tmp_path / "out-False" / "grades.csv").read_bytes()


def test_the_reference_seeds_the_store_under_the_scaled_limits(tmp_path, monkeypatch):
    """Scaling the call time limits grades the reference anyway; its parts then serve a submission with
    the reference's files under the scaled limits (grading.seed_reuse), with the result a fresh grade
    gives there. Another file is graded."""
    from instructor import batch, grading

    monkeypatch.setattr(grading, "_REUSE", PartResults())  # only what the seeding put there
    options = Options(parts=[6], test_sets=("public",))
    info = batch.scaled_call_timeouts(options)
    parts = [e for e in info["seeds"] if not is_transcript(e)]
    passes = [e for e in info["seeds"] if is_transcript(e)]  # the reference's passed tests (transcripts.py)
    assert info["scaled"] and info["reference"]["points"] == 15.0 and len(parts) == 1 and passes
    assert len(grading._REUSE) == 1 + len(passes) and grading._REUSE.take_new() == {}  # not passed on again
    for name, source in (("same", "solutions"), ("other", "starter")):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / source / "flash_decoding.py", tmp_path / name / "flash_decoding.py")
    seeded = grade_one(tmp_path / "same", tmp_path / "work-same", options)
    assert seeded.timing["reused_parts"] == [6]
    fresh = grade_one(tmp_path / "same", tmp_path / "work-fresh", replace(options, reuse=False))
    assert fresh.timing["reused_parts"] == [] and fresh.view["tests"] == seeded.view["tests"]
    assert grade_one(tmp_path / "other", tmp_path / "work-other", options).timing["reused_parts"] == []
    off = replace(options, reuse=False, limits={})
    assert batch.scaled_call_timeouts(off)["seeds"] == []  # --no-reuse: nothing to seed


def test_judges_share_what_they_graded(tmp_path):
    """A batch's judges share one store: a part one judge graded comes back with its reply, and another
    judge given it (between submissions) takes it instead of grading it again."""
    import multiprocessing as mp

    from instructor.batch import Judge, Task
    from instructor.grading import Graded

    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        shutil.copy(REPO / "starter" / "flash_decoding.py", tmp_path / name / "flash_decoding.py")
    ctx = mp.get_context("spawn")
    options = Options(parts=[6], test_sets=("public",))
    judges = [Judge(ctx, slot, options) for slot in (0, 1)]
    try:
        judges[0].submit(Task("one", str(tmp_path / "one"), str(tmp_path / "work-one")), 600)
        first = judges[0].conn.recv()
        assert first[0] == "ok" and len(first[3]) == 1  # the part it graded, for the others
        judges[1].send_quietly(("share", first[3]))
        judges[1].submit(Task("two", str(tmp_path / "two"), str(tmp_path / "work-two")), 600)
        second = judges[1].conn.recv()
        assert second[0] == "ok" and second[3] == {}
        one, two = Graded.from_json(first[1]), Graded.from_json(second[1])
        assert one.timing["reused_parts"] == [] and two.timing["reused_parts"] == [6]
        assert two.view["tests"] == one.view["tests"]
    finally:
        for j in judges:
            j.send_quietly(None)
            j.proc.join(30)
            j.kill()


def test_a_verdict_read_from_a_cache_is_never_reused(tmp_path):
    """A test whose verdict comes from a measurement cached by the submission's text (cases_part1.stream_order
    keeps one per online_softmax.py) reads what another call made: it says so (student.shares_state) and its
    pass is never reused; a test of the same part that reads only its own replies is."""
    root = tmp_path / "assignment"
    (root / "tests").mkdir(parents=True)
    (root / "rubric.toml").write_text(textwrap.dedent("""
        [[part]]
        number = 1
        name = "A"
        points = 10
        marker = "part1"
        files = ["a.py", "c.py"]
        """))
    (root / "tests" / "test_part1_a.py").write_text(textwrap.dedent('''
        import hashlib
        import pytest
        from autograder.engine import check
        pytestmark = pytest.mark.part1
        _MEASURED = {}

        def measured(student):
            key = hashlib.sha256(student.source("a.py").encode()).hexdigest()
            if key in _MEASURED:
                student.shares_state()
            else:
                _MEASURED[key] = student.call("a.order", 99)
            return _MEASURED[key]

        @pytest.mark.parametrize("n", [1, 2])
        def test_twice_in_one_pass(student, n):
            check(student.call("a.twice", n) == 2 * n and measured(student) == "one pass", what="twice(n), one pass")

        def test_twice_alone(student):
            check(student.call("a.twice", 5) == 10, what="twice(5)")
        '''))
    assignment = {"rubric": root / "rubric.toml", "tests_dir": root / "tests", "hidden_dir": root / "no-hidden"}
    a = "def twice(n):\n    return 2 * n\n\ndef order(n):\n    return 'one pass'\n"
    store = PartResults()
    for name, c in (("one", "x = 1\n"), ("two", "x = 2\n")):  # c.py differs: the part is graded each time
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.py").write_text(a)
        (tmp_path / name / "c.py").write_text(c)
    first = grade(tmp_path / "one", reuse=store, **assignment)
    second = grade(tmp_path / "two", reuse=store, **assignment)
    assert first["total"] == second["total"] == 10
    # reused: test_twice_alone, and the first case, whose own events hold the measuring call (the module is
    # imported afresh for each grade of a tests folder outside the package); not the second, which read the cache
    assert second["timing"]["reused_parts"] == [] and second["timing"]["reused_tests"] == 2
