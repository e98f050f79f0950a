"""Part 6 public tests: Flash-Decoding (checks in cases_part6.py).

Peaked inputs (q × 40) throughout: with unit-scale inputs averaging the segment outputs is off by only
~1.5e-2. Split counts 1, 2, 3, 7 and more splits than keys (empty segments).
"""
from functools import partial

import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part6 as C
from autograder.tests import diagnose as dg
from autograder.tests.cases_part6 import DecodeCase
from autograder.tests.cases_part2 import one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.part6

SPLITS = [DecodeCase((2, 3), 1, 13, 8, n) for n in (1, 2, 3, 7, 20)] + [  # 20 > 13 keys: empty segments
    DecodeCase((), 1, 13, 8, 3)]  # no leading dims: the keys are dim -2, never a fixed dim
PARTIAL = [DecodeCase((2, 3), 1, 203, 16), DecodeCase((2, 3), 1, 203, 16, seed=7, dv=8)]  # dv != d: the scale is q's
COMBINE = [
    (DecodeCase((2, 3), 1, 203, 16, seed=1), [50, 0, 100, 53]),  # one empty segment among them
    (DecodeCase((2,), 1, 64, 16, seed=2, dtype="float64"), [7, 57]),
]
EMPTY = [DecodeCase((2, 3), 1, 0, 16)]
DECODE = [DecodeCase((2, 3), 1, 203, 16, n, seed=3) for n in (1, 2, 3, 7)] + [
    DecodeCase((2, 3), 1, 5, 16, 8, seed=4),  # more splits than keys
    DecodeCase((2, 3), 1, 203, 16, 4, q_mult=1.0, seed=5),  # unit scale
    DecodeCase((2, 3), 1, 203, 16, 3, seed=8, dv=24),  # v's head dim differs from q's and k's
    DecodeCase((), 1, 64, 16, 3, seed=9),  # no leading dims
]
TRACE = [DecodeCase((2, 3), 1, 203, 16, 7, seed=6)]


@cases(*SPLITS)
def test_split_kv(student, case):
    """split_kv(k, v, num_splits): num_splits pairs in key order that cover every key once, as views of k and v (§8.4)."""
    C.check_split(student, case)


@cases(*PARTIAL, diagnosis=dg.hidden_partial)
def test_attention_partial(student, case):
    """attention_partial: (o, lse) of one segment of keys against float64 attention (§8.4)."""
    C.check_partial(student, case)


@cases(*COMBINE, diagnosis=dg.hidden_combine)  # (case, segment lengths)
def test_combine_partials(student, case):
    """combine_partials: ⊕ of the segments' (o, lse) equals attention over all their keys (§8.4)."""
    C.check_combine(student, *case)


@cases(*EMPTY, diagnosis=dg.hidden_combine)
def test_combine_all_empty(student, case):
    """combine_partials of empty segments only: o = 0 and lse = -inf, no NaN (§4.4)."""
    C.check_combine_all_empty(student, case)


@cases(*DECODE, diagnosis=dg.hidden_decode)
def test_flash_decode(student, case):
    """flash_decode: split, attend per segment, combine; o and lse against float64 attention (§8.4)."""
    C.check_decode(student, case, hidden=student.hidden)


@cases(*TRACE, diagnosis=dg.hidden_decode)
def test_flash_decode_trace(student, case):
    """flash_decode's structure: no fused op, matmul FLOPs within the split's bounds, no matmul over all the keys, then its o (§8.4)."""
    C.check_decode_trace(student, case)
