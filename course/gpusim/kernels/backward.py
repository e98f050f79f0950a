"""The FlashAttention-2 backward of §7.4 on the simulated GPU.

Two launches: a preprocess kernel D_i = dO_i · O_i (§7.3), then the main kernel with the K/V
blocks OUTER: one thread block per K/V block (B_c threads, thread c owns key row c), dK_j and
dV_j accumulated in registers and written once; the inner loop visits every Q block, recomputes
P = exp(S - L) from the stored L (§7.2), and adds the block's contribution dS_ij K_j to dQ_i.
Several thread blocks add to the same dQ_i, so that add is an atomicAdd: the block first sums
its B_c keys' contributions in shared memory, then issues ONE atomic per dQ element, which makes
⌈N/B_c⌉ · N · d atomic element operations in all (67,200 at N = 300, d = 32, B_c = 48).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..engine import GPU, Buffer, ThreadContext, host_array, unroll


def flash_bwd_preprocess_kernel(t: ThreadContext, O: Buffer, dO: Buffer, D: Buffer, n_rows: int, d: int) -> None:
    """D[i] = Σ_e dO[i, e]·O[i, e]; one thread per row (float4 loads along the row)."""
    row = t.blockIdx.x * t.blockDim.x + t.threadIdx.x
    with t.where(row < n_rows):
        idx = row * d + 4 * unroll(d // 4)  # (d/4, L)
        D[row] = (O.f4[idx] * dO.f4[idx]).sum((0, 1))


def flash_bwd_kernel(
    t: ThreadContext, Q: Buffer, K: Buffer, V: Buffer, dO: Buffer, L: Buffer, D: Buffer, dQ: Buffer, dK: Buffer,
    dV: Buffer, n_q: int, n_k: int, d: int, scale: float, causal: bool, block_rows: int,
) -> None:
    """grid = (⌈n_k/B_c⌉, H), block = (B_c,); Q, dO, dQ: (H·n_q·d,), K, V, dK, dV: (H·n_k·d,),
    L, D: (H·n_q,). dQ must be zeroed by the host; dK, dV are written once."""
    Bc, Br = t.blockDim.x, block_rows
    tx = t.threadIdx.x
    head, col0 = t.blockIdx.y, t.blockIdx.x * Bc
    col = col0 + tx  # my key
    q_off, kv_off, l_off = head * n_q * d, head * n_k * d, head * n_q
    cols = min(Bc, n_k - col0)
    offset = n_k - n_q  # bottom-right causal: query i sees key j iff j <= i + offset
    tile = t.shared("tile", Bc * (d + 1))  # K, V in and dK, dV out, transposed (conflict-free)
    Ks = t.shared("Ks", Bc * d)  # K_j row-major, for dQ_i += dS K_j
    Qs, dOs = t.shared("Qs", Br * d), t.shared("dOs", Br * d)
    Ls, Ds = t.shared("Ls", Br), t.shared("Ds", Br)
    dS = t.shared("dS", Br * (Bc + 1))

    # my rows of K and V into registers (coalesced loads staged through the padded tile)
    e = unroll(d) * Bc + tx
    r, c = e // d, e % d
    with t.where(r < cols):
        kx = K[kv_off + col0 * d + e]
        tile[r * (d + 1) + c] = kx
        Ks[e] = kx
    t.syncthreads()
    k = tile[tx * (d + 1) + unroll(d)]  # (d, Bc)
    t.syncthreads()
    with t.where(r < cols):
        tile[r * (d + 1) + c] = V[kv_off + col0 * d + e]
    t.syncthreads()
    v = tile[tx * (d + 1) + unroll(d)]
    dk = np.zeros((d, Bc), np.float32)
    dv = np.zeros((d, Bc), np.float32)

    # causal: queries before the first one that sees key col0 contribute nothing: skip their blocks
    first_row = max(0, col0 - offset) if causal else 0
    n_vec = -(-Br * d // (4 * Bc))
    lr = unroll(-(-Br // Bc)) * Bc + tx  # rows of L/D this thread loads
    for row0 in range((first_row // Br) * Br, n_q, Br):
        rows = min(Br, n_q - row0)
        e4 = (unroll(n_vec) * Bc + tx) * 4
        with t.where(e4 < rows * d):
            Qs.f4[e4] = Q.f4[q_off + row0 * d + e4]
            dOs.f4[e4] = dO.f4[q_off + row0 * d + e4]
        with t.where(lr < rows):
            Ls[lr] = L[l_off + row0 + lr]
            Ds[lr] = D[l_off + row0 + lr]
        t.syncthreads()
        rr = unroll(rows)  # (rows, 1): the block's query rows, read by every thread (broadcast)
        vec = rr[:, None] * d + 4 * unroll(d // 4)
        q_i = Qs.f4[vec].reshape(rows, d)
        do_i = dOs.f4[vec].reshape(rows, d)
        l_i, d_i = Ls[rr], Ds[rr]  # (rows, 1)
        s = scale * (q_i @ k)  # (rows, Bc): recomputed scores (§7.2)
        seen = np.ones(s.shape, bool) if not causal else (col <= row0 + rr + offset)
        seen = seen & (l_i > -np.inf)  # a fully masked row has L = -inf and P = 0
        p = np.where(seen, np.exp(s - np.where(l_i > -np.inf, l_i, 0)), np.float32(0))
        dv = dv + do_i.T @ p  # dV_j += P_ijᵀ dO_i
        dp = do_i @ v  # (rows, Bc): dP = dO_i V_jᵀ
        ds = p * (dp - d_i)  # dS = P ∘ (dP - D) (§7.3)
        dk = dk + scale * (q_i.T @ ds)  # dK_j += scale · dS_ijᵀ Q_i
        # dQ_i += scale · dS_ij K_j: sum over this block's keys in shared memory, then atomics
        dS[rr * (Bc + 1) + tx] = ds
        t.syncthreads()
        f = unroll(-(-rows * d // Bc)) * Bc + tx  # dQ_i elements, coalesced over threads
        fr, fe = f // d, f % d
        with t.where(f < rows * d):
            cc = unroll(cols)[:, None]  # (cols, 1, 1): sum over my block's valid keys
            part = (dS[fr * (Bc + 1) + cc] * Ks[cc * d + fe]).sum(0)
            t.atomic_add(dQ, q_off + row0 * d + f, np.float32(scale) * part)
        t.syncthreads()

    # dK_j, dV_j: written once, transposed through the tile for coalesced stores
    for grad, out in ((dk, dK), (dv, dV)):
        tile[tx * (d + 1) + unroll(d)] = grad
        t.syncthreads()
        with t.where(r < cols):
            out[kv_off + col0 * d + e] = tile[r * (d + 1) + c]
        t.syncthreads()


def flash_backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, causal: bool = False, block_rows: int = 64,
    block_cols: int = 64, gpu: GPU | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Gradients of one or more heads: q, o, do (H, Nq, d) or (Nq, d); k, v (H, Nk, d); lse (H, Nq).

    Returns (dq, dk, dv) as float32 numpy arrays in the inputs' shapes, and the stats of the two
    launches (gpu.report()): stats["atomic_element_ops"] = ⌈Nk/B_c⌉ · Nq · d per head when not
    causal (causal: only the Q blocks that see some key of each K/V block add)."""
    q, k, v, o, lse, do = (host_array(x, np.float32) for x in (q, k, v, o, lse, do))
    shape_q, shape_k = q.shape, k.shape
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    heads = math.prod(q.shape[:-2])
    gpu = GPU() if gpu is None else gpu
    Q, K, V = gpu.array("Q", q), gpu.array("K", k), gpu.array("V", v)
    O, dO, L = gpu.array("O", o), gpu.array("dO", do), gpu.array("L", lse)
    D = gpu.zeros("D", (heads, n_q))
    dQ, dK, dV = gpu.zeros("dQ", shape_q), gpu.zeros("dK", shape_k), gpu.zeros("dV", shape_k)
    gpu.launch(flash_bwd_preprocess_kernel, (-(-heads * n_q // 128),), (128,), O, dO, D, heads * n_q, d)
    gpu.launch(
        flash_bwd_kernel, (-(-n_k // block_cols), heads), (block_cols,),
        Q, K, V, dO, L, D, dQ, dK, dV, n_q, n_k, d, 1.0 / math.sqrt(d), bool(causal), block_rows,
    )
    return dQ.numpy(), dK.numpy(), dV.numpy(), gpu.report()
