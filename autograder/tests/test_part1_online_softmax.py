"""Part 1: online softmax and ⊕ (checks in cases_part1.py; hidden cases in the instructor's copy)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autograder.engine.cases import cases
from autograder.engine.checks import judge_settings
from autograder.tests import cases_part1 as C

pytestmark = pytest.mark.part1

ROWS = [
    C.RowsCase((4, 113), "float32", seed=0),
    C.RowsCase((2, 3, 64), "float64", seed=1),
    C.RowsCase((5, 200), "float32", seed=2, mult=40.0),  # peaked rows
    C.RowsCase((3, 50), "float32", seed=3, shift=1000.0),  # exp(x) overflows without the max shift
    C.RowsCase((6, 37), "float32", seed=4, neg_inf="rows"),  # all -inf rows give zeros
    C.RowsCase((7, 1), "float32", seed=5),
]
MERGES = [
    C.MergeCase(C.RowsCase((4, 113), "float32", seed=10), split=50),
    C.MergeCase(C.RowsCase((3, 64), "float64", seed=11, mult=40.0), split=17),
    C.MergeCase(C.RowsCase((4, 40), "float32", seed=12), split=0),  # empty left side
    C.MergeCase(C.RowsCase((6, 30), "float32", seed=13, neg_inf="rows"), split=12),  # both sides empty in some rows
]


@cases(*[c for c in ROWS if c.naive_ok])
def test_naive_softmax(student, case):
    C.check_softmax(student, "naive_softmax", case)


@cases(*ROWS)
def test_safe_softmax(student, case):
    C.check_softmax(student, "safe_softmax", case)


@cases(*ROWS)
def test_online_summary(student, case):
    C.check_summary(student, case)


@cases(*ROWS)
def test_online_softmax(student, case):
    C.check_softmax(student, "online_softmax", case)


@cases(*MERGES)
def test_merge_summary(student, case):
    C.check_merge_summary(student, case)


@cases(*MERGES)
def test_merge_partial(student, case):
    C.check_merge_partial(student, case)


@cases(dict(dtype="float32"), dict(dtype="float64"))
def test_merge_identity(student, case):
    C.check_identity(student, **case)


@cases(8)  # the size of the generated summary batches
@judge_settings(max_examples=15)
@given(data=st.data())
def test_merge_commutative_associative(student, case, data):
    C.check_algebra(student, *data.draw(C.summaries_strategy(size=case)))


@cases(dict(which="naive", n=257, seed=20), dict(which="safe", n=257, seed=20), dict(which="online", n=257, seed=20))
def test_pass_counts(student, case):
    C.check_passes(student, **case)


@cases(dict(n=1000, seed=21), dict(n=200, seed=23, order="ties"))  # ties: equal to the max is not a rebase
def test_rebase_count(student, case):
    C.check_rebases(student, **case)
