"""Part 1: online softmax and ⊕ (checks in cases_part1.py; hidden cases in the instructor's copy)."""
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autograder.engine.cases import cases
from autograder.engine.checks import judge_settings
from autograder.tests import cases_part1 as C
from autograder.tests import diagnose as dg

pytestmark = pytest.mark.part1

ROWS = [
    C.RowsCase((4, 113), "float32", seed=0),
    C.RowsCase((2, 3, 64), "float64", seed=1),
    C.RowsCase((5, 200), "float32", seed=2, mult=40.0),  # peaked rows
    C.RowsCase((3, 50), "float32", seed=3, shift=1000.0),  # exp(x) overflows without the max shift
    C.RowsCase((6, 37), "float32", seed=4, neg_inf="rows"),  # all -inf rows give zeros
    C.RowsCase((4, 40), "float32", seed=6, spread=200.0),  # rows 200 apart: each row's own max
    C.RowsCase((7, 1), "float32", seed=5),
]
MERGES = [
    C.MergeCase(C.RowsCase((4, 113), "float32", seed=10), split=50),
    C.MergeCase(C.RowsCase((3, 64), "float64", seed=11, mult=40.0), split=17),
    C.MergeCase(C.RowsCase((4, 40), "float32", seed=12), split=0),  # empty left side
    C.MergeCase(C.RowsCase((6, 30), "float32", seed=13, neg_inf="rows"), split=12),  # both sides empty in some rows
]


@cases(*[c for c in ROWS if c.naive_ok], diagnosis=partial(dg.hidden_softmax, fn="naive_softmax"))
def test_naive_softmax(student, case):
    """naive_softmax(x): softmax over the last dim, exp(x) / Σ exp(x) with no max shift, against float64 softmax."""
    C.check_softmax(student, "naive_softmax", case)


@cases(*ROWS, diagnosis=partial(dg.hidden_softmax, fn="safe_softmax"))
def test_safe_softmax(student, case):
    """safe_softmax(x): softmax over the last dim with the row max subtracted first (§4.2), against float64 softmax."""
    C.check_softmax(student, "safe_softmax", case)


@cases(*ROWS, diagnosis=dg.hidden_summary)
def test_online_summary(student, case):
    """online_summary(x): the row max m and ℓ = Σ_j exp(x_j - m) in ONE streaming pass over the columns (§4.3), against float64."""
    C.check_summary(student, case)


@cases(*ROWS, diagnosis=partial(dg.hidden_softmax, fn="online_softmax"))
def test_online_softmax(student, case):
    """online_softmax(x): the online summary (one streaming pass) then one normalising pass (§4.3), against float64 softmax."""
    C.check_softmax(student, "online_softmax", case)


@cases(*MERGES, diagnosis=partial(dg.hidden_merge, fn="merge_summary"))
def test_merge_summary(student, case):
    """merge_summary(a, b): ⊕ of the (m, ℓ) of two segments equals the summary of both segments' scores (§4.4)."""
    C.check_merge_summary(student, case)


@cases(*MERGES, diagnosis=partial(dg.hidden_merge, fn="merge_partial"))
def test_merge_partial(student, case):
    """merge_partial(a, b): ⊕ of the (m, ℓ, o) of two key segments equals the (m, ℓ, o) of all their keys (§4.4)."""
    C.check_merge_partial(student, case)


@cases(dict(dtype="float32"), dict(dtype="float64"), diagnosis=partial(dg.hidden_merge, fn="merge_summary"))
def test_merge_identity(student, case):
    """The empty summary (m = -inf, ℓ = 0) is the identity of ⊕, on both sides, with no NaN (§4.4)."""
    C.check_identity(student, **case)


@cases(8, diagnosis=partial(dg.hidden_merge, fn="merge_summary"))  # the size of the generated summary batches
@judge_settings(max_examples=15)
@given(data=st.data())
def test_merge_commutative_associative(student, case, data):
    """⊕ is commutative and associative on generated summaries, up to rounding (§4.4)."""
    C.check_algebra(student, *data.draw(C.summaries_strategy(size=case)))


# safe and online on values near 800: exp(x) overflows float64 there, only a max-shifted sum stays finite
@cases(dict(which="naive", n=257, seed=20), dict(which="safe", n=257, seed=20, shift=800.0),
       dict(which="online", n=257, seed=20, shift=800.0))
def test_pass_counts(student, case):
    """The passes over x that the judge counted as it delivered x element by element: naive 2, safe 3, online 2 (§4.3)."""
    C.check_passes(student, **case)


@cases(dict(n=1000, seed=21), dict(n=200, seed=23, order="ties"))  # ties: equal to the max is not a rebase
def test_rebase_count(student, case):
    """online_softmax_counted's rebase count: how often the running max grew (a value equal to the max is not a rebase), on a call the judge counts as the two-pass online softmax with the right probabilities (§4.3)."""
    C.check_rebases(student, **case)
