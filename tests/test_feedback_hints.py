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
