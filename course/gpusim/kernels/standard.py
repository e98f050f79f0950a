"""Standard attention as three kernels (§5.2): S = scale·QKᵀ, P = softmax(S), O = PV.

Kernels 1 and 3 are Lecture 4's 16×16 shared-memory tiled matmul (threadIdx.x on the output
columns so stores coalesce; tiles padded to 17 columns); kernel 2 is a row softmax, one block of
256 threads per row, with two tree reductions (max, then sum) using sequential addressing (v3).
S and P are N×N buffers in global memory: that is the traffic FlashAttention removes.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..engine import GPU, Buffer, SharedArray, ThreadContext, host_array, unroll

TILE = 16
PAD = TILE + 1  # 17 columns: a warp's two rows land in (mostly) different banks
SOFTMAX_THREADS = 256


def matmul_tiled_kernel(
    t: ThreadContext, A: Buffer, B: Buffer, C: Buffer, M: int, N: int, K: int, alpha: float, b_transposed: bool
) -> None:
    """C = alpha · A @ op(B), op(B) = Bᵀ if b_transposed (B is N×K) else B (K×N). Row-major.

    A: (M·K,), C: (M·N,); grid = (⌈N/16⌉, ⌈M/16⌉), block = (16, 16): thread (x, y) computes
    C[16·blockIdx.y + y, 16·blockIdx.x + x]."""
    tx, ty = t.threadIdx.x, t.threadIdx.y
    row = t.blockIdx.y * TILE + ty
    col = t.blockIdx.x * TILE + tx
    As = t.shared("As", TILE * PAD)
    Bs = t.shared("Bs", TILE * PAD)
    acc = np.zeros(tx.shape, np.float32)
    for k0 in range(0, K, TILE):
        # both tiles are loaded along their rows (coalesced); out-of-range entries become 0
        with t.where((row < M) & (k0 + tx < K)):
            a = A[row * K + k0 + tx]
        if b_transposed:  # tile row y = B row (16·blockIdx.x + y), i.e. output column
            with t.where((t.blockIdx.x * TILE + ty < N) & (k0 + tx < K)):
                b = B[(t.blockIdx.x * TILE + ty) * K + k0 + tx]
        else:  # tile row y = B row k0 + y
            with t.where((k0 + ty < K) & (col < N)):
                b = B[(k0 + ty) * N + col]
        As[ty * PAD + tx] = a  # 2 wavefronts: x=0 of row y, x=15 of row y+1 share a bank (17y+32 ≡ 17y)
        Bs[ty * PAD + tx] = b
        t.syncthreads()
        kk = unroll(TILE)
        a_row = As[ty * PAD + kk]  # (16, L): the warp's two rows, a broadcast within each
        b_col = Bs[tx * PAD + kk] if b_transposed else Bs[kk * PAD + tx]
        acc = acc + (a_row * b_col).sum(0)
        t.syncthreads()
    with t.where((row < M) & (col < N)):
        C[row * N + col] = np.float32(alpha) * acc


def block_reduce(t: ThreadContext, red: SharedArray, local: np.ndarray, op: Callable) -> np.ndarray:
    """Tree reduction of one value per thread over a 1-D block in shared memory ``red`` (blockDim.x
    words), with sequential addressing (Lecture 4's v3): half the threads fold the upper half onto
    the lower at each step, a barrier between steps. Every thread gets the result (broadcast read)."""
    tid, T = t.tid, t.blockDim.x
    red[tid] = local
    t.syncthreads()
    s = T // 2
    while s > 0:
        with t.where(tid < s):
            red[tid] = op(red[tid], red[tid + s])
        t.syncthreads()
        s //= 2
    total = red[0]  # every thread reads the same word: a broadcast
    t.syncthreads()  # all have read red[0] before anyone overwrites red
    return total


def softmax_rows_kernel(t: ThreadContext, S: Buffer, P: Buffer, n_rows: int, n_cols: int, causal: bool) -> None:
    """P[i] = softmax(S[i]) over n_cols, one block (256 threads) per row; grid = (n_rows,).

    causal: bottom-right alignment, row i keeps columns j <= i + n_cols - n_rows; a row that
    keeps no column gets P = 0 (no NaN)."""
    T = t.blockDim.x
    tid = t.tid
    row = t.blockIdx.x
    red = t.shared("red", T)
    cols = unroll(-(-n_cols // T)) * T + tid  # (n_per, L): each thread's columns, coalesced
    inside = cols < n_cols
    keep = inside & (cols <= row + (n_cols - n_rows)) if causal else inside
    with t.where(inside):
        x = S[row * n_cols + cols]
    x = np.where(keep, x, np.float32(-np.inf))
    m = block_reduce(t, red, x.max(0), np.maximum)  # reduction 1: the row max
    m_safe = np.where(m == -np.inf, np.float32(0), m)
    e = np.exp(x - m_safe)  # 0 where masked
    l = block_reduce(t, red, e.sum(0), np.add)  # reduction 2: the row sum
    with t.where(inside):
        P[row * n_cols + cols] = np.where(l > 0, e / np.where(l > 0, l, 1), np.float32(0))


def standard_attention(
    q: Any, k: Any, v: Any, causal: bool = False, gpu: GPU | None = None
) -> tuple[np.ndarray, dict]:
    """Run the three kernels on one head: q (Nq, d), k, v (Nk, d) (numpy or torch, fp32).

    Returns (o (Nq, d) float32 numpy, stats): stats sums the three launches (gpu.report()), with
    S and P among its buffers."""
    q, k, v = (host_array(x, np.float32) for x in (q, k, v))
    (nq, d), nk = q.shape, k.shape[0]
    gpu = GPU() if gpu is None else gpu
    Q, K, V = gpu.array("Q", q), gpu.array("K", k), gpu.array("V", v)
    S, P, O = gpu.zeros("S", (nq, nk)), gpu.zeros("P", (nq, nk)), gpu.zeros("O", (nq, d))
    tiles = lambda n: -(-n // TILE)  # noqa: E731
    gpu.launch(matmul_tiled_kernel, (tiles(nk), tiles(nq)), (TILE, TILE), Q, K, S, nq, nk, d, 1 / math.sqrt(d), True, blocks_at_once=True)
    gpu.launch(softmax_rows_kernel, (nq,), (SOFTMAX_THREADS,), S, P, nq, nk, causal, blocks_at_once=True)
    gpu.launch(matmul_tiled_kernel, (tiles(d), tiles(nq)), (TILE, TILE), P, V, O, nq, d, nk, 1.0, False, blocks_at_once=True)
    return O.numpy(), gpu.report()
