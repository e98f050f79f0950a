"""The worker-side tracer (autograder/scenarios/tracing.py) on small attention functions written here.

Each test pins one measurement the assignment tests of parts 2, 4 and 6 rely on: fused-op names, exact
matmul FLOPs (whole-block causal skipping, 2.5x backward), new-storage bytes (naive vs tiled, expand views,
slices of an input), and the broadcast multiply+sum blind spot.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autograder.scenarios.tracing import saved_tensor_shapes, trace_call



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: one torch thread is faster on a shared 2-core machine (and deterministic)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

def naive(q, k, v, causal=False):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(m - n), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def tiled(q, k, v, causal=False, bq=32, bk=32, skip=True):
    """Minimal FA2-style forward (§5.1) with optional whole-block causal skipping (§6.2)."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    off, scale = nk - nq, 1 / math.sqrt(d)
    o = torch.empty_like(q)
    for i0 in range(0, nq, bq):
        qi = q[..., i0:i0 + bq, :]
        r = qi.shape[-2]
        m = torch.full(qi.shape[:-1], float("-inf"))
        l = torch.zeros(qi.shape[:-1])
        acc = torch.zeros_like(qi)
        for j0 in range(0, nk, bk):
            if causal and skip and j0 > i0 + r - 1 + off:
                break
            s = (qi @ k[..., j0:j0 + bk, :].transpose(-1, -2)) * scale
            if causal:
                rows = torch.arange(i0, i0 + r)[:, None]
                cols = torch.arange(j0, min(j0 + bk, nk))[None, :]
                s = s.masked_fill(cols > rows + off, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v[..., j0:j0 + bk, :]
            m = m_new
        o[..., i0:i0 + bq, :] = acc / l[..., None]
    return o


def broadcast_matmul(q, k, v):
    """Scores as an elementwise product + sum: 0 matmul FLOPs although it is a matmul."""
    s = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v


def qkv(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def test_tiled_matches_naive_so_the_fixtures_are_right():
    q, k, v = qkv(2, 113, 16)
    assert torch.allclose(tiled(q, k, v), naive(q, k, v), atol=1e-5)
    q2, k2, v2 = qkv(2, 203, 16)
    assert torch.allclose(tiled(q2[:, :113], k2, v2, causal=True), naive(q2[:, :113], k2, v2, causal=True),
                          atol=1e-5)


def test_sdpa_is_flagged_by_name_on_4d_and_3d_inputs():
    q, k, v = qkv(2, 3, 64, 16)
    _, tr = trace_call(F.scaled_dot_product_attention, q, k, v)
    assert tr["fused_attention_ops"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    # On other ranks SDPA decomposes into its math path, recognisable by aten::_safe_softmax.
    q, k, v = qkv(64, 16)
    _, tr = trace_call(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    assert "aten::_safe_softmax" in tr["fused_attention_ops"]
    _, tr = trace_call(tiled, *qkv(2, 64, 16))
    assert tr["fused_attention_ops"] == []


@pytest.mark.parametrize("n,d,b", [(256, 64, 32), (113, 16, 32)])
def test_matmul_flops_are_exact_and_causal_skipping_counts_block_pairs(n, d, b):
    q, k, v = qkv(n, d)
    _, tr = trace_call(tiled, q, k, v, bq=b, bk=b)
    assert tr["matmul_flops"] == 4 * n * n * d  # 2·n·n·d for q kᵀ + 2·n·n·d for p v, ragged tiles included
    _, tr = trace_call(tiled, q, k, v, causal=True, bq=b, bk=b)
    pairs = [(i, j) for i in range(0, n, b) for j in range(0, n, b) if j <= i]
    expect = sum(4 * min(b, n - i) * min(b, n - j) * d for i, j in pairs)
    assert tr["matmul_flops"] == expect
    if n == 256:  # the figures of the notes (their 16,777,216 = 4·N²·d needs d = 64): 36 of 64 block pairs
        assert expect == 9_437_184 and len(pairs) == 36
    _, tr_noskip = trace_call(tiled, q, k, v, causal=True, bq=b, bk=b, skip=False)
    assert tr_noskip["matmul_flops"] == 4 * n * n * d > expect


def test_recomputing_backward_costs_2_5x_the_forward():
    q, k, v = qkv(1, 96, 16)
    n, d = 96, 16

    def backward_recompute(q, k, v, o, lse, do):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        p = torch.exp(s - lse[..., None])
        dv = p.transpose(-1, -2) @ do
        dp = do @ v.transpose(-1, -2)
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        return ds @ k / math.sqrt(d), ds.transpose(-1, -2) @ q / math.sqrt(d), dv

    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ v
    _, fwd = trace_call(tiled, q, k, v)
    _, bwd = trace_call(backward_recompute, q, k, v, o, lse, torch.randn(1, n, d))
    assert 2 * bwd["matmul_flops"] == 5 * fwd["matmul_flops"]


def test_naive_materialises_nxn_and_tiled_does_not():
    n, d = 512, 16
    q, k, v = qkv(2, n, d)
    nxn_one_head = n * n * 4
    _, tr = trace_call(naive, q, k, v)
    assert tr["max_new_storage_bytes"] >= 2 * nxn_one_head
    assert tr["max_new_storage"]["shape"][-2:] == [n, n]
    _, tr = trace_call(tiled, q, k, v, bq=64, bk=64)
    # The largest new storage of the tiled version is its output (2, n, d): O(N·d + B_r·B_c), far below N².
    assert tr["max_new_storage_bytes"] == 2 * n * d * 4 < nxn_one_head


def test_inputs_views_of_inputs_and_expand_views_are_not_new_storage():
    cache = torch.randn(4096, 16)  # a big buffer passed in: slicing it must not count

    def use_slices(buf, x):
        y = buf[:8] * 2  # new storage: 8·16·4 bytes
        z = x.expand(1000, 16)  # a view: no new storage at all
        return y, z.sum()

    _, tr = trace_call(use_slices, cache, torch.randn(1, 16))
    assert tr["max_new_storage_bytes"] == 8 * 16 * 4


def test_broadcast_multiply_sum_is_reported_and_counts_no_flops():
    q, k, v = qkv(32, 8)
    _, tr = trace_call(broadcast_matmul, q, k, v)
    assert tr["broadcast_product_elems"] == 32 * 32 * 8
    assert tr["matmul_flops"] == 2 * 32 * 32 * 8  # only p @ v is seen: too few FLOPs exposes the hidden one
    _, tr = trace_call(tiled, q, k, v)
    assert tr["broadcast_product_elems"] == 0  # acc·α[..., None] and friends are not outer products


def test_mv_and_dot_are_counted():
    q, k, v = qkv(64, 16)

    def row_at_a_time(q, k, v):
        rows = []
        for i in range(q.shape[0]):
            p = torch.softmax(k @ q[i] / 4.0, -1)  # mv: 2·64·16
            rows.append(v.t() @ p)  # mv: 2·16·64
        return torch.stack(rows)

    _, tr = trace_call(row_at_a_time, q, k, v)
    assert tr["matmul_flops"] == 4 * 64 * 64 * 16
    _, tr = trace_call(torch.dot, q[0], k[0])
    assert tr["matmul_flops"] == 2 * 16


def test_trace_is_plain_data_and_saved_tensor_hook_sees_save_for_backward():
    _, tr = trace_call(naive, *qkv(8, 4))
    plain = (int, str, list, dict)
    assert all(isinstance(val, plain) for val in tr.values())

    class SavesP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            p = torch.softmax(q @ k.t(), -1)
            ctx.save_for_backward(q, p)
            return p @ v

        @staticmethod
        def backward(ctx, go):
            return None, None, None

    q, k, v = (t.requires_grad_() for t in qkv(8, 4))
    _, shapes = saved_tensor_shapes(SavesP.apply, q, k, v)
    assert shapes == [[8, 4], [8, 8]]


def einsum_attention(q, k, v):
    return torch.einsum("nd,md->nm", q, k) @ v


def addmm_baddbmm(q, k, v):
    s = q @ k.t()
    return torch.addmm(s, q, k.t()) + torch.baddbmm(s[None], q[None], k.t()[None])[0]


@pytest.mark.parametrize("fn", [naive, tiled, broadcast_matmul, einsum_attention, addmm_baddbmm])
def test_flop_counts_equal_flopcountermode(fn):
    """The tracer applies FlopCounterMode's own formulas; on ops FlopCounterMode knows, counts are equal."""
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = qkv(48, 16)
    with FlopCounterMode(display=False) as counter:
        fn(q, k, v)
    _, tr = trace_call(fn, q, k, v)
    assert tr["matmul_flops"] == counter.get_total_flops() > 0
