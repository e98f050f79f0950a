"""Part 4 public tests: flash_backward, FlashAttentionFunction, flash_attention (checks in cases_part4.py).

flash_backward gets the grader's o and lse, and the Function runs with a correct forward in place of
part 2's, so part 4 is graded independently of part 2.
"""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part4 as C
from autograder.tests.cases_part2 import AttnCase
from autograder.tests.cases_part2 import one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.part4

VALUES = [
    AttnCase((), 1, 1, 8),  # N = 1
    AttnCase((2,), 113, 113, 16, block_q=32, block_k=32),  # ragged, non-causal
    AttnCase((2, 3), 113, 203, 16, causal=True, block_q=32, block_k=64),  # Nq < Nk: bottom-right
    AttnCase((2,), 203, 113, 16, causal=True, block_q=64, block_k=32),  # Nq > Nk: fully masked rows
    AttnCase((1, 2), 70, 70, 8, causal=True, block_q=32, block_k=32, dtype="float64"),  # float64 is tight
]
MASKED = [AttnCase((2,), 203, 113, 16, causal=True, block_q=32, block_k=32)]
TRACE = [
    AttnCase((2,), 256, 256, 16, causal=True, block_q=32, block_k=32),  # 36 of 64 pairs, ×2.5
    AttnCase((2,), 200, 236, 16, causal=True, block_q=48, block_k=32),  # block_q ≠ block_k, offset 36 unaligned
]
FUNCTION = [
    AttnCase((2,), 150, 150, 16, causal=True),  # default blocks 64: ragged third block
    AttnCase((2,), 203, 113, 16, causal=True),  # fully masked rows through autograd
]
APPLY = [AttnCase((2,), 96, 80, 16, causal=True, block_q=32, block_k=16, scale=0.3)]  # scale through the Function
SAVES = [AttnCase((2,), 128, 128, 16, causal=True, block_q=32, block_k=32)]
GRADCHECK = [
    AttnCase((1,), 9, 7, 4, causal=True, block_q=4, block_k=3, dtype="float64"),  # Nq > Nk, masked rows
    AttnCase((2,), 7, 9, 4, causal=False, block_q=3, block_k=4, dtype="float64"),
]


@cases(*VALUES)
def test_backward_values(student, case):
    C.check_backward_values(student, case, hidden=student.hidden)


@cases(*MASKED)
def test_backward_fully_masked_rows(student, case):
    C.check_masked_rows_grads(student, case)


@cases(*TRACE)
def test_backward_trace(student, case):
    C.check_backward_trace(student, case)


@cases(*FUNCTION)
def test_function_grads(student, case):
    C.check_function_grads(student, case, hidden=student.hidden)


@cases(*APPLY)
def test_function_apply_scale(student, case):
    C.check_function_apply(student, case, hidden=student.hidden)


@cases(*SAVES)
def test_function_saves_o_and_lse(student, case):
    C.check_function_saves(student, case)


@cases(*GRADCHECK)
def test_gradcheck(student, case):
    C.check_gradcheck(student, case)
