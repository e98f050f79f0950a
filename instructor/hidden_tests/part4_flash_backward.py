# CANARY-HIDDEN-c534540e4032 (release leak detector: hidden tests must never reach students)
"""Part 4 hidden cases for the checks of autograder/tests/test_part4_flash_backward.py: more shapes, seeds and edge cases."""
from autograder.tests import cases_part4 as C
from autograder.tests.cases_part2 import AttnCase

VALUES = [
    AttnCase((), 20, 20, 8, block_q=64, block_k=64, seed=1),  # N < block
    AttnCase((2,), 203, 203, 16, causal=True, block_q=64, block_k=32, seed=2),
    AttnCase((2,), 113, 203, 16, block_q=16, block_k=48, scale=0.3, seed=3),  # the scale argument
    AttnCase((3,), 203, 1, 16, causal=True, block_q=32, block_k=32, seed=4),  # Nk = 1
    AttnCase((), 1, 203, 16, causal=True, block_q=32, block_k=32, seed=5),  # Nq = 1
    AttnCase((2,), 150, 150, 16, causal=True, block_q=48, block_k=16, seed=6),
    AttnCase((2,), 203, 113, 8, causal=True, block_q=32, block_k=16, dtype="float64", seed=7),
]
MASKED = [AttnCase((2, 2), 150, 37, 8, causal=True, block_q=16, block_k=16, seed=8)]
TRACE = [
    AttnCase((2,), 256, 256, 16, block_q=64, block_k=32, seed=9),  # non-causal: 10·N²·d
    AttnCase((2,), 203, 113, 16, causal=True, block_q=32, block_k=64, seed=10),  # causal Nq > Nk
    AttnCase((2,), 150, 190, 8, causal=True, block_q=32, block_k=24, seed=15),  # block_q ≠ block_k, offset 40
]
APPLY = [AttnCase((2,), 70, 70, 8, block_q=16, block_k=32, scale=0.7, seed=16),
         AttnCase((), 40, 56, 8, causal=True, block_q=8, block_k=16, scale=1.5, dtype="float64", seed=17)]
FUNCTION = [AttnCase((2, 2), 113, 203, 16, causal=True, seed=11), AttnCase((), 97, 97, 8, seed=12)]
SAVES = [AttnCase((), 150, 150, 8, causal=False, block_q=64, block_k=64, seed=13)]
GRADCHECK = [AttnCase((2,), 7, 9, 4, causal=True, block_q=2, block_k=4, dtype="float64", seed=14)]

HIDDEN = {
    "test_backward_values": VALUES,
    "test_backward_fully_masked_rows": MASKED,
    "test_backward_trace": TRACE,
    "test_function_grads": FUNCTION,
    "test_function_apply_scale": APPLY,
    "test_function_saves_o_and_lse": SAVES,
    "test_gradcheck": GRADCHECK,
}
