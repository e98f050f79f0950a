"""The hints that feedback adds to what a check or an exception says (engine/checks.join_hints,
engine/errors.exception_hint): on the messages torch itself raises, not on hand-written copies."""
import math

import pytest
import torch

from autograder.engine.checks import join_hints
from autograder.engine.errors import exception_hint


def _raised(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 -- the message is what is under test
        return f"flash_forward raised {type(exc).__name__}: {str(exc).splitlines()[0]} (flash_forward.py:12)"
    raise AssertionError("expected an exception")


@pytest.mark.parametrize("make, says", [
    (lambda: torch.zeros(2, 3) @ torch.zeros(3, 2, dtype=torch.float64), "different dtypes"),
    (lambda: torch.zeros(2, 0).amax(-1), "empty dim"),
    (lambda: torch.zeros(2, 3) + torch.zeros(2, 4), "shapes do not fit"),
    (lambda: torch.zeros(2, 3) @ torch.zeros(4, 2), "shapes do not fit"),
    (lambda: torch.zeros(3)[5], "index past the end"),
    (lambda: math.exp(1000.0), "math.exp overflows"),
])
def test_an_exception_of_student_code_gets_the_hint_of_what_it_means(make, says):
    assert says in (exception_hint(_raised(make)) or "")


def test_an_exception_nobody_foresaw_gets_no_hint():
    assert exception_hint("kv_cache.update raised ValueError: KV cache overflow (kv_cache.py:67)") is None


def test_hints_say_each_clause_once():
    assert join_hints("a; b", None, "b", "") == "a; b"
    # a finding that leads with where it failed, then the check's own hint: said once, the longer form
    assert join_hints("wrong with one tile (lse wrong): lse = m + log ℓ", "lse = m + log ℓ") == \
        "wrong with one tile (lse wrong): lse = m + log ℓ"
    assert join_hints("x", "found: x", "y") == "found: x; y"


def test_a_shape_error_says_the_sizes_and_names_ragged_blocks_only_where_there_are_blocks():
    """An uncatalogued bug, combine_partials reducing lse over the wrong dim, got the hint "a ragged last
    block ... unsqueeze(-1)": neither applies to a function without blocks. The hint now says the sizes
    torch reported, leads with the wrong reduction dim, and adds the ragged block in tiled functions only."""
    line = ("The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0 "
            "(flash_decoding.py:74)")
    plain = exception_hint(f"combine_partials raised RuntimeError: {line}")
    tiled = exception_hint(f"flash_forward raised RuntimeError: {line}")
    assert "sizes 3 and 2 meet along dim 0" in plain and "wrong dim" in plain and "ragged" not in plain
    assert "ragged last block" in tiled
