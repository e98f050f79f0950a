"""Lecture 5, program 03: FlashAttention on the simulated GPU, counted (§5.2–§6.3).

Demo 1 (§5.3)  standard attention (3 kernels) against the flash kernel at N = 256, d = 64, fp32:
               every counter of course.gpusim, the global buffers (no S, no P in flash), the
               closed forms next to the counters, the 5.0x ideal-cache ratio, error vs float64
Demo 2 (§5.5)  the H100 estimate at N = 4096, d = 128, 32 heads, fp16 (course.cost_model), and
               those kernels on the H100 roofline (saved as code/lecture05/figures/roofline.png)
Demo 3 (§6.1)  block sizes at d = 128, fp16, K/V double-buffered (course.cost_model)
§6.2           causal whole-block skipping, measured: N = 256 with B = 64 (T = 4) and B = 8 (T = 32)
Demo 4 (§6.3)  FA1 against FA2: the cost model at N = 4096, d = 128, and both kernels measured
               on the simulator at small N against the same formulas

Run from the repository root: python code/lecture05/03_flash_on_gpusim.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (course/), and attention_kernels.py

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from course import cost_model as cm  # noqa: E402
from course.gpusim.kernels import standard_attention  # noqa: E402
from course.reference import attention_reference  # noqa: E402
import attention_kernels as ak  # noqa: E402  (your implementation: --impl DIR)

SEED = 0
console = Console(width=120)
FP32 = 4  # bytes per element on the simulated GPU
FIGURES = HERE / "figures"


def _qkv(n: int, d: int, heads: tuple[int, ...] = (), seed: int = SEED) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*heads, n, d, generator=g) for _ in range(3)]


# ---------------------------------------------------------------------------------------- demo 1
def counts(N: int = 256, d: int = 64, block: int = 64) -> dict:
    """§5.3: both approaches on the simulator, their counters, closed forms and errors."""
    q, k, v = _qkv(N, d)
    ref_o, _ = attention_reference(q, k, v)
    o_std, st_std = standard_attention(q, k, v)
    o_fl, lse_fl, st_fl = ak.run_flash_kernel(q, k, v, block_rows=block, block_cols=block)
    return {
        "N": N, "d": d, "block": block,
        "standard": st_std, "flash": st_fl,
        "err_standard": float((torch.from_numpy(o_std).double() - ref_o).abs().max()),
        "err_flash": float((o_fl.double() - ref_o).abs().max()),
        "closed": {  # elements (cost_model), x 4 bytes
            "standard_ideal": cm.io_standard(N, d),
            "flash_no_cache": cm.io_flash(N, d, block),
            "flash_ideal": cm.io_flash_ideal(N, d),
        },
    }


COUNTER_ROWS = [
    ("kernel launches", "launches"),
    ("thread blocks", "thread_blocks"),
    ("global requests (warp instructions)", "global_requests"),
    ("global sectors (32 B)", "global_sectors"),
    ("global useful bytes", "global_bytes"),
    ("DRAM bytes, no cache (sectors x 32)", "dram_bytes_no_cache"),
    ("DRAM bytes, ideal cache (each sector once)", "dram_bytes_ideal_cache"),
    ("shared requests", "shared_requests"),
    ("shared wavefronts", "shared_wavefronts"),
    ("shared bank conflicts", "shared_bank_conflicts"),
    ("barriers (warp-level)", "barriers"),
    ("races", "races"),
]


def print_counts(N: int = 256, d: int = 64, B: int = 64) -> None:
    console.rule(f"Demo 1 (§5.3): the counts, N = {N}, d = {d}, one head, fp32, flash B_r = B_c = {B}")
    c = counts(N, d, B)  # runs your part 3 kernel
    st, fl = c["standard"], c["flash"]
    t = Table("counter", "standard (3 kernels)", "flash (1 kernel)")
    for label, key in COUNTER_ROWS:
        t.add_row(label, f"{st[key]:,}", f"{fl[key]:,}")
    t.add_row("global buffers", " ".join(st["buffers"]), " ".join(fl["buffers"]))
    t.add_row("max |o - float64 reference|", f"{c['err_standard']:.1e}", f"{c['err_flash']:.1e}")
    console.print(t)
    absent = [b for b in ("S", "P") if b not in fl["buffers"]]
    console.print(f"Flash's global memory holds only {', '.join(fl['buffers'])}: {' and '.join(absent)} never appear there.")

    t = Table("quantity", "closed form (elements)", "elements", "x 4 bytes", "simulator (bytes)", "equal")
    rows = [
        ("standard, ideal cache", "4Nd + 4N²", c["closed"]["standard_ideal"], st["dram_bytes_ideal_cache"]),
        ("flash, no cache", "2Nd + 2Nd·N/B_r + N", c["closed"]["flash_no_cache"], fl["dram_bytes_no_cache"]),
        ("flash, ideal cache", "4Nd + N", c["closed"]["flash_ideal"], fl["dram_bytes_ideal_cache"]),
    ]
    for name, formula, elems, sim in rows:
        t.add_row(name, formula, f"{elems:,}", f"{elems * FP32:,}", f"{sim:,}", "yes" if elems * FP32 == sim else "NO")
    console.print(t)
    sp = sum(st["buffers"][b]["dram_bytes_ideal_cache"] for b in ("S", "P"))
    ratio = st["dram_bytes_ideal_cache"] / fl["dram_bytes_ideal_cache"]
    console.print(
        f"Ideal cache: {st['dram_bytes_ideal_cache']:,} / {fl['dram_bytes_ideal_cache']:,} bytes = {ratio:.1f}x; "
        f"S and P account for {sp:,} of the standard bytes, the rest ({st['dram_bytes_ideal_cache'] - sp:,}) is "
        f"Q, K, V, O as in flash (+ L: {fl['buffers']['L']['dram_bytes_ideal_cache']:,})."
    )
    console.print(
        f"Shared-memory wavefronts: flash {fl['shared_wavefronts']:,} against {st['shared_wavefronts']:,} "
        f"(one thread per row turns each float4 broadcast into 4 multiply-adds; a property of these two "
        f"kernels, not of FlashAttention)."
    )


# ---------------------------------------------------------------------------------------- demo 2
def print_h100() -> list[dict]:
    rows = cm.h100_forward_estimate()
    console.rule("Demo 2 (§5.5): H100 estimate, N = 4096, d = 128, 32 heads, fp16 (a lower bound)")
    t = Table("kernel", "GFLOP", "MB moved", "compute µs", "memory µs", "time µs", "bound", "speed-up")
    for r in rows:
        t.add_row(r["name"], f"{r['flops'] / 1e9:,.1f}", f"{r['bytes'] / 1e6:,.1f}", f"{r['compute_us']:,.0f}",
                  f"{r['memory_us']:,.0f}", f"{r['time_us']:,.0f}", r["bound"], f"{r['speedup']:.1f}x")
    console.print(t)
    return rows


def save_roofline(out_dir: Path = FIGURES) -> Path:
    """The H100 roofline (cost_model.attainable_flops) with Demo 2's kernels on it, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu = cm.H100
    points = cm.roofline_points(gpu=gpu)
    out_dir.mkdir(parents=True, exist_ok=True)
    xs = sorted([2.0 ** e for e in range(0, 14)] + [gpu.ridge])
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.loglog(xs, [cm.attainable_flops(x, gpu) / 1e12 for x in xs], color="black",
              label=f"roofline: min({gpu.peak_fp16_flops / 1e12:.0f} TFLOP/s, intensity x {gpu.hbm_bandwidth / 1e12:.2f} TB/s)")
    ax.axvline(gpu.ridge, color="gray", linestyle="--", linewidth=1)
    ax.text(gpu.ridge * 1.08, 20, f"ridge {gpu.ridge:.0f} FLOP/B", color="gray")
    names: dict[float, list[str]] = {}
    for p in points:  # kernels 1 and 3 of standard attention share one point
        names.setdefault(round(p["intensity"], 6), []).append(p["name"])
    for (x, labels), marker in zip(names.items(), "osD^v"):
        y = cm.attainable_flops(x, gpu) / 1e12
        ax.plot([x], [y], marker, markersize=9, linestyle="none", alpha=0.8,
                label=f"{' / '.join(labels)}: {x:,.0f} FLOP/B, {y:,.0f} TFLOP/s")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("attainable TFLOP/s (FP16 dense)")
    ax.set_title(f"{gpu.name}: attention kernels of Demo 2 on the roofline (N = 4096, d = 128)")
    ax.legend(loc="upper left", fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = out_dir / "roofline.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------- demo 3
def print_blocks() -> list[dict]:
    rows = cm.block_size_table()
    console.rule("Demo 3 (§6.1): block size B_r = B_c = B at d = 128, fp16, K/V double-buffered (H100: 228 KiB/SM)")
    t = Table("B", "shared memory", "fits one SM", "K/V passes N/B_r (N = 4096)", "K/V traffic (elements)", "acc floats/row")
    for r in rows:
        t.add_row(str(r["block"]), f"{r['smem_kib']:.0f} KiB", "yes" if r["fits"] else "no", str(r["kv_passes"]),
                  f"{r['kv_traffic_elements']:,}", str(r["acc_floats_per_row"]))
    console.print(t)
    return rows


# ---------------------------------------------------------------------------------------- §6.2
def causal_skipping(N: int = 256, d: int = 64, blocks: tuple[int, ...] = (64, 8)) -> list[dict]:
    """K/V bytes read with causal whole-block skipping, measured, against all T² block pairs."""
    q, k, v = _qkv(N, d)
    out = []
    for B in blocks:
        T = math.ceil(N / B)
        _, _, st = ak.run_flash_kernel(q, k, v, causal=True, block_rows=B, block_cols=B)
        kv = sum(st["buffers"][n]["dram_bytes_no_cache"] for n in ("K", "V"))
        per_pair = 2 * B * d * FP32  # one K block and one V block
        out.append({"N": N, "B": B, "T": T, "pairs": kv // per_pair, "all_pairs": T * T,
                    "formula_pairs": T * (T + 1) // 2, "kv_bytes": kv, "kv_bytes_all": T * T * per_pair,
                    "fraction": kv / (T * T * per_pair)})
    return out


def print_causal() -> None:
    console.rule("§6.2: causal, whole K/V blocks above the diagonal skipped (measured on the simulator)")
    rows = causal_skipping()  # runs your part 3 kernel
    t = Table("N", "B", "T", "block pairs computed", "T(T+1)/2", "K/V bytes read", "all T² pairs", "fraction")
    for r in rows:
        t.add_row(str(r["N"]), str(r["B"]), str(r["T"]), f"{r['pairs']} of {r['all_pairs']}", str(r["formula_pairs"]),
                  f"{r['kv_bytes']:,}", f"{r['kv_bytes_all']:,}", f"{r['fraction']:.1%}")
    console.print(t)
    console.print("All-pairs bytes: T² x 2·B·d·4, the non-causal count that Demo 1 measures at T = 4.")


# ---------------------------------------------------------------------------------------- demo 4
def fa1_vs_fa2_measured(N: int = 256, d: int = 64, block: int = 64, heads: int = 2) -> dict | None:
    """Both loop orders on the simulator (no cache) against cost_model.io_fa1 / io_flash. None
    when the (optional, ungraded) FA1 kernel is not written yet."""
    q, k, v = _qkv(N, d, (heads,))
    ref_o, _ = attention_reference(q, k, v)
    o2, _, st2 = ak.run_flash_kernel(q, k, v, block_rows=block, block_cols=block)  # part 3 (graded)
    try:
        o1, _, st1 = ak.run_fa1_kernel(q, k, v, block_rows=block, block_cols=block)
    except NotImplementedError:
        console.print("FA1 is optional (§6.3, not graded): write fa1_forward_kernel in flash_kernel.py to "
                      "measure it here")
        return None
    return {
        "N": N, "d": d, "block": block, "heads": heads,
        "fa1": {"elements": st1["dram_bytes_no_cache"] // FP32, "formula": heads * cm.io_fa1(N, d, block, block),
                "thread_blocks": st1["thread_blocks"], "err": float((o1.double() - ref_o).abs().max())},
        "fa2": {"elements": st2["dram_bytes_no_cache"] // FP32, "formula": heads * cm.io_flash(N, d, block),
                "thread_blocks": st2["thread_blocks"], "err": float((o2.double() - ref_o).abs().max())},
    }


def print_fa1_fa2_model() -> None:
    console.rule("Demo 4 (§6.3): FA1 (K/V outer) against FA2 (Q outer)")
    t = Table("N = 4096, d = 128, B = 128, 32 heads", "HBM traffic per head (elements)", "thread blocks")
    for r in cm.fa1_vs_fa2():
        t.add_row(r["name"], f"{r['elements'] / 1e6:.1f} M ({r['elements']:,})", f"{r['thread_blocks']:,}")
    console.print(t)


def print_fa1_fa2(m: dict | None) -> None:
    if m is None:
        return
    console.print(f"Measured on the simulator: N = {m['N']}, d = {m['d']}, B_r = B_c = {m['block']}, {m['heads']} heads, no cache")
    t = Table("kernel", "formula (per head)", "formula x heads", "simulator (elements)", "equal", "thread blocks", "max |o - ref|")
    for name, key, formula in (("FA1", "fa1", "2Nd + ⌈N/B_c⌉(3Nd + 4N)"), ("FA2", "fa2", "2Nd + 2Nd·⌈N/B_r⌉ + N")):
        r = m[key]
        t.add_row(name, formula, f"{r['formula']:,}", f"{r['elements']:,}", "yes" if r["elements"] == r["formula"] else "NO",
                  str(r["thread_blocks"]), f"{r['err']:.1e}")
    console.print(t)
    console.print("FA1 keeps O, m, ℓ in HBM between K/V blocks and can only parallelise over (batch, head); "
                  "FA2 keeps O_i in registers until its Q block is done, and every Q block is a thread block.")


def main(argv: list[str] | None = None) -> None:
    ak.setup(__doc__, argv)
    console.print("[bold]Lecture 5, program 03: FlashAttention on the simulated GPU (course.gpusim)[/bold]")
    with ak.part_demo():  # each block runs your part 3 kernel; a stub skips only that block
        print_counts()
    print_h100()
    path = save_roofline()
    console.print(f"saved {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    print_blocks()
    with ak.part_demo():
        print_causal()
    print_fa1_fa2_model()
    with ak.part_demo():
        print_fa1_fa2(fa1_vs_fa2_measured())


if __name__ == "__main__":
    main()
