"""course.reference against torch's own float64 math: the references every other test trusts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course.reference import (
    attention_plain,
    attention_reference,
    causal_mask,
    logsumexp_reference,
    softmax_reference,
)

# (Nq, Nk): square, both rectangular directions (bottom-right vs top-left differ only there), N = 1
SHAPES = [(1, 1), (1, 7), (7, 1), (16, 16), (13, 29), (29, 13)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _qkv(nq, nk, d=8, dv=5, lead=(2, 3), seed=0, dtype=torch.float64, scale_q=1.0):
    g = torch.Generator().manual_seed(seed)
    q = scale_q * torch.randn(*lead, nq, d, generator=g, dtype=dtype)
    k = torch.randn(*lead, nk, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, nk, dv, generator=g, dtype=dtype)
    return q, k, v


def _bottom_right(nq: int, nk: int) -> torch.Tensor:
    """The bottom-right mask built a second, independent way: the lower triangle shifted right by
    Nk - Nq (torch.tril's diagonal offset), so the SDPA comparisons do not trust causal_mask."""
    return torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)


def test_causal_mask_is_bottom_right():
    m = causal_mask(3, 5)
    # query i may attend key j iff j <= i + (Nk - Nq) = i + 2
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected), "causal_mask must be bottom-right aligned: j <= i + (Nk - Nq)"
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril()), "Nq == Nk: lower triangle"
    assert not causal_mask(5, 2)[:3].any(), "with Nq > Nk the first Nq - Nk queries may attend no key"
    for nq, nk in SHAPES:
        assert torch.equal(causal_mask(nq, nk), _bottom_right(nq, nk)), f"causal_mask({nq}, {nk}) is not bottom-right"


@pytest.mark.parametrize("nq,nk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_reference_matches_sdpa_float64(nq, nk, causal):
    q, k, v = _qkv(nq, nk, scale_q=3.0)
    o, lse = attention_reference(q, k, v, causal=causal)
    mask = _bottom_right(nq, nk) if causal else None
    if causal and nq == nk:  # SDPA's own is_causal (top-left) coincides with bottom-right here
        o_sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        o_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # Both are float64 straightforward evaluations: differences are a few ulps of O(1) values.
    assert o.dtype == torch.float64 and o.shape == (2, 3, nq, 5) and lse.shape == (2, 3, nq)
    assert torch.allclose(o, o_sdpa, atol=1e-12, rtol=0), (
        f"attention_reference o differs from SDPA by {(o - o_sdpa).abs().max():.1e} (causal={causal}, Nq={nq}, Nk={nk})"
    )
    s = (q @ k.transpose(-2, -1)) / 8**0.5
    if causal:
        s = s.masked_fill(~mask, float("-inf"))
    expected_lse = torch.logsumexp(s, dim=-1)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse)), "lse = -inf exactly on fully masked rows"
    finite = torch.isfinite(expected_lse)
    assert torch.allclose(lse[finite], expected_lse[finite], atol=1e-12, rtol=0), (
        "lse must be the natural-log logsumexp of the scaled, masked scores (torch.logsumexp)"
    )


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = _qkv(9, 4)
    o, lse = attention_reference(q, k, v, causal=True)
    assert not o.isnan().any() and not lse.isnan().any(), "no NaN anywhere"
    assert (o[..., :5, :] == 0).all(), "rows that may attend no key have o = 0"
    assert torch.isneginf(lse[..., :5]).all() and torch.isfinite(lse[..., 5:]).all(), "their lse is -inf, others finite"


def test_explicit_scale_and_large_scores():
    q, k, v = _qkv(13, 29, scale_q=40.0)  # peaked scores: exp would overflow without max-shifting
    o, lse = attention_reference(q, k, v, scale=0.3)
    o_sdpa = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert torch.isfinite(o).all() and torch.allclose(o, o_sdpa, atol=1e-12, rtol=0), "scale=0.3 and x40 scores"


@pytest.mark.parametrize("causal", [False, True])
def test_attention_plain_keeps_dtype_and_matches_reference(causal):
    q, k, v = _qkv(13, 29, dtype=torch.float32)
    o32, lse32 = attention_plain(q, k, v, causal=causal)
    o64, lse64 = attention_reference(q, k, v, causal=causal)
    assert o32.dtype == torch.float32 and lse32.dtype == torch.float32, "attention_plain computes in the input dtype"
    # float32 plain attention on O(1) inputs: errors of a few 1e-7 (float32 epsilon 1.2e-7).
    assert (o32.double() - o64).abs().max() < 1e-5, "attention_plain float32 strays from the float64 reference"
    assert torch.equal(torch.isneginf(lse32), torch.isneginf(lse64)), "attention_plain: lse = -inf on the same rows"
    finite = torch.isfinite(lse64)
    assert (lse32.double() - lse64)[finite].abs().max() < 1e-5, "attention_plain lse strays from the float64 reference"


@pytest.mark.parametrize("nq,nk", [(13, 29), (29, 13)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_plain_gradients_match_sdpa_autograd(nq, nk, causal):
    q, k, v = (t.requires_grad_() for t in _qkv(nq, nk, lead=(2,)))
    do = torch.randn(2, nq, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(attention_plain(q, k, v, causal=causal)[0], (q, k, v), do)
    mask = causal_mask(nq, nk) if causal else None
    ref = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), do)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert not a.isnan().any(), f"{name} has NaN (fully masked rows must give zero gradient)"
        assert torch.allclose(a, b, atol=1e-12, rtol=0), f"{name} of attention_plain differs from SDPA autograd"


@pytest.mark.parametrize("causal", [False, True])
def test_attention_plain_gradcheck(causal):
    q, k, v = (t.requires_grad_() for t in _qkv(5, 3, d=3, dv=2, lead=(2,)))
    assert torch.autograd.gradcheck(lambda q, k, v: attention_plain(q, k, v, causal=causal)[0], (q, k, v))


def test_softmax_and_logsumexp_references():
    g = torch.Generator().manual_seed(0)
    x = 30 * torch.randn(4, 6, 50, generator=g, dtype=torch.float64)
    # exp(x - lse) vs exp(x - max) / sum: equal in exact math, a few ulps apart in float64.
    assert torch.allclose(softmax_reference(x), torch.softmax(x, -1), atol=1e-14, rtol=0), "softmax_reference"
    # logsumexp_reference wraps torch.logsumexp: check it against the max-shifted formula (§4.2)
    # written out, which can only agree if it is the natural log of the sum of exps of x.
    m = x.amax(-1, keepdim=True)
    by_hand = (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)
    assert torch.allclose(logsumexp_reference(x), by_hand, atol=1e-13, rtol=0), "logsumexp_reference: m + log Σ e^(x-m)"
    assert logsumexp_reference(x.float()).dtype == torch.float64, "the references compute in float64"
    empty = torch.full((2, 3), float("-inf"))
    assert (softmax_reference(empty) == 0).all(), "an all -inf row has softmax 0 in the course convention"
    assert torch.isneginf(logsumexp_reference(empty)).all(), "and logsumexp -inf"


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((2, 4, 8), (2, 5, 6), (2, 5, 6)), "head dim"),
        (((2, 4, 8), (2, 5, 8), (2, 6, 8)), "number of keys"),
        (((2, 4, 8), (3, 5, 8), (3, 5, 8)), "leading dims"),
        (((8,), (5, 8), (5, 8)), "shape"),
    ],
)
def test_bad_shapes_give_one_line_errors(shapes, match):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=match) as info:
        attention_reference(q, k, v)
    assert "\n" not in str(info.value), "errors are one line"
