# CANARY-HIDDEN-9f7ee0739056 (release leak detector: hidden tests must never reach students)
"""Part 6 hidden cases for the checks of autograder/tests/test_part6_flash_decoding.py: more shapes, seeds and edge cases."""
from autograder.tests import cases_part6 as C
from autograder.tests.cases_part6 import DecodeCase

SPLITS = [DecodeCase((), 1, 1, 4, 3, seed=1), DecodeCase((2,), 1, 100, 8, 7, seed=2)]
PARTIAL = [DecodeCase((), 3, 50, 8, q_mult=5.0, scale=0.2, seed=3), DecodeCase((2,), 2, 77, 8, seed=14, dv=12)]
COMBINE = [(DecodeCase((2, 3), 1, 203, 16, seed=4), [0, 203, 0]), (DecodeCase((), 4, 40, 8, seed=5), [1] * 40)]
EMPTY = [DecodeCase((), 1, 0, 8, dtype="float64", seed=6)]
DECODE = [
    DecodeCase((), 1, 1, 16, 3, seed=7),  # one key, three splits
    DecodeCase((2, 2), 1, 1000, 32, 7, seed=8),
    DecodeCase((2,), 4, 203, 16, 5, seed=9),  # several queries, no mask
    DecodeCase((2,), 1, 203, 16, 3, scale=0.1, seed=10),  # the scale argument
    DecodeCase((2,), 1, 97, 8, 6, dtype="float64", seed=11),
    DecodeCase((3,), 1, 64, 16, 64, seed=12),  # one key per segment
    DecodeCase((2,), 1, 150, 16, 4, seed=15, dv=40),  # v's head dim differs
]
TRACE = [DecodeCase((2,), 3, 150, 16, 4, seed=13)]

HIDDEN = {
    "test_split_kv": SPLITS,
    "test_attention_partial": PARTIAL,
    "test_combine_partials": COMBINE,
    "test_combine_all_empty": EMPTY,
    "test_flash_decode": DECODE,
    "test_flash_decode_trace": TRACE,
}
