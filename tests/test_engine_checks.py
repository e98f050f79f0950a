"""Engine self-tests: check_close / check / unpack (the uniform feedback of every assignment test)."""
from __future__ import annotations

import pytest
import torch

from autograder.engine.checks import FLOAT64_ATOL, CheckFailure, check, check_close, check_tensor, unpack


def ref_and_plain(seed=0, n=200):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, n, generator=g, dtype=torch.float64)
    expected = torch.softmax(x, -1)
    plain = torch.softmax(x.float(), -1)
    return x, expected, plain


def test_plain_rule_passes_a_correct_float32_result():
    x, expected, plain = ref_and_plain()
    # a different but correct float32 computation (exp / sum in another order)
    e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
    actual = e / e.sum(-1, keepdim=True)
    check_close(actual, expected, what="softmax", inputs={"x": x.float()}, plain=plain)


def test_plain_rule_fails_with_structured_fields():
    x, expected, plain = ref_and_plain()
    actual = plain.clone()
    actual[2, 17] += 1e-3
    with pytest.raises(CheckFailure) as info:
        check_close(actual, expected, what="softmax(x)", inputs={"x": x.float(), "causal": True}, plain=plain,
                    hint="subtract the max")
    f = info.value
    assert f.index == (2, 17) and f.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert f.inputs == {"x": "(4, 200) float32", "causal": "True"}
    msg = f.message()
    for piece in ("checked: softmax(x)", "inputs: x (4, 200) float32", "at [2, 17]", "max rel error",
                  "allowed: 2 × plain float32 error", "hint: subtract the max"):
        assert piece in msg, piece
    assert f.as_dict()["index"] == [2, 17]


def test_float64_is_tight():
    x = torch.randn(10, dtype=torch.float64)
    check_close(x + 5e-11, x, what="x", dtype=torch.float64)
    with pytest.raises(CheckFailure):
        check_close(x + 3 * FLOAT64_ATOL, x, what="x", dtype=torch.float64)


@pytest.mark.parametrize("actual,kind", [
    ((torch.zeros(3),), "type"),
    (torch.zeros(3, dtype=torch.float64), "dtype"),
    (torch.zeros(4), "shape"),
    (torch.tensor([0.0, float("nan"), 0.0]), "nonfinite"),
    (torch.tensor([0.0, 0.0, 0.0]), "nonfinite"),  # expected -inf at index 2
    (torch.tensor([0.0, 0.0, float("inf")]), "nonfinite"),  # +inf is not -inf
])
def test_type_dtype_shape_and_nonfinite(actual, kind):
    expected = torch.tensor([0.0, 0.0, float("-inf")], dtype=torch.float64)
    with pytest.raises(CheckFailure) as info:
        check_close(actual, expected, what="t", dtype=torch.float32)
    assert info.value.kind == kind


def test_matching_infinities_pass_and_rtol_rule():
    expected = torch.tensor([1.0, 100.0, float("-inf")], dtype=torch.float64)
    check_close(torch.tensor([1.0, 100.001, float("-inf")]), expected, what="t", atol=0.0, rtol=1e-5)
    with pytest.raises(CheckFailure) as info:
        check_close(torch.tensor([1.001, 100.0, float("-inf")]), expected, what="t", atol=0.0, rtol=1e-5)
    assert info.value.index == (0,)


def test_check_and_unpack():
    check(True, what="fine")
    for falsy_but_wrong in (False, 1, "yes", torch.tensor(True)):
        with pytest.raises(CheckFailure):
            check(falsy_but_wrong, what="must be exactly True")
    assert unpack([1, 2], 2, what="pair") == (1, 2)
    with pytest.raises(CheckFailure, match="expected a tuple of 2 values, got a tuple of length 3"):
        unpack((1, 2, 3), 2, what="pair")
    with pytest.raises(CheckFailure, match="got a Tensor"):
        unpack(torch.zeros(2), 2, what="pair")


def test_a_lying_object_cannot_pass():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    liar = torch.zeros(3).as_subclass(Liar)
    with pytest.raises(CheckFailure, match="got a Liar"):
        check_close(liar, torch.ones(3, dtype=torch.float64), what="t")


@pytest.mark.parametrize("value, kind, says", [
    (None, "type", "expected a tensor of shape (2, 3), got a NoneType"),
    ([[0.0] * 3] * 2, "type", "got a list"),
    (torch.nn.Parameter(torch.zeros(2, 3)), "type", "got a Parameter"),
    (torch.zeros(2, 3, dtype=torch.bool), "dtype", "dtype bool, expected float32"),
    (torch.zeros(2, 3, dtype=torch.complex64), "dtype", "dtype complex64, expected float32"),
    (torch.zeros(()), "shape", "shape (), expected (2, 3)"),
    (torch.zeros(1, 2, 3), "shape", "shape (1, 2, 3), expected (2, 3)"),
])
def test_check_tensor_names_the_type_dtype_or_shape(value, kind, says):
    """What a check validates before it computes with a result (a bool tensor has no abs(), a 0-d one no dim -1)."""
    with pytest.raises(CheckFailure) as info:
        check_tensor(value, what="o", shape=(2, 3), dtype=torch.float32)
    assert info.value.kind == kind and says in info.value.message()
    t = torch.zeros(2, 3)
    assert check_tensor(t, what="o", shape=torch.Size([2, 3]), dtype=torch.float32) is t
    assert check_tensor(t, what="o") is t  # shape and dtype are optional


def test_a_hint_that_names_nothing_comes_last_and_a_cut_keeps_whole_words():
    """A student's hidden-test hint was the probes' list of what passed, cut mid-word, and nothing else
    (the clause that named the pattern came after it and was cut). A clause that names nothing goes
    last, and a line is cut at a word, with an ellipsis."""
    from autograder.engine import sanitize
    from autograder.engine.checks import NAMES_NOTHING, join_hints

    joined = join_hints(f"{NAMES_NOTHING}: all 3 probes are correct (a, b, c)", "rescale acc by exp(m_old - m_new)")
    assert joined.startswith("rescale acc") and joined.endswith("(a, b, c)")
    cut = sanitize.line("causal, Q blocks whose last visible key opens a K/V block " * 4, 100)
    assert len(cut) <= 100 and cut.endswith("…") and cut[:-1].split()[-1] in "causal, Q blocks whose last visible key opens a K/V block".split()
    assert sanitize.line("x" * 300, 100) == "x" * 99 + "…"  # no space to cut at: the limit
