"""Part 1 reference solution: naive / safe / online softmax, the summary (m, ℓ) and the merge ⊕."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.counting import ReadCounter
from course.reference import attention_reference
from solutions.online_softmax import (
    merge_partial,
    merge_summary,
    naive_softmax,
    naive_softmax_counted,
    online_softmax,
    online_softmax_counted,
    online_summary,
    safe_softmax,
    safe_softmax_counted,
)

NEG_INF = float("-inf")
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True)  # derandomize: same examples every run


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _x(*shape, scale=1.0, seed=0, dtype=torch.float64):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------------- softmaxes
@pytest.mark.parametrize("fn", [naive_softmax, safe_softmax, online_softmax])
@pytest.mark.parametrize("shape", [(7,), (3, 1), (2, 3, 17)])
def test_softmaxes_match_torch_on_moderate_inputs(fn, shape):
    x = _x(*shape, scale=3.0)
    out = fn(x)
    assert out.shape == x.shape and out.dtype == x.dtype, f"{fn.__name__} keeps shape and dtype"
    # float64, values up to ~10: exact-math-equal formulas differ by a few ulps.
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-14, rtol=0), f"{fn.__name__} differs from torch.softmax"


def test_naive_overflows_where_safe_and_online_do_not():
    x = torch.tensor([[10.0, 90.0, 100.0]], dtype=torch.float32)  # exp(90) > float32 max (threshold 88.72)
    assert naive_softmax(x).isnan().any(), "the naive softmax must overflow (inf/inf = nan) above 88.7 in float32"
    for fn in (safe_softmax, online_softmax):
        out = fn(x)
        assert torch.isfinite(out).all(), f"{fn.__name__} must not overflow"
        assert torch.allclose(out.double(), torch.softmax(x.double(), -1), atol=1e-6), f"{fn.__name__} value"


@pytest.mark.parametrize("fn", [safe_softmax, online_softmax])
def test_all_minus_inf_row_gives_zeros(fn):
    x = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [0.0, NEG_INF, 1.0]], dtype=torch.float64)
    out = fn(x)
    assert not out.isnan().any(), f"{fn.__name__}: an all -inf row must not give NaN"
    assert (out[0] == 0).all(), f"{fn.__name__}: an all -inf row gives zeros"
    assert torch.allclose(out[1], torch.softmax(x[1], -1), atol=1e-15), "-inf entries get probability 0"


def test_online_summary_is_max_and_rebased_sum():
    x = _x(4, 5, 33, scale=20.0)
    m, l = online_summary(x)
    assert m.shape == (4, 5) and l.shape == (4, 5), "summary drops the last dim"
    assert torch.equal(m, x.amax(-1)), "m is exactly the row max"
    assert torch.allclose(m + torch.log(l), torch.logsumexp(x, -1), atol=1e-13, rtol=0), "m + log ℓ = logsumexp"
    m0, l0 = online_summary(torch.empty(3, 0, dtype=torch.float64))
    assert torch.isneginf(m0).all() and (l0 == 0).all(), "an empty row is the identity (-inf, 0)"


def test_online_summary_reads_each_column_once():
    # One streaming pass (§4.3): record, through __torch_function__, which columns are indexed.
    seen = []

    class Spy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__getitem__:
                seen.append(args[1])
            return super().__torch_function__(func, types, args, kwargs or {})

    x = _x(2, 6).as_subclass(Spy)
    online_summary(x)
    columns = [idx[-1] for idx in seen if isinstance(idx, tuple) and isinstance(idx[-1], int)]
    assert columns == list(range(6)), f"online_summary must read columns 0..N-1 once each, in order; read {columns}"


# --------------------------------------------------------------------------------- counted
def test_counted_variants_make_2_3_2_passes_and_match():
    values = _x(4096).tolist()
    expected = torch.softmax(torch.tensor(values, dtype=torch.float64), -1)
    for fn, passes in ((naive_softmax_counted, 2), (safe_softmax_counted, 3), (online_softmax_counted, 2)):
        counter = ReadCounter(values)
        result = fn(counter)
        probs = result[0] if isinstance(result, tuple) else result
        assert counter.reads == passes * 4096, f"{fn.__name__}: {counter.reads / 4096} passes, expected {passes}"
        assert torch.allclose(torch.tensor(probs, dtype=torch.float64), expected, atol=1e-15), f"{fn.__name__} values"


def test_online_counted_rebases():
    assert online_softmax_counted(ReadCounter([1.0, 2.0, 3.0, 4.0]))[1] == 3, "increasing data rebases each time"
    assert online_softmax_counted(ReadCounter([4.0, 3.0, 2.0, 1.0]))[1] == 0, "the first element is not a rebase"
    assert online_softmax_counted(ReadCounter([2.0, 2.0, 1.0]))[1] == 0, "a tie does not raise the max"
    # Random order: rebases average Σ_{k=2}^N 1/k (≈ 4.19 at N = 128). Over 200 independent
    # permutations the mean is within ~0.15 (sd of one count ≈ 1.6 / sqrt(200)); assert ±0.6.
    g = torch.Generator().manual_seed(0)
    counts = [online_softmax_counted(ReadCounter(torch.randperm(128, generator=g).double()))[1] for _ in range(200)]
    expected = sum(1 / k for k in range(2, 129))
    assert abs(sum(counts) / len(counts) - expected) < 0.6, "rebases on random data average Σ 1/k"


def test_naive_counted_overflows():
    out = naive_softmax_counted(ReadCounter([1000.0, 1.0]))
    assert math.isnan(out[0]), "naive counted softmax overflows like the tensor one (inf / inf = nan)"


def test_read_counter_refuses_slices():
    with pytest.raises(TypeError, match="one integer index"):
        ReadCounter([1.0, 2.0])[0:1]


# --------------------------------------------------------------------------------- merge ⊕
def _summary(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return online_summary(torch.tensor(values, dtype=torch.float64))


def _logz(s) -> float:
    m, l = s
    return float(m + torch.log(l)) if l > 0 else NEG_INF


segments = st.lists(st.floats(-300, 300, allow_nan=False), min_size=0, max_size=6)


@PROPERTY
@given(segments, segments, segments)
def test_merge_is_associative(a, b, c):
    sa, sb, sc = _summary(a), _summary(b), _summary(c)
    left = merge_summary(merge_summary(sa, sb), sc)
    right = merge_summary(sa, merge_summary(sb, sc))
    assert torch.equal(left[0], right[0]), "⊕: the max part is exact and must agree"
    # The represented log Z = m + log ℓ: float64 rounding of a few exps and sums: 1e-12 relative.
    assert math.isclose(_logz(left), _logz(right), rel_tol=1e-12, abs_tol=1e-12), "⊕ must be associative"
    assert math.isclose(_logz(left), _logz(_summary(a + b + c)), rel_tol=1e-12, abs_tol=1e-12), "⊕ of parts = whole"


@PROPERTY
@given(segments, segments)
def test_merge_is_commutative_and_has_identity(a, b):
    sa, sb = _summary(a), _summary(b)
    ab, ba = merge_summary(sa, sb), merge_summary(sb, sa)
    assert torch.equal(ab[0], ba[0]) and torch.allclose(ab[1], ba[1], rtol=1e-15, atol=0), "⊕ must be commutative"
    identity = (torch.tensor(NEG_INF, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    for s in (merge_summary(sa, identity), merge_summary(identity, sa)):
        assert torch.equal(s[0], sa[0]) and torch.equal(s[1], sa[1]), "(-inf, 0) is the identity of ⊕"
        assert not s[1].isnan(), "no NaN when one or both sides are empty"


def test_merge_of_two_empty_summaries_is_empty_not_nan():
    e = (torch.full((3,), NEG_INF), torch.zeros(3))
    m, l = merge_summary(e, e)
    assert torch.isneginf(m).all() and (l == 0).all(), "(-inf, 0) ⊕ (-inf, 0) = (-inf, 0), not NaN"
    m, l, o = merge_partial((*e, torch.zeros(3, 4)), (*e, torch.zeros(3, 4)))
    assert torch.isneginf(m).all() and (l == 0).all() and (o == 0).all(), "(-inf, 0, 0) is the identity, no NaN"


@PROPERTY
@given(st.lists(st.floats(-60, 60, allow_nan=False), min_size=1, max_size=12), st.integers(0, 12), st.integers(0, 10**6))
def test_online_matches_safe_softmax(values, n_masked, seed):
    x = torch.tensor(values, dtype=torch.float64)
    x[torch.randperm(len(values), generator=torch.Generator().manual_seed(seed))[: min(n_masked, len(values) - 1)]] = NEG_INF
    assert torch.allclose(online_softmax(x), safe_softmax(x), atol=1e-15, rtol=1e-13), "online softmax = safe softmax"
    m, l = online_summary(x)
    assert math.isclose(float(m + torch.log(l)), float(torch.logsumexp(x, 0)), rel_tol=1e-13, abs_tol=1e-13)


@pytest.mark.parametrize("cuts", [[4], [1, 2, 3], [10, 20]])
def test_merge_partial_equals_attention_at_once(cuts):
    g = torch.Generator().manual_seed(0)
    q = 5 * torch.randn(3, 1, 4, generator=g, dtype=torch.float64)  # peaked: averaging would be wrong
    k = torch.randn(3, 24, 4, generator=g, dtype=torch.float64)
    v = torch.randn(3, 24, 2, generator=g, dtype=torch.float64)
    s = (q @ k.transpose(1, 2)).squeeze(1) / 2.0  # (3, 24), scale 1/sqrt(4)
    state = (torch.full((3,), NEG_INF, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
             torch.zeros(3, 2, dtype=torch.float64))
    for a, b in zip([0] + cuts, cuts + [24]):
        m_b = s[:, a:b].amax(-1)
        p = torch.exp(s[:, a:b] - m_b[:, None])
        state = merge_partial(state, (m_b, p.sum(-1), (p.unsqueeze(1) @ v[:, a:b]).squeeze(1)))
    o_ref, lse_ref = attention_reference(q, k, v)
    assert torch.allclose(state[2] / state[1][:, None], o_ref.squeeze(1), atol=1e-14), "o / ℓ after all merges = attention"
    assert torch.allclose(state[0] + torch.log(state[1]), lse_ref.squeeze(1), atol=1e-14), "m + log ℓ = lse"
