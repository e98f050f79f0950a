"""Part 6 reference solution: Flash-Decoding (split K/V, partials, combine with ⊕)."""

from __future__ import annotations

import pytest
import torch

from course.reference import attention_plain, attention_reference
from solutions.flash_decoding import attention_partial, combine_partials, flash_decode, split_kv

TIGHT = 1e-12  # float64; observed ~1e-14 on x40 scores (lse values ~100)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _qkv(nk, nq=1, d=16, dv=8, lead=(2, 4), q_scale=40.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = q_scale * torch.randn(*lead, nq, d, generator=g, dtype=dtype)  # x40: peaked attention
    k = torch.randn(*lead, nk, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, nk, dv, generator=g, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("nk", [1, 5, 37, 300])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 400])
def test_flash_decode_matches_reference(nk, splits):
    q, k, v = _qkv(nk)
    o, lse = flash_decode(q, k, v, splits)
    o_ref, lse_ref = attention_reference(q, k, v)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape and o.dtype == q.dtype, "shapes and dtype"
    assert not o.isnan().any() and not lse.isnan().any(), f"no NaN with {splits} splits of {nk} keys"
    assert (o - o_ref).abs().max() < TIGHT, f"o off by {(o - o_ref).abs().max():.1e} ({splits} splits, {nk} keys)"
    assert (lse - lse_ref).abs().max() < TIGHT * 100, "lse (values ~100 at x40: relative 1e-12)"


def test_averaging_would_be_visibly_wrong_on_these_inputs():
    # Guard against a test that cannot fail: with x40 scores the plain average of segment outputs
    # is far from the answer, so the comparison above does catch an averaging combine.
    q, k, v = _qkv(300)
    parts = [attention_partial(q, ks, vs, None) for ks, vs in split_kv(k, v, 4)]
    averaged = torch.stack([o for o, _ in parts]).mean(0)
    assert (averaged - attention_reference(q, k, v)[0]).abs().max() > 0.1, "averaging differs by > 0.1"


def test_float32_tolerance_rule():
    q, k, v = _qkv(203, nq=3, dtype=torch.float32)
    o, lse = flash_decode(q, k, v, 7)
    o_ref, lse_ref = attention_reference(q, k, v)
    o_plain, lse_plain = attention_plain(q, k, v)
    for name, a, p, r in (("o", o, o_plain, o_ref), ("lse", lse, lse_plain, lse_ref)):
        err, err_plain = (a.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain float32 error {err_plain:.2e} + 1e-6"


def test_split_kv_returns_views_in_order():
    q, k, v = _qkv(10)
    segs = split_kv(k, v, 3)
    assert [s[0].shape[-2] for s in segs] == [4, 3, 3], "near-equal contiguous segments"
    assert torch.equal(torch.cat([s[0] for s in segs], dim=-2), k), "segments cover the keys in order"
    for ks, vs in segs:
        assert ks.untyped_storage().data_ptr() == k.untyped_storage().data_ptr(), "k segments are views, not copies"
        assert vs.untyped_storage().data_ptr() == v.untyped_storage().data_ptr(), "v segments are views, not copies"
    empty = split_kv(k, v, 13)
    assert len(empty) == 13 and sum(s[0].shape[-2] for s in empty) == 10, "more splits than keys: empty segments"


def test_empty_segment_and_all_empty_combine():
    q, k, v = _qkv(0)
    o, lse = attention_partial(q, k, v, None)
    assert (o == 0).all() and torch.isneginf(lse).all(), "an empty segment is (o = 0, lse = -inf)"
    o, lse = combine_partials([(o, lse), (o.clone(), lse.clone())])
    assert (o == 0).all() and torch.isneginf(lse).all() and not o.isnan().any(), "all-empty combine: 0, -inf, no NaN"


def test_bad_arguments():
    q, k, v = _qkv(10)
    with pytest.raises(ValueError, match="num_splits"):
        split_kv(k, v, 0)
    with pytest.raises(ValueError, match="at least one"):
        combine_partials([])
    with pytest.raises(ValueError, match="head dim"):
        flash_decode(q[..., :3], k, v, 2)
