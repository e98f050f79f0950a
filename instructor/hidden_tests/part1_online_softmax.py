# CANARY-HIDDEN-2e4a1e4883ed (release leak detector: hidden tests must never reach students)
"""Part 1 hidden cases: the public checks (autograder/tests/test_part1_online_softmax.py) on more
shapes, seeds and edge cases."""
from dataclasses import replace

from autograder.tests import cases_part1 as C

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
    C.RowsCase((2, 3, 50), "float64", seed=110, spread=300.0),  # rows 300 apart: each row's own max
]
MERGES = [
    C.MergeCase(C.RowsCase((2, 3, 77), "float32", seed=110), split=76, dv=5),
    C.MergeCase(C.RowsCase((5, 64), "float32", seed=111, mult=40.0, shift=1000.0), split=32, dv=16),
    C.MergeCase(C.RowsCase((4, 40), "float64", seed=112), split=40),  # empty right side
    C.MergeCase(C.RowsCase((8, 30), "float64", seed=113, neg_inf="rows"), split=3, dv=1),
    C.MergeCase(C.RowsCase((6, 50), "float32", seed=114, neg_inf="some", mult=40.0), split=25, dv=4),
]

# The one-pass check's designated input for the hidden cases (cases_part1.check_streams): another shape than the
# public STREAM, still rows of N >= 64 (tiles of 32 <= N/2 pass, a dense pass of N - 1 >= 79 columns fails).
STREAM = C.RowsCase((4, 80), "float64", seed=130, mult=3.0)


def streamed(cases):
    return [replace(c, stream=STREAM) for c in cases]


HIDDEN = {
    "test_naive_softmax": [c for c in ROWS if c.naive_ok],
    "test_safe_softmax": ROWS,
    "test_online_summary": streamed([*ROWS, C.RowsCase((3, 0), "float32", seed=115)]),
    # the long rows (1000 and 1024 columns) once, in the summary, where ℓ's rounding grows with N: online_softmax's
    # own step is the normalising pass, and its replays of those rows cost more than all its other cases
    "test_online_softmax": streamed([c for c in ROWS if c.shape[-1] < 1000]),
    "test_merge_summary": MERGES,
    "test_merge_partial": MERGES,
    "test_merge_identity": [dict(dtype="float32", lead=(2, 3), seed=7), dict(dtype="float64", lead=(2, 3), seed=7)],
    "test_merge_commutative_associative": [16],
    # near -800 every exp(x) underflows float64 to 0: only a max-shifted sum is not 0 / 0
    "test_pass_counts": [dict(which="naive", n=1, seed=120), dict(which="safe", n=4096, seed=121, shift=-800.0),
                         dict(which="online", n=4096, seed=122, shift=-800.0)],
    "test_rebase_count": [dict(n=4096, seed=123, order="random"), dict(n=300, seed=124, order="increasing"),
                          dict(n=300, seed=125, order="decreasing"), dict(n=1, seed=126, order="random"),
                          dict(n=500, seed=127, order="ties")],
}
