"""The one-pass rule of part 1 (autograder/tests/streaming.py), on small programs written here and on the
reference solution: every legal way to stream the columns (per column in any order, tiles of up to N/2
columns merged with ⊕ left to right, right to left or as a balanced tree, a normalising pass broadcast or
column by column) keeps within N/2; the dense summary, two passes in loops, a prefix scan, a sort, a
laundered copy of x and a dense ℓ after a streamed max do not."""
from __future__ import annotations

import functools

import pytest
import torch

from autograder.engine import replay as R
from autograder.tests import streaming as S
from solutions import online_softmax as sol

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

X = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)) * 3
SHUFFLED = torch.randperm(64, generator=torch.Generator().manual_seed(1)).tolist()


def _base(m):
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def _empty(x):
    return torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)


def _step(state, xj):
    m, l = state
    m_new = torch.maximum(m, xj)
    base = _base(m_new)
    return m_new, l * torch.exp(m - base) + torch.exp(xj - base)


def _tile(t):
    tm = t.amax(-1)
    return tm, torch.exp(t - _base(tm).unsqueeze(-1)).sum(-1)


def by_column(order):
    def f(x):
        state = _empty(x)
        for j in order(x.shape[-1]):
            state = _step(state, x[..., j])
        return state
    return f


def unbind(x):
    return functools.reduce(_step, x.unbind(-1), _empty(x))


def tiles(b, reverse=False):
    def f(x):
        state = _empty(x)
        parts = x.split(b, dim=-1)
        for t in reversed(parts) if reverse else parts:
            state = sol.merge_summary(_tile(t), state) if reverse else sol.merge_summary(state, _tile(t))
        return state
    return f


