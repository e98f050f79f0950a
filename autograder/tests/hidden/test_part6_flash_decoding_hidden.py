# CANARY-HIDDEN-9f7ee0739056 (release leak detector: hidden tests must never reach students)
"""Part 6 hidden tests: more shapes, seeds and edge cases from the same generators (cases_part6.py)."""
import pytest

from autograder.tests import cases_part6 as C
from autograder.tests.cases_part6 import DecodeCase
from autograder.tests.cases_part2 import one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.part6

SPLITS = [DecodeCase((), 1, 1, 4, 3, seed=1), DecodeCase((2,), 1, 100, 8, 7, seed=2)]
PARTIAL = [DecodeCase((), 3, 50, 8, q_mult=5.0, scale=0.2, seed=3)]
COMBINE = [(DecodeCase((2, 3), 1, 203, 16, seed=4), [0, 203, 0]), (DecodeCase((), 4, 40, 8, seed=5), [1] * 40)]
EMPTY = [DecodeCase((), 1, 0, 8, dtype="float64", seed=6)]
DECODE = [
    DecodeCase((), 1, 1, 16, 3, seed=7),  # one key, three splits
    DecodeCase((2, 2), 1, 1000, 32, 7, seed=8),
    DecodeCase((2,), 4, 203, 16, 5, seed=9),  # several queries, no mask
    DecodeCase((2,), 1, 203, 16, 3, scale=0.1, seed=10),  # the scale argument
    DecodeCase((2,), 1, 97, 8, 6, dtype="float64", seed=11),
    DecodeCase((3,), 1, 64, 16, 64, seed=12),  # one key per segment
]
TRACE = [DecodeCase((2,), 3, 150, 16, 4, seed=13)]


@pytest.mark.parametrize("case", SPLITS, ids=lambda c: c.id)
def test_split_kv_hidden(student, case):
    C.check_split(student, case)


@pytest.mark.parametrize("case", PARTIAL, ids=lambda c: c.id)
def test_attention_partial_hidden(student, case):
    C.check_partial(student, case)


@pytest.mark.parametrize("case,lengths", COMBINE)
def test_combine_partials_hidden(student, case, lengths):
    C.check_combine(student, case, lengths)


@pytest.mark.parametrize("case", EMPTY, ids=lambda c: c.id)
def test_combine_all_empty_hidden(student, case):
    C.check_combine_all_empty(student, case)


@pytest.mark.parametrize("case", DECODE, ids=lambda c: c.id)
def test_flash_decode_hidden(student, case):
    C.check_decode(student, case, hidden=True)


@pytest.mark.parametrize("case", TRACE, ids=lambda c: c.id)
def test_flash_decode_trace_hidden(student, case):
    C.check_decode_trace(student, case)
