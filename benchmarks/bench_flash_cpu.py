"""The reference flash_forward against torch's fused attention on the CPU (float32, d = 64).

For N in {1024, 4096} and (batch, heads) = (1, 4), at one thread and at torch's default thread
count, times
`torch.nn.functional.scaled_dot_product_attention` (a fused C++ kernel, itself a tiled flash
algorithm on the CPU) and `solutions.flash_forward.flash_forward` (Python loops over tiles, torch
ops inside a tile) at the default 64 x 64 blocks and at 128 x 128, alternating them in rounds so
that load from other processes affects both alike; prints the median ratio. Then profiles one
flash_forward call to show where its time goes: the two tile matmuls against the softmax and
rescaling work (exp, max, sum, multiply-add) and the per-op overhead of the Python loop.

Run: python -m benchmarks bench_flash_cpu  (or make bench)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.benchmark import Timer  # noqa: E402

from solutions.flash_forward import flash_forward  # noqa: E402

BATCH, HEADS, D = 1, 4, 64
SEQ_LENS = (1024, 4096)
BLOCKS = ((64, 64), (128, 128))
ROUNDS = 3
MATMUL_OPS = {"aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm", "aten::addmm"}
SOFTMAX_OPS = {"aten::exp", "aten::amax", "aten::max", "aten::maximum", "aten::sum", "aten::sub", "aten::mul",
               "aten::add", "aten::div", "aten::log", "aten::where", "aten::masked_fill"}


def _time(fn, *args, min_run_time: float) -> float:
    return Timer("fn(*args)", globals={"fn": fn, "args": args}).blocked_autorange(min_run_time=min_run_time).median


def measure(n: int, rounds: int = ROUNDS) -> dict:
    """Median time of SDPA and of flash_forward per block size, and the median per-round ratio."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, n, D, generator=g) for _ in range(3))
    o_ref = F.scaled_dot_product_attention(q, k, v)
    min_run = 0.2 if n <= 1024 else 0.5
    out = {"N": n, "sdpa_s": [], **{f"flash_{bq}x{bk}_s": [] for bq, bk in BLOCKS}}
    for bq, bk in BLOCKS:
        err = (flash_forward(q, k, v, block_q=bq, block_k=bk)[0] - o_ref).abs().max().item()
        assert err < 1e-4, f"flash_forward disagrees with SDPA by {err}"  # same math, float32 rounding only
    for _ in range(rounds):
        out["sdpa_s"].append(_time(F.scaled_dot_product_attention, q, k, v, min_run_time=min_run))
        for bq, bk in BLOCKS:
            out[f"flash_{bq}x{bk}_s"].append(
                _time(lambda q, k, v: flash_forward(q, k, v, block_q=bq, block_k=bk), q, k, v, min_run_time=min_run)
            )
    for bq, bk in BLOCKS:
        key = f"flash_{bq}x{bk}_s"
        out[f"ratio_{bq}x{bk}"] = statistics.median(f / s for f, s in zip(out[key], out["sdpa_s"]))
    return out


def where_time_goes(n: int = 1024, block: int = 64) -> dict:
    """Profile one flash_forward call: self CPU time of matmuls, softmax/rescale ops, the rest."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, n, D, generator=g) for _ in range(3))
    flash_forward(q, k, v, block_q=block, block_k=block)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        flash_forward(q, k, v, block_q=block, block_k=block)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    groups = {"matmul (QK^T, PV)": 0.0, "softmax + rescale (exp, max, sum, mul, add, ...)": 0.0, "other (views, allocation)": 0.0}
    for e in events:
        key = ("matmul (QK^T, PV)" if e.key in MATMUL_OPS else
               "softmax + rescale (exp, max, sum, mul, add, ...)" if e.key in SOFTMAX_OPS else "other (views, allocation)")
        groups[key] += e.self_cpu_time_total
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    return {
        "groups": {k: v / total for k, v in groups.items()},
        "top": [(e.key, e.count, e.self_cpu_time_total / total) for e in top],
        "ops_per_tile": sum(e.count for e in events) / ((n // block) ** 2),
    }


def main() -> None:
    console = Console(width=120)
    default_threads = torch.get_num_threads()
    console.print(f"torch {torch.__version__}, float32, batch {BATCH}, {HEADS} heads, d = {D}; "
                  f"medians of {ROUNDS} alternating rounds")
    t = Table("threads", "N", "SDPA ms", *[f"flash {bq}x{bk} ms" for bq, bk in BLOCKS],
              *[f"ratio {bq}x{bk}" for bq, bk in BLOCKS], title="flash_forward / scaled_dot_product_attention (CPU)")
    try:
        for threads in sorted({1, default_threads}):
            torch.set_num_threads(threads)
            for n in SEQ_LENS:
                r = measure(n)
                t.add_row(str(threads), f"{n:,}", f"{statistics.median(r['sdpa_s']) * 1e3:,.1f}",
                          *[f"{statistics.median(r[f'flash_{bq}x{bk}_s']) * 1e3:,.1f}" for bq, bk in BLOCKS],
                          *[f"{r[f'ratio_{bq}x{bk}']:.2f}x" for bq, bk in BLOCKS])
        console.print(t)
        torch.set_num_threads(1)  # attribute time without thread-pool effects
        w = where_time_goes()
    finally:
        torch.set_num_threads(default_threads)
    t = Table("where flash_forward's time goes (N = 1024, 64 x 64 blocks, 1 thread)", "share of self CPU time")
    for k, v in w["groups"].items():
        t.add_row(k, f"{v:.0%}")
    console.print(t)
    t = Table("top op", "calls", "share")
    for key, count, share in w["top"]:
        t.add_row(key, f"{count:,}", f"{share:.0%}")
    console.print(t)
    console.print(f"{w['ops_per_tile']:.1f} torch ops per (Q block, K/V block) tile")


if __name__ == "__main__":
    main()
