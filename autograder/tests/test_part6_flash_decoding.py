"""Part 6 public tests: Flash-Decoding (checks in cases_part6.py).

Peaked inputs (q × 40) throughout: with unit-scale inputs averaging the segment outputs is off by only
~1.5e-2. Split counts 1, 2, 3, 7 and more splits than keys (empty segments).
"""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part6 as C
from autograder.tests.cases_part6 import DecodeCase
from autograder.tests.cases_part2 import one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.part6

SPLITS = [DecodeCase((2, 3), 1, 13, 8, n) for n in (1, 2, 3, 7, 20)]  # 20 > 13 keys: empty segments
PARTIAL = [DecodeCase((2, 3), 1, 203, 16)]
COMBINE = [
    (DecodeCase((2, 3), 1, 203, 16, seed=1), [50, 0, 100, 53]),  # one empty segment among them
    (DecodeCase((2,), 1, 64, 16, seed=2, dtype="float64"), [7, 57]),
]
EMPTY = [DecodeCase((2, 3), 1, 0, 16)]
DECODE = [DecodeCase((2, 3), 1, 203, 16, n, seed=3) for n in (1, 2, 3, 7)] + [
    DecodeCase((2, 3), 1, 5, 16, 8, seed=4),  # more splits than keys
    DecodeCase((2, 3), 1, 203, 16, 4, q_mult=1.0, seed=5),  # unit scale
]
TRACE = [DecodeCase((2, 3), 1, 203, 16, 7, seed=6)]


@cases(*SPLITS)
def test_split_kv(student, case):
    C.check_split(student, case)


@cases(*PARTIAL)
def test_attention_partial(student, case):
    C.check_partial(student, case)


@cases(*COMBINE)  # (case, segment lengths)
def test_combine_partials(student, case):
    C.check_combine(student, *case)


@cases(*EMPTY)
def test_combine_all_empty(student, case):
    C.check_combine_all_empty(student, case)


@cases(*DECODE)
def test_flash_decode(student, case):
    C.check_decode(student, case, hidden=student.hidden)


@cases(*TRACE)
def test_flash_decode_trace(student, case):
    C.check_decode_trace(student, case)
