"""The judge's memory bound (autograder/engine/memory.py): what the judge holds is measured, the
replies a test keeps and the replays it runs are bounded, and a failed test keeps none of its data
(its traceback's frames held every replay of the test: GBs per hostile part)."""
from __future__ import annotations

import gc
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from autograder.engine import grade, memory, replay
from autograder.engine.runner import _detached
from instructor import redteam

REPO = Path(__file__).resolve().parent.parent

RUBRIC = """
[[part]]
number = 1
name = "A"
points = 10
marker = "part1"
files = ["a.py"]
"""

TESTS = '''
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part1

def test_keeps_eight_replies(student):
    kept = [student.call("a.block", 64) for _ in range(8)]
    check(all(t.numel() == 64 << 17 for t in kept), what="eight 64 MB blocks")

def test_small_reply(student):
    check(student.call("a.block", 1).numel() == 1 << 17, what="one 1 MB block")
'''

A = "import torch\n\ndef block(mb):\n    return torch.ones(mb << 17, dtype=torch.float64)\n"


@pytest.fixture
def assignment(tmp_path) -> dict:
    (tmp_path / "rubric.toml").write_text(RUBRIC)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_part1_a.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.py").write_text(A)
    return {"impl_dir": tmp_path / "sub", "rubric": tmp_path / "rubric.toml", "tests_dir": tmp_path / "tests",
            "hidden_dir": tmp_path / "no-hidden"}


@pytest.fixture
def restored_bound():
    before = memory.bound()
    yield
    memory.set_bound(before >> 20)


def test_resident_memory_is_measured(restored_bound):
    before = memory.resident_anon()
    assert before > 0
    block = torch.ones(64 << 17, dtype=torch.float64)  # 64 MB, touched
    assert memory.resident_anon() - before > 48 << 20
    memory.set_bound(max(1, (memory.resident_anon() >> 20) - 32))
    assert memory.over_bound() is not None  # held in `block`: a release cannot take it back
    del block
    memory.release()
    assert memory.over_bound() is None
    memory.set_bound(1)
    assert memory.over_bound() > 1 << 20 and "its bound: 0.0 GB" in memory.describe(memory.over_bound())


def test_replies_that_add_up_past_the_bound_cost_the_call(assignment):
    """Each reply is under the reply cap; the eight that one test keeps are not under the judge's bound."""
    fine = grade(**assignment)
    assert fine["total"] == 10, fine["tests"]
    bound_mb = (memory.resident_anon() >> 20) + 256  # this process is the judge
    before = memory.bound()
    report = grade(**assignment, limits={"judge_memory_mb": bound_mb})
    assert memory.bound() == before  # the grade's bound ends with it (replays outside a grade keep theirs)
    by_name = {t["id"].split("::")[-1]: t for t in report["tests"]}
    kept = by_name["test_keeps_eight_replies"]
    assert kept["outcome"] == "failed", kept
    assert "reply left the judge holding" in kept["message"] and "its bound" in kept["message"] \
        and "return only the result" in kept["message"], kept["message"]
    assert by_name["test_small_reply"]["outcome"] == "passed"  # one lost call: the part goes on


def test_a_replay_past_the_bound_is_refused(restored_bound):
    q = torch.randn(4, 8, dtype=torch.float64)
    memory.set_bound(1)
    with pytest.raises(replay.ReplayRefused, match="judge's memory") as refused:
        replay.record_and_replay(lambda x: (x @ x.T).softmax(-1), q)
    assert refused.value.kind == "budget"
    memory.set_bound(memory.DEFAULT_BOUND_MB)
    assert replay.record_and_replay(lambda x: (x @ x.T).softmax(-1), q) is not None


def test_a_failed_test_keeps_no_replay(tmp_path):
    """Every structure check replays the call; a failed test's exception used to keep them all."""
    sub = tmp_path / "no_rescale"
    shutil.copytree(REPO / "solutions", sub, ignore=shutil.ignore_patterns("__pycache__"))
    assert redteam._apply_mutation(sub, "forward_no_rescale")
    report = grade(sub, parts=[2])
    assert any(t["outcome"] == "failed" for t in report["tests"])  # the mutation is caught ...
    gc.collect()
    alive = sum(type(o) is replay.Replayed for o in gc.get_objects())
    assert alive == 0, f"{alive} replays are still held after the grade"  # ... and nothing of it is kept


def test_detached_drops_tracebacks_along_the_chain():
    def failing():
        try:
            raise ValueError("member")
        except ValueError as raised:
            member = raised  # with a traceback of its own
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise ExceptionGroup("outer", [member]) from inner

    with pytest.raises(ExceptionGroup) as info:
        failing()
    exc = _detached(info.value)
    assert exc is info.value
    assert exc.__traceback__ is None and exc.__cause__.__traceback__ is None
    assert all(e.__traceback__ is None for e in exc.exceptions)


HELD_TESTS = '''
import weakref
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part1

HELD = []


class Replays:  # stands for what a failed check's frames hold: inputs, references, replays
    pass


def test_fails_holding_its_replays(student):
    replays = Replays()
    HELD.append(weakref.ref(replays))
    check(student.call("a.block", 1).numel() == 0, what="a check that fails with its replays in a local")


def test_the_failed_tests_replays_are_already_gone(student):
    check(HELD[0]() is None, what="no collection has run since: what the failed test held was freed with it")
'''


def test_a_failed_tests_frames_are_freed_when_it_ends_not_at_the_grades_last_collection(assignment):
    """Cyclic collection is off while the tests run (runner.grade), so what a failed test's frames hold
    must go by reference counting: frame.clear() leaves the locals pytest read (f_locals) in Python 3.11,
    and pytest keeps the failure in sys.last_*. Kept, a hostile part's replays piled up to 3 GB and cost
    the grade's last collection 14 s (the red-team attack backward_rows_via_number_offset)."""
    (assignment["tests_dir"] / "test_part1_a.py").write_text(HELD_TESTS)
    report = grade(**assignment)
    by_name = {t["id"].split("::")[-1]: t for t in report["tests"]}
    assert by_name["test_fails_holding_its_replays"]["outcome"] == "failed"
    assert by_name["test_the_failed_tests_replays_are_already_gone"]["outcome"] == "passed", \
        by_name["test_the_failed_tests_replays_are_already_gone"]["message"]
