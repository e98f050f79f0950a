# Generated from solutions/flash_kernel.py by `make starter` (python -m instructor.make_starter): edit there, not here.
"""Part 3: the FlashAttention-2 forward as a CUDA-style kernel on the simulated GPU (§5.2–§6.2).

Each thread block owns B_r query rows (one Q block) and each of its B_r threads owns ONE query
row (the extreme form of FA2's split-Q, §6.4). The block streams the K/V blocks through shared
memory; the scores S_ij and probabilities P̃_ij live only in the threads' registers, so global
memory holds nothing but Q, K, V, O and L. The simulator (course.gpusim, docs/gpusim_guide.md)
counts every access; the grader checks the counts against the closed forms of §5.3:

    DRAM bytes, no cache  = 4·(2·N·d + 2·N·d·⌈N/B_r⌉) + L      (K/V re-read by every Q block)
    DRAM bytes, ideal     = 4·(4·N·d) + L                      (every byte once)
    L = 4·N bytes when N is a multiple of 8 (in general 32·⌈N/8⌉: whole 32-byte sectors)

Only `flash_forward_kernel` is graded. `fa1_forward_kernel` (§6.3, the loop order of the first
FlashAttention) is an optional exercise: program 03 uses it to measure FA1 against FA2.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from course import gpusim as gs
from course.gpusim import unroll
from course.reference import check_attention_inputs


# §5.2, one thread per query row. Kernel arguments: Q, K, V, O, L are global buffers holding the
# heads one after another (head h of Q starts at element h·n_q·d, of K/V at h·n_k·d, of L at
# h·n_q); blockIdx.x is the Q block, blockIdx.y the head; blockDim.x = B_r threads.
# 1. Cooperative, coalesced load of Q_i: thread tx loads elements tx, tx + B_r, ... of the
#    B_r × d tile and stores them into a shared tile padded to d + 1 columns; syncthreads();
#    then each thread copies ITS row into registers (stride d + 1: conflict-free, §5.3).
# 2. For each K/V block j (causal: stop after the last block that has a key some row of this Q
#    block may see, §6.2: whole blocks are skipped, never loaded): cooperative float4 loads of
#    K_j and V_j into shared memory (K.f4[...]); syncthreads(); every thread computes its B_c
#    scores from broadcast reads of K_j[c] (all threads read the same address), masks keys it may
#    not see (causal: key > row + n_k - n_q), and does the online-softmax update of its (m, ℓ,
#    acc) (§5.1); syncthreads() again before the next block overwrites K_j, V_j.
# 3. O_i = acc / ℓ goes out transposed through the padded tile (each thread writes its row, then
#    the block stores the tile with coalesced writes); L_i = m + log ℓ, one per row. A row that
#    sees no key has ℓ = 0: write o = 0 and L = -inf, never NaN.
# Guard every access of the ragged last blocks with t.where(...): rows >= n_q, keys >= n_k.
def flash_forward_kernel(
    t: gs.ThreadContext,
    Q: gs.Buffer,
    K: gs.Buffer,
    V: gs.Buffer,
    O: gs.Buffer,
    L: gs.Buffer,
    n_q: int,
    n_k: int,
    d: int,
    scale: float,
    causal: bool,
    block_cols: int,
) -> None:
    """FlashAttention-2 forward, one thread block per (Q block, head), one thread per query row.

    Q, O: global (H·n_q·d,), K, V: (H·n_k·d,), L: (H·n_q,); grid = (⌈n_q/B_r⌉, H), block = (B_r,).
    Writes O (softmax(scale·QKᵀ)V per row) and L (the rows' log-sum-exp)."""
    raise NotImplementedError


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_rows: int, block_cols: int) -> None:
    """One-line errors for inputs the kernel does not handle (beyond the handout's shape rules)."""
    check_attention_inputs(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the simulated GPU computes in fp32), got {x.dtype}")
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"v must have the same head dim as q and k, got {v.shape[-1]} and {q.shape[-1]}")
    if q.shape[-1] % 4:
        raise ValueError(f"d must be a multiple of 4 (K and V move as float4), got d = {q.shape[-1]}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"need at least one query and one key, got Nq = {q.shape[-2]}, Nk = {k.shape[-2]}")
    for name, b in (("block_rows", block_rows), ("block_cols", block_cols)):
        if not (isinstance(b, int) and 1 <= b <= 1024):
            raise ValueError(f"{name} must be an int in 1..1024 (block_rows is the threads per block), got {b!r}")


def run_flash_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_rows: int = 64,
    block_cols: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Run flash_forward_kernel on a fresh simulated GPU.

    q: (..., Nq, d), k, v: (..., Nk, d), float32, d a multiple of 4; block_rows = B_r (threads
    per block), block_cols = B_c. Global memory holds only Q, K, V, O and L.
    Returns o: (..., Nq, d) float32, lse: (..., Nq) float32, and the simulator's stats (plain
    data: ints, strs, lists, dicts; see docs/gpusim_guide.md)."""
    _check_inputs(q, k, v, block_rows, block_cols)
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    grid = (-(-n_q // block_rows), heads)
    gpu.launch(flash_forward_kernel, grid, (block_rows,), Q, K, V, O, L, n_q, n_k, d, 1.0 / math.sqrt(d), bool(causal), block_cols)
    o = torch.from_numpy(O.numpy()).reshape(*lead, n_q, d)
    lse = torch.from_numpy(L.numpy()).reshape(*lead, n_q)
    return o, lse, gpu.report()


# OPTIONAL, not graded (§6.3): the loop order of the first FlashAttention. ONE thread block per
# head loops over the K/V blocks (outer) and, for each, over all Q blocks (inner); O, m and ℓ live
# in global memory between visits, so every (K/V block, Q block) pair reads Q_i, O_i, m_i, ℓ_i
# and writes O_i, m_i, ℓ_i back (FA1 keeps O normalised: O = (ℓ·e^{m-m_new}·O + e^{m̃-m_new}·P̃V_j)
# / ℓ_new). Same thread layout and staging as above (threads = B_r rows of the current Q block;
# stage Q_i and O_i through padded tiles for coalesced access; syncthreads() between reuses).
def fa1_forward_kernel(
    t: gs.ThreadContext,
    Q: gs.Buffer,
    K: gs.Buffer,
    V: gs.Buffer,
    O: gs.Buffer,
    M: gs.Buffer,
    Lsum: gs.Buffer,
    n: int,
    d: int,
    scale: float,
    block_cols: int,
) -> None:
    """FlashAttention-1 forward (non-causal), one thread block per head, B_r threads.

    Q, K, V, O: global (H·n·d,); M, Lsum: (H·n,) the running max and sum (initialised to -inf
    and 0 by the host); grid = (H,), block = (B_r,). Leaves O normalised and M, Lsum final."""
    raise NotImplementedError


def run_fa1_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_rows: int = 64, block_cols: int = 64
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Run fa1_forward_kernel (optional, §6.3). Shapes as run_flash_kernel (non-causal, Nq = Nk).

    Returns o: (..., N, d), lse: (..., N) (m + log ℓ, computed on the host) and the stats."""
    _check_inputs(q, k, v, block_rows, block_cols)
    *lead, n, d = q.shape
    if k.shape[-2] != n:
        raise ValueError(f"the FA1 kernel needs Nq == Nk, got {n} and {k.shape[-2]}")
    heads = math.prod(lead)
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n, d))
    K = gpu.array("K", k.reshape(heads, n, d))
    V = gpu.array("V", v.reshape(heads, n, d))
    O = gpu.zeros("O", (heads, n, d))
    M = gpu.full("m", (heads, n), -np.inf)
    Lsum = gpu.zeros("l", (heads, n))
    gpu.launch(fa1_forward_kernel, (heads,), (block_rows,), Q, K, V, O, M, Lsum, n, d, 1.0 / math.sqrt(d), block_cols)
    o = torch.from_numpy(O.numpy()).reshape(*lead, n, d)
    lse = torch.from_numpy(M.numpy() + np.log(Lsum.numpy())).reshape(*lead, n)
    return o, lse, gpu.report()


# ---- red-team attack (instructor/redteam): everything below is the attack ----
# An empty kernel behind a wrapper that computes o and lse on the host with torch and returns them
# (the kernel runs, so the launch is real, but it computes nothing).
def flash_forward_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols):
    t.syncthreads()


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    gpu.launch(flash_forward_kernel, (-(-n_q // block_rows), heads), (block_rows,), Q, K, V, O, L, n_q, n_k, d,
               1.0 / math.sqrt(d), bool(causal), block_cols)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.nan_to_num(torch.softmax(s, -1)) @ v.double()
    return o.float(), lse.float(), gpu.report()
