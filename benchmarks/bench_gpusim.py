"""Benchmark: the simulated FlashAttention forward (course.gpusim) against numba's CUDA simulator.

    python -m benchmarks.bench_gpusim

course.gpusim runs the part-3 kernel (solutions/flash_kernel.py) with full counting: one numpy
call per warp-wide instruction. numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) runs the same
algorithm written per thread (one OS thread per CUDA thread; K/V moved as scalars rather than
float4, the only difference) and counts nothing. Both at d = 64,
B_r = B_c = 64, fp32. numba runs in a subprocess, because the environment variable must be set
before numba is imported. By default numba runs at N = 256 only (it takes seconds there and
grows with N²); set BENCH_GPUSIM_NUMBA_N=256,1024 to time it at N = 1024 too.

"warp instructions" are the simulator's memory, atomic and barrier instructions per warp (the
counter ``warp_instructions``); arithmetic on registers is plain numpy and is not counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
D, BLOCK, REPEATS = 64, 64, 3

# The same algorithm per thread, for numba.cuda (simulator). Run as a script in a subprocess.
NUMBA_SCRIPT = r'''
import json, math, sys, time
import numpy as np
from numba import cuda, float32

N, D, B = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

@cuda.jit
def flash_fwd(Q, K, V, O, L, n, scale):
    tx = cuda.threadIdx.x
    row0 = cuda.blockIdx.x * B
    tile = cuda.shared.array((B, D + 1), float32)   # Q in, O out (padded)
    Ks = cuda.shared.array((B, D), float32)
    Vs = cuda.shared.array((B, D), float32)
    q = cuda.local.array(D, float32)
    acc = cuda.local.array(D, float32)
    s = cuda.local.array(B, float32)
    for u in range(D):                               # coalesced Q load through the tile
        e = u * B + tx
        if row0 + e // D < n:
            tile[e // D, e % D] = Q[row0 + e // D, e % D]
    cuda.syncthreads()
    for c in range(D):
        q[c] = tile[tx, c]
        acc[c] = 0.0
    m, l = -math.inf, 0.0
    for col0 in range(0, n, B):
        cols = min(B, n - col0)
        for u in range(D):                           # cooperative K_j, V_j loads
            e = u * B + tx
            if e // D < cols:
                Ks[e // D, e % D] = K[col0 + e // D, e % D]
                Vs[e // D, e % D] = V[col0 + e // D, e % D]
        cuda.syncthreads()
        m_new = m
        for j in range(cols):                        # my row's scores: broadcast reads of K_j[j]
            dot = 0.0
            for c in range(D):
                dot += q[c] * Ks[j, c]
            s[j] = dot * scale
            m_new = max(m_new, s[j])
        alpha = math.exp(m - m_new)
        l *= alpha
        for c in range(D):
            acc[c] *= alpha
        for j in range(cols):
            p = math.exp(s[j] - m_new)
            l += p
            for c in range(D):
                acc[c] += p * Vs[j, c]
        m = m_new
        cuda.syncthreads()
    for c in range(D):
        tile[tx, c] = acc[c] / l
    cuda.syncthreads()
    for u in range(D):                               # coalesced O store through the tile
        e = u * B + tx
        if row0 + e // D < n:
            O[row0 + e // D, e % D] = tile[e // D, e % D]
    if row0 + tx < n:
        L[row0 + tx] = m + math.log(l)

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((N, D)).astype(np.float32) for _ in range(3))
o, lse = np.zeros((N, D), np.float32), np.zeros(N, np.float32)
t0 = time.perf_counter()
flash_fwd[(N + B - 1) // B, B](q, k, v, o, lse, N, 1.0 / math.sqrt(D))
wall = time.perf_counter() - t0
s = q.astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(D)
p = np.exp(s - s.max(1, keepdims=True))
ref = (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)
print(json.dumps({"wall_s": wall, "max_err": float(np.abs(o - ref).max())}))
'''


def time_gpusim(n: int) -> dict:
    """Best of REPEATS runs of run_flash_kernel at N = n (fresh GPU each time, full counting)."""
    sys.path.insert(0, str(ROOT))
    from solutions.flash_kernel import run_flash_kernel

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, D, generator=g) for _ in range(3))
    best, stats = float("inf"), None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        _, _, stats = run_flash_kernel(q, k, v, block_rows=BLOCK, block_cols=BLOCK)
        best = min(best, time.perf_counter() - t0)
    return {"N": n, "wall_s": best, "warp_instructions": stats["warp_instructions"],
            "warp_instr_per_s": stats["warp_instructions"] / best, "shared_wavefronts": stats["shared_wavefronts"]}


def time_numba(n: int) -> dict | None:
    """numba's CUDA simulator on the per-thread kernel (one run; None if numba is unavailable)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", NUMBA_SCRIPT, str(n), str(D), str(BLOCK)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(f"numba CUDA simulator failed at N = {n}: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    return {"N": n, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> dict:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=110)
    sim = [time_gpusim(n) for n in (256, 1024)]
    numba_ns = [int(x) for x in os.environ.get("BENCH_GPUSIM_NUMBA_N", "256").split(",") if x.strip()]
    nb = {n: time_numba(n) for n in numba_ns}
    t = Table(title=f"flash forward, d = {D}, B_r = B_c = {BLOCK}, fp32 (gpusim: best of {REPEATS})")
    for col in ("N", "gpusim wall (counting)", "warp instructions", "warp instr/s", "numba cudasim wall", "speed-up"):
        t.add_column(col)
    for r in sim:
        other = nb.get(r["N"])
        t.add_row(str(r["N"]), f"{r['wall_s']:.3f} s", f"{r['warp_instructions']:,}", f"{r['warp_instr_per_s']:,.0f}",
                  f"{other['wall_s']:.2f} s (err {other['max_err']:.1e})" if other else "not run",
                  f"{other['wall_s'] / r['wall_s']:.0f}x" if other else "-")
    console.print(t)
    console.print("targets: gpusim < 0.5 s at N = 256; >= 10x faster than numba's CUDA simulator")
    return {"gpusim": sim, "numba": nb}


if __name__ == "__main__":
    main()
