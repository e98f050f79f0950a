"""Flash-Decoding on the simulated GPU (§8.4): split K/V along the sequence, combine with ⊕.

Decoding has one query per (batch, head), so FA2's grid (one block per Q block) has too few
blocks. The split kernel gives each of ``num_splits`` segments of the K/V sequence its own
thread block; each writes a partial output (normalised within its segment) and the segment's
log-sum-exp. A small combine kernel reweights the partials by exp(lse_s - lse) (§4.4).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine import GPU, Buffer, ThreadContext, host_array, unroll
from .standard import block_reduce

SPLIT_THREADS = 64


def flash_decode_split_kernel(
    t: ThreadContext, Q: Buffer, K: Buffer, V: Buffer, Op: Buffer, Lp: Buffer, n_k: int, d: int, scale: float,
    split_len: int,
) -> None:
    """grid = (num_splits, H), block = (T,) with T a power of two; Q: (H·d,), K, V: (H·n_k·d,),
    Op: (H·num_splits·d,) partial outputs, Lp: (H·num_splits,) partial log-sum-exps."""
    T, tid = t.blockDim.x, t.tid
    split, head = t.blockIdx.x, t.blockIdx.y
    n_splits = t.gridDim.x
    k0 = split * split_len
    n_keys = max(0, min(n_k, k0 + split_len) - k0)  # this segment's keys (possibly none)
    kv_off = head * n_k * d
    out = (head * n_splits + split) * d
    ev = unroll(-(-d // T)) * T + tid  # output dims this thread writes
    if n_keys == 0:  # an empty segment: o = 0, lse = -inf (the identity of ⊕)
        with t.where(ev < d):
            Op[out + ev] = np.float32(0)
        with t.where(tid == 0):
            Lp[head * n_splits + split] = np.float32(-np.inf)
        return
    qs = t.shared("q", d)
    sc = t.shared("scores", split_len)
    red = t.shared("red", T)
    with t.where(ev < d):
        qs[ev] = Q[head * d + ev]
    t.syncthreads()
    q = qs[unroll(d)]  # (d, 1): every thread reads the same q (broadcast)
    # 1. scores of this segment, thread tid takes keys tid, tid + T, ... (its own K rows)
    key = unroll(-(-n_keys // T)) * T + tid  # (U, L)
    valid = key < n_keys
    with t.where(valid[:, None, :]):  # (U, 1, L): the same mask for the d/4 float4 loads of a row
        kr = K.f4[kv_off + (k0 + key)[:, None, :] * d + 4 * unroll(d // 4)]  # (U, d/4, 4, L)
    s = (kr.reshape(key.shape[0], d, -1) * q).sum(1) * np.float32(scale)
    s = np.where(valid, s, np.float32(-np.inf))
    with t.where(valid):
        sc[key] = s
    m = block_reduce(t, red, s.max(0), np.maximum)  # segment max
    l = block_reduce(t, red, np.exp(s - m).sum(0), np.add)  # segment sum (the barrier covers sc too)
    # 2. o[e] = Σ_c exp(s_c - m) V[c, e] / l: thread e reads V row by row (coalesced)
    cc = unroll(n_keys)[:, None]  # (n_keys, 1, 1)
    with t.where(ev < d):
        p = np.exp(sc[cc] - m)  # broadcast reads of the scores
        vv = V[kv_off + (k0 + cc) * d + ev]  # (n_keys, Ue, L)
        Op[out + ev] = (p * vv).sum(0) / l
    with t.where(tid == 0):
        Lp[head * n_splits + split] = m + np.log(l)


def flash_decode_combine_kernel(
    t: ThreadContext, Op: Buffer, Lp: Buffer, O: Buffer, Lse: Buffer, n_splits: int, d: int
) -> None:
    """grid = (H,), block = (d,): thread e combines dimension e of the partials with ⊕."""
    e, head = t.threadIdx.x, t.blockIdx.x
    lse_s = Lp[head * n_splits + unroll(n_splits)]  # (S, 1): every thread reads all (broadcast)
    m = lse_s.max(0)
    m_safe = np.where(m == -np.inf, np.float32(0), m)
    w = np.exp(lse_s - m_safe)  # 0 for empty segments
    total = w.sum(0)
    o_s = Op[(head * n_splits + unroll(n_splits)) * d + e]  # (S, L), coalesced over e
    with t.where(e < d):
        O[head * d + e] = np.where(total > 0, (w * o_s).sum(0) / np.where(total > 0, total, 1), np.float32(0))
    with t.where(e == 0):
        Lse[head] = np.where(total > 0, m_safe + np.log(total), np.float32(-np.inf))


def flash_decode(
    q: Any, k: Any, v: Any, num_splits: int, gpu: GPU | None = None
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One decode step: q (H, d), k, v (H, Nk, d). Returns (o (H, d), lse (H,), stats of the two
    launches). Segments have ⌈Nk / num_splits⌉ keys; trailing ones may be empty."""
    q, k, v = (host_array(x, np.float32) for x in (q, k, v))
    heads, d = q.shape
    n_k = k.shape[1]
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if d % 4:
        raise ValueError(f"d must be a multiple of 4 (float4 loads), got {d}")
    split_len = max(1, -(-n_k // num_splits))
    gpu = GPU() if gpu is None else gpu
    Q, K, V = gpu.array("Q", q), gpu.array("K", k), gpu.array("V", v)
    Op, Lp = gpu.zeros("O_partial", (heads, num_splits, d)), gpu.zeros("lse_partial", (heads, num_splits))
    O, Lse = gpu.zeros("O", (heads, d)), gpu.zeros("lse", (heads,))
    gpu.launch(flash_decode_split_kernel, (num_splits, heads), (SPLIT_THREADS,), Q, K, V, Op, Lp, n_k, d, 1 / math.sqrt(d), split_len)
    gpu.launch(flash_decode_combine_kernel, (heads,), (d,), Op, Lp, O, Lse, num_splits, d)
    return O.numpy(), Lse.numpy(), gpu.report()
