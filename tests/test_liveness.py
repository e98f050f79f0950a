"""What is live when in a replay (autograder/tests/liveness.py), on small programs written here and on the
reference solutions: the rules of parts 2, 4 and 6 that bound many tensors together (the live scores of a
query row, the peak of live data made from q and k, what a forward keeps for its backward, the FLOPs of
live ops) measure the reference within their bounds and the programs of the attack class beyond them."""
from __future__ import annotations

import math

import pytest
import torch

from autograder.engine import replay as R
from autograder.scenarios.tracing import VIEW_OPS, Recorder, decomposed_before_dispatch
from autograder.tests import liveness as L
from autograder.tests.cases_part2 import FORWARD_ROWS, AttnCase, forward_peak_bound, peak_separates
from autograder.tests.cases_part4 import FUNCTION_ROWS, kept_bound
from solutions.flash_forward import flash_forward

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _replay(fn, *args, **kwargs) -> R.Replayed:
    return R.record_and_replay(fn, *args, **kwargs)


def _keys(fn, *args, rows=FORWARD_ROWS, **kwargs) -> L.PairSpan:
    return L.pair_keys(_replay(fn, *args, **kwargs), rows)


def _qkv(*shape: int, nk: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    *lead, n, d = shape
    return (torch.randn(*lead, n, d, generator=g), torch.randn(*lead, nk or n, d, generator=g),
            torch.randn(*lead, nk or n, d, generator=g))


def test_every_op_a_record_may_hold_has_a_tag_rule():
    # an op without one would make its outputs "reduced": data moved through it would escape pair_keys
    def recorded(name: str) -> bool:
        packet = getattr(torch.ops.aten, name, None)
        return packet is not None and any(not decomposed_before_dispatch(getattr(packet, o))
                                          for o in packet.overloads())

    missing = sorted(n for n in R.ALLOWED if n not in VIEW_OPS and L._plain(n) not in L.KINDS and recorded(n))
    assert missing == []


# --- the live scores of a query row (§5.1) --------------------------------------------------------------


def _panel_by_cat(q, k, v, bq=16, bk=16):
    out = []
    for i0 in range(0, q.shape[-2], bq):
        s = torch.cat([q[..., i0:i0 + bq, :] @ k[..., j0:j0 + bk, :].transpose(-1, -2)
                       for j0 in range(0, k.shape[-2], bk)], dim=-1)
        out.append(torch.softmax(s, dim=-1) @ v)
    return torch.cat(out, dim=-2)


def _tiles_in_a_buffer(q, k, v, bq=16, bk=16):
    """Each row block's S tiles written into one preallocated buffer by slice assignment, then a softmax."""
    out = []
    for i0 in range(0, q.shape[-2], bq):
        qi = q[..., i0:i0 + bq, :]
        buf = q.new_zeros(*qi.shape[:-1], k.shape[-2])
        for j0 in range(0, k.shape[-2], bk):
            buf[..., j0:j0 + bk] = qi @ k[..., j0:j0 + bk, :].transpose(-1, -2)
        out.append(torch.softmax(buf, dim=-1) @ v)
    return torch.cat(out, dim=-2)


def _tiles_reshaped_small(q, k, v, bq=16, bk=16):
    """The tiles of a row block stacked and flattened into rows of 2: no dim spans more than a tile."""
    out = []
    for i0 in range(0, q.shape[-2], bq):
        qi = q[..., i0:i0 + bq, :]
        tiles = [qi @ k[..., j0:j0 + bk, :].transpose(-1, -2) for j0 in range(0, k.shape[-2], bk)]
        flat = torch.stack(tiles, dim=-2).reshape(-1, 2)
        p = torch.softmax(flat.reshape(*qi.shape[:-1], -1), dim=-1)
        out.append(p @ v)
    return torch.cat(out, dim=-2)


def _tiles_through_index_put(q, k, v, bq=16, bk=16):
    out = []
    for i0 in range(0, q.shape[-2], bq):
        qi = q[..., i0:i0 + bq, :]
        buf = q.new_zeros(qi.shape[-2], k.shape[-2])
        rows = torch.arange(qi.shape[-2]).unsqueeze(1)
        for j0 in range(0, k.shape[-2], bk):
            buf.index_put_((rows, torch.arange(j0, j0 + bk).unsqueeze(0)), qi @ k[j0:j0 + bk].t())
        out.append(torch.softmax(buf, dim=-1) @ v)
    return torch.cat(out, dim=-2)


def _tiles_scattered(q, k, v, bq=16, bk=16):
    out = []
    for i0 in range(0, q.shape[-2], bq):
        qi = q[..., i0:i0 + bq, :]
        buf = q.new_zeros(qi.shape[-2], k.shape[-2])
        for j0 in range(0, k.shape[-2], bk):
            buf = buf.scatter(1, torch.arange(j0, j0 + bk).expand(qi.shape[-2], bk), qi @ k[j0:j0 + bk].t())
        out.append(torch.softmax(buf, dim=-1) @ v)
    return torch.cat(out, dim=-2)


def _tiles_kept_in_a_dict_sorted(q, k, v, bq=16, bk=16):
    """Tiles in a dict, the row max from a sort of the concatenated P̃ ... a two-pass softmax over a dict."""
    out = []
    for i0 in range(0, q.shape[-2], bq):
        qi = q[..., i0:i0 + bq, :]
        tiles = {j0: qi @ k[j0:j0 + bk].t() for j0 in range(0, k.shape[-2], bk)}
        m = torch.stack([t.sort(-1)[0][:, -1] for t in tiles.values()]).amax(0).unsqueeze(-1)
        p = {j0: torch.exp(t - m) for j0, t in tiles.items()}
        out.append(sum(t @ v[j0:j0 + bk] for j0, t in p.items()) / sum(t.sum(-1, keepdim=True) for t in p.values()))
    return torch.cat(out, dim=-2)


@pytest.mark.parametrize("panel", [_panel_by_cat, _tiles_in_a_buffer, _tiles_reshaped_small, _tiles_through_index_put,
                                   _tiles_scattered, _tiles_kept_in_a_dict_sorted])
def test_a_row_of_scores_put_together_from_tiles_spans_every_key(panel):
    q, k, v = _qkv(32, 8, nk=64)
    rp = _replay(panel, q, k, v)
    assert torch.allclose(rp.result, torch.softmax(q @ k.t(), -1) @ v, atol=1e-5)
    span = L.pair_keys(rp, FORWARD_ROWS)
    assert (span.keys, span.lo, span.hi) == (64, 0, 63), span


@pytest.mark.parametrize("case", [AttnCase((2,), 113, 113, 16, block_q=32, block_k=32),
                                  AttnCase((2,), 203, 113, 8, causal=True, block_q=32, block_k=16),  # last block: 1 key
                                  AttnCase((3,), 17, 33, 4, causal=True, block_q=8, block_k=8),
                                  AttnCase((), 1, 203, 16, causal=True, block_q=32, block_k=32)])
def test_the_reference_holds_the_scores_of_one_k_v_block_at_a_time(case):
    q, k, v = case.qkv()
    rp = _replay(flash_forward, q, k, v, **case.kwargs())
    span = L.pair_keys(rp, FORWARD_ROWS)
    assert span.keys == min(case.block_k, case.nk), span
    tags = L._TagReplay(rp, FORWARD_ROWS, L.Lives(rp))
    for index, op in enumerate(rp.prepared):
        if not (op.info.view or op.info.scalar_out):
            tags.step(index, op)
    assert tags.without_rule == [] and not tags.unfollowed  # every op of the reference followed by a rule


def test_a_statistic_broadcast_over_the_keys_keeps_the_tile_and_a_reduction_over_one_key_reduces():
    q, k, _ = _qkv(4, 8)

    def softmax_tile(q, k):  # P̃ = exp(S - m): still the tile's (query, key) data, kept alive by returning it
        s = q @ k.t()
        return torch.exp(s - s.amax(-1, keepdim=True))

    assert _keys(softmax_tile, q, k, rows={0: FORWARD_ROWS[0], 1: FORWARD_ROWS[1]}).keys == 4

    # each 2-key tile plus 0 · a statistic at the tile's own shape (full operands, not broadcast ones)
    def tiles_mixed_with_materialised_statistics(q, k):
        kept = []
        for j in range(0, 4, 2):
            s = q @ k[j:j + 2].t()
            r = s.amax(-1, keepdim=True).expand_as(s).contiguous() + s.sum(-1, keepdim=True).repeat(1, 2)
            kept.append(s + 0.0 * r)  # the same scores: still the tile's (query, key) data
        return torch.stack(kept).sum(0)

    mixed = _keys(tiles_mixed_with_materialised_statistics, q, k, rows={0: FORWARD_ROWS[0], 1: FORWARD_ROWS[1]})
    assert mixed.keys == 4  # both tiles kept together (before: the mixed tiles counted as reduced, 2 keys)

    def one_key_statistics(q, k):  # the row max and sum over a tile of ONE key are reductions over the keys
        out = []
        for j in range(4):
            s = q @ k[j:j + 1].t()
            out.append(s.amax(-1) + s.exp().sum(-1))
        return torch.stack(out).sum(0)

    assert _keys(one_key_statistics, q, k, rows={0: FORWARD_ROWS[0], 1: FORWARD_ROWS[1]}).keys <= 1


def test_data_that_the_rules_cannot_follow_counts_as_every_key():
    q, k, v = _qkv(8, 4)

    def reinterpreted(q, k, v):
        s = q @ k.t()
        packed = s.view(torch.float64).clone()  # two scores per element, copied as such
        return torch.softmax(packed.view(torch.float32), -1) @ v

    span = _keys(reinterpreted, q, k, v)
    assert span.unfollowed and span.keys > 8


# --- the peak of live data made from q and k (the trace tests' long-row case) ---------------------------

PEAK_CASES = [AttnCase((), 128, 1024, 4, block_q=64, block_k=32), AttnCase((), 96, 768, 8, causal=True, block_q=48,
                                                                          block_k=24, seed=16)]


@pytest.mark.parametrize("case", PEAK_CASES)
def test_the_reference_peak_is_within_the_bound_and_a_row_panel_is_far_above(case):
    assert peak_separates(case)
    q, k, v = case.qkv()
    bound = forward_peak_bound(case)
    ref = L.peak_score_like(_replay(flash_forward, q, k, v, **case.kwargs())).elements
    # the reference: its outputs o, lse (Nq·(dv + 1)), one Q block's m, ℓ, acc and two tiles, well inside the
    # bound's Nq·(2dv + 3) + 3 tiles and Q-block statistics
    br, bc, dv = case.block_q, case.block_k, case.d
    assert ref <= case.nq * (2 * dv + 3) + 2 * br * (bc + dv + 2) < bound, (ref, bound)

    def panel(q, k, v):  # the same loops, a whole row of keys per Q block, scores written in place
        o = q.new_zeros(q.shape[0], v.shape[-1])
        for i0 in range(0, q.shape[0], br):
            s = q[i0:i0 + br] @ k.t() / math.sqrt(dv)
            if case.causal:
                rows = torch.arange(i0, i0 + s.shape[0]).unsqueeze(1) + case.nk - case.nq
                s.masked_fill_(torch.arange(case.nk) > rows, float("-inf"))
            s.sub_(s.amax(-1, keepdim=True)).exp_()
            o[i0:i0 + br] = (s @ v) / s.sum(-1, keepdim=True)
        return o

    rp = _replay(panel, q, k, v)
    assert torch.allclose(rp.result, flash_forward(q, k, v, **case.kwargs())[0], atol=1e-5)
    got = L.peak_score_like(rp).elements
    assert got >= br * case.nk > 4 * bound, (got, bound)  # one panel alone is several times the bound


# --- what a forward keeps for its backward, and the FLOPs of live ops -----------------------------------


class _KeepsTiles(torch.autograd.Function):
    """Keeps q, k, v, O, lse and every P tile (one ctx attribute each) for a backward that does not recompute."""

    @staticmethod
    def forward(ctx, q, k, v):
        s = q @ k.t()
        lse = torch.logsumexp(s, -1)
        o = torch.exp(s - lse[:, None]) @ v
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.n = q.shape[0] // 4
        for i in range(ctx.n):
            setattr(ctx, f"p{i}", torch.exp(q[4 * i:4 * i + 4] @ k.t() - lse[4 * i:4 * i + 4, None]))
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        p = torch.cat([getattr(ctx, f"p{i}") for i in range(ctx.n)])
        _unused = q @ k.t()  # a "recompute" nothing reads
        dp = do @ v.t()
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        return ds @ k, ds.t() @ q, p.t() @ do


def test_tiles_kept_as_attributes_count_in_total_and_unused_products_count_no_flops():
    q, k, v = (t.requires_grad_() for t in _qkv(16, 4))
    do = torch.randn(16, 4)
    r = Recorder()
    r.inputs(q, k, v, do)
    with r:
        o = _KeepsTiles.apply(q, k, v)
        r.mark("backward")
        o.backward(do)
    rp = R.replay(r.record({"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad}),
                  [t.detach() for t in (q, k, v)] + [do])
    kept = L.kept_for_backward(rp)
    case = AttnCase((), 16, 16, 4)
    assert max(s.elements for s in kept) < 16 * 16  # each one small ...
    assert sum(s.elements for s in kept) >= 16 * 16 + 16 * 4 > kept_bound(case)  # ... together P and O: too much
    start = rp.marks["backward"][0]
    dead = 2 * 16 * 16 * 4  # the unused q·kᵀ
    assert L.live_matmul_flops(rp, start) == rp.flops_between(start) - dead
    assert L.pair_keys(rp, FUNCTION_ROWS).keys == 16  # the tiles are live together from the forward on


def test_a_product_written_in_place_into_the_result_is_live():
    q, k, v = _qkv(8, 4)

    def accumulate(q, k, v):
        out = torch.zeros(8, 4)
        out.addmm_(torch.softmax(q @ k.t(), -1), v)
        (q @ k.t()).sum()  # dead
        return out

    rp = _replay(accumulate, q, k, v)
    assert L.live_matmul_flops(rp) == rp.matmul_flops - 2 * 8 * 8 * 4 == 2 * 2 * 8 * 8 * 4


# --- what each tensor derives from (cases_part2.Sides), followed with its precomputed SideFlow ------------------


class _SidesByDefinition:
    """cases_part2.Sides as it is defined, op by op: bits per ref and per storage, an elementwise op's number
    operands (_is_number) passing on nothing, shape-only ops nothing with data_only (the oracle of SideFlow)."""

    def __init__(self, rp, sides, data_only):
        self.rp, self.data_only = rp, data_only
        self.mask, self.storage = dict(sides), {}
        for ref, m in sides.items():
            st = self._storage_of(ref)
            self.storage[st] = self.storage.get(st, 0) | m

    def _storage_of(self, ref):
        t = self.rp.env.get(ref)
        try:
            return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None
        except (RuntimeError, NotImplementedError):
            return None

    def of(self, ref):
        st = self._storage_of(ref)
        return self.mask.get(ref, 0) | (self.storage.get(st, 0) if st is not None else 0)

    def step(self, op):
        if self.data_only and op.info.kind in R._SHAPE_ONLY:
            return
        env, m = self.rp.env, 0
        leaf = op.leaves[0] if op.leaves else None
        out = env.get(leaf) if op.info.kind == "elementwise" and type(leaf) is int else None
        for ref in op.reads:
            t = env.get(ref)
            if isinstance(out, torch.Tensor) and out.numel() > 1 and (
                    not isinstance(t, torch.Tensor) or R._effective_numel(t) <= 1):
                continue
            m |= self.of(ref)
        for leaf in op.leaves:
            if type(leaf) is int:
                self.mask[leaf] = self.mask.get(leaf, 0) | m
                st = self._storage_of(leaf)
                if st is not None:
                    self.storage[st] = self.storage.get(st, 0) | m


def _mixed_in_place(q, k, v):
    """Tiles written into a buffer through a view taken before the write, a number made from q spread over k,
    positions from ones_like, an in-place mul_ of q- and k-side data, a product of a one-element tensor."""
    buf = q.new_zeros(q.shape[0], k.shape[0])
    left = buf[:, :4]
    buf[:, :4] = q @ k[:4].t()
    k2 = k + 0 * q[0, 0]
    pos = torch.ones_like(q[:, 0]).cumsum(0)
    w = q[:, :1].clone()
    w.mul_(k2[:8, :1])
    return left.sum() + buf.sum() + pos.sum() + w.sum() + (k2 * q[:1, :1]).sum() + (v[0, 0] * q).sum()


@pytest.mark.parametrize("program", [_mixed_in_place, _tiles_in_a_buffer, _tiles_through_index_put])
def test_sides_follow_the_ops_as_their_definition(program):
    from autograder.tests.cases_part2 import FORWARD_SIDES, Sides

    q, k, v = _qkv(8, 4, nk=32)
    rp = _replay(program, q, k, v)
    refs = sorted(set(rp.env) | {leaf for op in rp.prepared for leaf in op.leaves if type(leaf) is int})
    for data_only in (False, True):
        fast, slow = Sides(rp, FORWARD_SIDES, data_only), _SidesByDefinition(rp, FORWARD_SIDES, data_only)
        for index, op in enumerate(rp.prepared):
            fast.follow(index + 1)
            slow.step(op)
            assert [fast.of(r) for r in refs] == [slow.of(r) for r in refs], (index, op.info.name)
