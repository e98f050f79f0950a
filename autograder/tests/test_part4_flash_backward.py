"""Part 4 public tests: flash_backward, FlashAttentionFunction, flash_attention (checks in cases_part4.py).

flash_backward gets the grader's o and lse, and the Function runs with a correct forward in place of
part 2's, so part 4 is graded independently of part 2.
"""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part4 as C
from autograder.tests import diagnose as dg
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


@cases(*VALUES, diagnosis=dg.hidden_backward)
def test_backward_values(student, case):
    """flash_backward's dq, dk, dv against float64 autograd through dense attention, then the structure of the same replay (§7)."""
    C.check_backward_values(student, case, hidden=student.hidden)


@cases(*MASKED, diagnosis=dg.hidden_backward)
def test_backward_fully_masked_rows(student, case):
    """Causal with Nq > Nk: no NaN in any gradient, and dq = 0 in the rows that attend no key (§4.4, §7)."""
    C.check_masked_rows_grads(student, case)


@cases(*TRACE)
def test_backward_trace(student, case):
    """flash_backward's structure: no fused op, no Nq × Nk storage, matmul FLOPs 2.5× the forward's (visible blocks only), then its gradients (§7)."""
    C.check_backward_trace(student, case)


@cases(*FUNCTION, diagnosis=dg.hidden_backward)
def test_function_grads(student, case):
    """flash_attention(...).backward(dO) through the autograd Function against float64 gradients, then the structure of its backward (§7)."""
    C.check_function_grads(student, case, hidden=student.hidden)


@cases(*APPLY, diagnosis=dg.hidden_backward)
def test_function_apply_scale(student, case):
    """FlashAttentionFunction.apply with an explicit scale: the scale reaches forward and backward, a tiled backward (§7)."""
    C.check_function_apply(student, case, hidden=student.hidden)


@cases(*SAVES)
def test_function_saves_o_and_lse(student, case):
    """FlashAttentionFunction keeps q, k, v, o and lse for its backward, nothing of size Nq × Nk, and its backward recomputes P (§7.2)."""
    C.check_function_saves(student, case)


@cases(*GRADCHECK, diagnosis=dg.hidden_backward)
def test_gradcheck(student, case):
    """torch.autograd.gradcheck of the Function in float64 on small ragged shapes, then the structure of its backward (§7)."""
    C.check_gradcheck(student, case)