def tree(b):
    def f(x):
        parts = [_tile(t) for t in x.split(b, dim=-1)]
        while len(parts) > 1:
            parts = [sol.merge_summary(*parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        return parts[0]
    return f


def halves(x, b=8):
    if x.shape[-1] <= b:
        return _tile(x)
    h = (x.shape[-1] + 1) // 2
    return sol.merge_summary(halves(x[..., :h]), halves(x[..., h:]))


def float64_copy(x):
    m, l = sol.online_summary(x.double())
    return m.float(), l.float()


def guarded(x):
    if bool(torch.isneginf(x).all()):  # a guard on .item(): no value of it reaches the result
        return _empty(x)
    return sol.online_summary(x)


def normalised(summary, by_column=False):
    def f(x):
        m, l = summary(x)
        m, l = _base(m), torch.where(l == 0, torch.ones_like(l), l)
        if not by_column:
            return torch.exp(x - m.unsqueeze(-1)) / l.unsqueeze(-1)
        out = torch.empty_like(x)
        for j in range(x.shape[-1]):
            out[..., j] = torch.exp(x[..., j] - m) / l
        return out
    return f


def lse_normalised(x):
    m, l = sol.online_summary(x)
    p = torch.where(torch.isneginf(x), 0.0, torch.exp(x - _base(m).unsqueeze(-1) - torch.log(l).unsqueeze(-1)))
    return p


LEGAL = {
    "solution": sol.online_summary,
    "reverse_columns": by_column(lambda n: reversed(range(n))),
    "shuffled_columns": by_column(lambda n: SHUFFLED[:n]),
    "unbind": unbind,
    "tiles_8": tiles(8),
    "tiles_16": tiles(16),
    "tiles_24_ragged": tiles(24),
    "tiles_32": tiles(32),
    "tiles_32_from_the_right": tiles(32, reverse=True),
    "tree_of_tiles_8": tree(8),
    "tree_of_tiles_16": tree(16),
    "halves_recursively": halves,
    "float64_copy": float64_copy,
    "guard_on_item": guarded,
    "softmax": sol.online_softmax,
    "softmax_of_tiles_16": normalised(tiles(16)),
    "softmax_column_by_column": normalised(sol.online_summary, by_column=True),
    "softmax_log_and_where": lse_normalised,
}


def dense(x):
    m = x.amax(-1)
    return m, torch.exp(x - _base(m).unsqueeze(-1)).sum(-1)


def two_pass_loops(x):
    m, _ = _empty(x)
    for j in range(x.shape[-1]):
        m = torch.maximum(m, x[..., j])
    l = torch.zeros_like(m)
    for j in range(x.shape[-1]):
        l = l + torch.exp(x[..., j] - _base(m))
    return m, l


def streamed_max_dense_sum(x):
    m, _ = _empty(x)
    for j in range(x.shape[-1]):
        m = torch.maximum(m, x[..., j])
    return m, torch.exp(x - _base(m).unsqueeze(-1)).sum(-1)


def halves_at_once(x):
    t = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2)
    tm, tl = _tile(t)
    return sol.merge_summary((tm[..., 0], tl[..., 0]), (tm[..., 1], tl[..., 1]))


def sorted_first(x):
    xs = x.sort(-1, descending=True).values
    return by_column(range)(xs)


def right_fold_of_tiles(x):
    parts = [_tile(t) for t in x.split(8, dim=-1)]
    return functools.reduce(lambda acc, s: sol.merge_summary(s, acc), reversed(parts[:-1]), parts[-1])


def laundered_copy(x):
    d, ys = torch.zeros(x.shape[:-1]), []
    for j in range(x.shape[-1]):  # each column "refreshed" with the running sum of the columns before it
        d = d + x[..., j]
        ys.append(x[..., j] + 0 * d)
    return dense(torch.stack(ys, -1))


def cumsum_of_dense(x):
    m = x.amax(-1)
    return m, torch.exp(x - _base(m).unsqueeze(-1)).cumsum(-1)[..., -1]


def softmax_dense(x):
    m = _base(x.amax(-1, keepdim=True))
    e = torch.exp(x - m)
    return e / e.sum(-1, keepdim=True)


def softmax_recomputed_l(x):
    m, _ = sol.online_summary(x)
    e = torch.exp(x - _base(m).unsqueeze(-1))
    return e / e.sum(-1, keepdim=True)


ILLEGAL = {  # program -> the kind of violation
    "dense": "width",
    "tiles_40": "width",
    "halves_at_once": "width",
    "sorted_first": "width",
    "cumsum_of_dense": "width",
    "two_pass_loops": "second",
    "streamed_max_dense_sum": "second",
    "right_fold_of_tiles": "ahead",
    "laundered_copy": "ahead",
    "softmax_dense": "width",
    "softmax_recomputed_l": "second",
}
PROGRAMS = {"dense": dense, "tiles_40": tiles(40), "halves_at_once": halves_at_once, "sorted_first": sorted_first,
            "cumsum_of_dense": cumsum_of_dense, "two_pass_loops": two_pass_loops,
            "streamed_max_dense_sum": streamed_max_dense_sum, "right_fold_of_tiles": right_fold_of_tiles,
            "laundered_copy": laundered_copy, "softmax_dense": softmax_dense, "softmax_recomputed_l": softmax_recomputed_l}


def _order(fn, x=X) -> S.Order:
    return S.column_order(R.record_and_replay(fn, x, part=1))


@pytest.mark.parametrize("name", sorted(LEGAL))
def test_a_legal_pass_keeps_within_half_a_row(name):
    order = _order(LEGAL[name])
    assert order.ok, order.describe(name)
    assert order.tile <= order.bound == 32


def test_the_tiles_are_what_the_measure_sees():
    assert _order(sol.online_summary).tile == 2  # column 0 and column 1 meet first
    assert _order(tiles(16)).tile == 16
    assert _order(tree(8)).tile == 32  # the root: half a row ⊕ the other half


@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_a_second_pass_or_the_whole_row_at_once_fails(name):
    order = _order(PROGRAMS[name])
    assert not order.ok and order.violation.kind == ILLEGAL[name], (name, order)
    assert "pass" in order.describe("online_summary")


def test_the_message_names_the_columns():
    text = _order(dense).describe("online_summary")
    assert "read 64 columns of x at once" in text and "N/2 = 32" in text
    text = _order(laundered_copy).describe("online_summary")
    assert "combined column 0 with data that already included 62 columns read after it" in text


def test_short_rows_and_leading_dims():
    for x in (torch.randn(5, 3), torch.randn(4, 1)):  # fewer than 4 columns: nothing to measure
        assert _order(dense, x).ok
    assert _order(sol.online_summary, torch.randn(3, 0)).ok
    x = torch.randn(2, 2, 2, 48, generator=torch.Generator().manual_seed(2))
    assert _order(sol.online_summary, x).ok and not _order(dense, x).ok
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))  # one 1-D row
    assert _order(tiles(16), x).ok and not _order(dense, x).ok


def test_all_neg_inf_rows_change_nothing():
    x = X.clone()
    x[0, 1] = float("-inf")
    assert _order(sol.online_summary, x).ok and not _order(dense, x).ok
