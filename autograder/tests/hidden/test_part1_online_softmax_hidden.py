# CANARY-HIDDEN-2e4a1e4883ed (release leak detector: hidden tests must never reach students)
"""Part 1 hidden tests: the public checks on more shapes, seeds and edge cases."""
import pytest
from hypothesis import given

from autograder.engine.checks import judge_settings
from autograder.tests import cases_part1 as C

pytestmark = pytest.mark.part1

ROWS = [
    C.RowsCase((1000,), "float32", seed=100),  # one long 1-D row
    C.RowsCase((2, 2, 3, 129), "float32", seed=101),  # 4-D
    C.RowsCase((3, 257), "float64", seed=102, mult=40.0, shift=1000.0),
    C.RowsCase((4, 96), "float32", seed=103, mult=40.0, shift=-1000.0),
    C.RowsCase((5, 64), "float32", seed=104, neg_inf="some"),
    C.RowsCase((5, 64), "float64", seed=105, neg_inf="some", mult=40.0),
    C.RowsCase((7, 33), "float64", seed=106, neg_inf="rows"),
    C.RowsCase((9,), "float32", seed=107, neg_inf="rows"),  # a single all -inf row
    C.RowsCase((3, 1024), "float32", seed=108, mult=40.0),
    C.RowsCase((1, 2), "float32", seed=109, shift=1000.0),
]
MERGES = [
    C.MergeCase(C.RowsCase((2, 3, 77), "float32", seed=110), split=76, dv=5),
    C.MergeCase(C.RowsCase((5, 64), "float32", seed=111, mult=40.0, shift=1000.0), split=32, dv=16),
    C.MergeCase(C.RowsCase((4, 40), "float64", seed=112), split=40),  # empty right side
    C.MergeCase(C.RowsCase((8, 30), "float64", seed=113, neg_inf="rows"), split=3, dv=1),
    C.MergeCase(C.RowsCase((6, 50), "float32", seed=114, neg_inf="some", mult=40.0), split=25, dv=4),
]


@pytest.mark.parametrize("case", [c for c in ROWS if c.naive_ok], ids=lambda c: c.id)
def test_naive_softmax(student, case):
    C.check_softmax(student, "naive_softmax", case)


@pytest.mark.parametrize("case", ROWS, ids=lambda c: c.id)
def test_safe_softmax(student, case):
    C.check_softmax(student, "safe_softmax", case)


@pytest.mark.parametrize("case", [*ROWS, C.RowsCase((3, 0), "float32", seed=115)], ids=lambda c: c.id)
def test_online_summary(student, case):
    C.check_summary(student, case)


@pytest.mark.parametrize("case", ROWS, ids=lambda c: c.id)
def test_online_softmax(student, case):
    C.check_softmax(student, "online_softmax", case)


@pytest.mark.parametrize("case", MERGES, ids=lambda c: c.id)
def test_merge_summary(student, case):
    C.check_merge_summary(student, case)


@pytest.mark.parametrize("case", MERGES, ids=lambda c: c.id)
def test_merge_partial(student, case):
    C.check_merge_partial(student, case)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_merge_identity(student, dtype):
    C.check_identity(student, dtype, lead=(2, 3), seed=7)


@judge_settings(max_examples=30)
@given(abc=C.summaries_strategy(size=16))
def test_merge_commutative_associative(student, abc):
    C.check_algebra(student, *abc)


@pytest.mark.parametrize("which,n,seed", [("naive", 1, 120), ("safe", 4096, 121), ("online", 4096, 122)])
def test_pass_counts(student, which, n, seed):
    C.check_passes(student, which, n=n, seed=seed)


@pytest.mark.parametrize("n,seed,order", [(4096, 123, "random"), (300, 124, "increasing"),
                                          (300, 125, "decreasing"), (1, 126, "random")])
def test_rebase_count(student, n, seed, order):
    C.check_rebases(student, n=n, seed=seed, order=order)
