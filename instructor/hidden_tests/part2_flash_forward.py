# CANARY-HIDDEN-5bc875b26663 (release leak detector: hidden tests must never reach students)
"""Part 2 hidden cases for the checks of autograder/tests/test_part2_flash_forward.py: more shapes, seeds and edge cases.

Most of them are peaked (q × 40: a row's scores span hundreds): there only the running max keeps exp in
range, so a forward that shifts by anything else (a fixed bound, the first tile's max, no shift) under- or
overflows, while on unpeaked scores such a forward is right to rounding. Unpeaked: Nk = 1, float64, the
scale argument (a peaked row hides a wrong scale), the masked rows, and the public cases (whose diagnosis
compares candidate bugs on the case's own inputs)."""
from autograder.tests import cases_part2 as C
from autograder.tests.cases_part2 import AttnCase

VALUES = [
    AttnCase((), 1, 203, 16, causal=True, block_q=32, block_k=32, q_mult=40.0, seed=1),  # decode-like Nq = 1
    AttnCase((3,), 203, 1, 16, causal=True, block_q=32, block_k=32, seed=2),  # Nk = 1: one row sees a key
    AttnCase((2,), 113, 113, 16, causal=True, block_q=64, block_k=64, q_mult=40.0, seed=3),  # peaked: a shift other than the running max under/overflows
    AttnCase((2,), 203, 113, 16, causal=True, block_q=32, block_k=64, q_mult=40.0, seed=4),  # masked rows, mixed blocks
    AttnCase((2, 2), 64, 128, 32, causal=True, block_q=64, block_k=64, q_mult=40.0, seed=5),  # blocks dividing N, peaked
    AttnCase((2,), 113, 203, 16, block_q=16, block_k=48, scale=0.3, seed=6),  # the scale argument
    AttnCase((2,), 150, 150, 16, causal=True, block_q=32, block_k=32, q_mult=20.0, seed=7),  # peaked, causal
    AttnCase((2,), 203, 113, 8, causal=True, block_q=32, block_k=16, dtype="float64", seed=8),
    AttnCase((), 1023, 1023, 8, causal=True, block_q=128, block_k=64, q_mult=40.0, seed=9),  # long, ragged by one row, peaked
    AttnCase((2, 3), 33, 17, 4, block_q=8, block_k=8, q_mult=40.0, seed=10),
    AttnCase((2,), 90, 90, 8, block_q=32, block_k=16, dv=24, seed=17),  # v's head dim is not q's
]
MASKED = [AttnCase((2, 2), 150, 37, 8, causal=True, block_q=16, block_k=16, seed=11)]
TRACE = [
    AttnCase((2,), 113, 203, 16, causal=True, block_q=32, block_k=64, q_mult=40.0, seed=12),  # causal Nq < Nk, peaked
    AttnCase((2,), 203, 113, 16, causal=True, block_q=64, block_k=32, q_mult=40.0, seed=13),  # causal Nq > Nk
    AttnCase((), 384, 320, 16, causal=True, block_q=48, block_k=40, q_mult=40.0, seed=14),  # odd block sizes, peaked
    AttnCase((), 96, 768, 8, causal=True, block_q=48, block_k=24, q_mult=40.0, seed=16),  # long rows: a row panel is 5× the peak
]

HIDDEN = {
    "test_forward_values": VALUES,
    "test_fully_masked_rows": MASKED,
    "test_forward_trace": TRACE,
}
