"""Cost model of the lecture: GPU specs, FLOP and HBM-traffic formulas, roofline estimates.

Every figure the notes estimate (as opposed to measure) comes out of this one module, and each
table function below returns a list of plain dict rows that the lecture programs print and the
tests assert. Traffic formulas count *elements* (multiply by the element size for bytes); they
are per (batch, head) unless a function says otherwise.

Model and assumptions (stated once, used everywhere):
- Roofline per kernel: time = max(FLOPs / peak, bytes / bandwidth) + one launch overhead.
  Peak is the dense FP16 tensor-core rate, bandwidth the HBM bandwidth (both from the vendor's
  public spec sheets, below). Non-matmul work (exp, max, sums) is not counted as FLOPs.
- LAUNCH_OVERHEAD_S = 4 µs per kernel. It is the one free parameter; with it the notes'
  §5.5 standard total comes out as 1,322 µs of traffic + 3 launches = 1,334 µs.
- "Ideal cache": every input byte is read from HBM once per kernel launch and every output byte
  written once (the model of the standard kernels' 4Nd + 4N^2, §3.2). "No cache": every thread
  block reads its own tiles from HBM (the model of io_flash, where each Q block re-reads K/V).
- Sizes: fp16 activations and P (2 bytes); L (logsumexp) kept in fp32 (4 bytes), as
  FlashAttention does. GiB/MiB are powers of two; "80 GB" HBM is 80e9 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KiB, MiB, GiB = 1024, 1024**2, 1024**3

LAUNCH_OVERHEAD_S = 4e-6  # per kernel launch; reproduces §5.5's 1,334 µs = 1,322 µs + 3 x 4 µs
FP16_BYTES = 2
LSE_BYTES = 4  # L is stored in fp32


# --------------------------------------------------------------------------------------------
# GPU specs (public spec-sheet values; dense, i.e. without 2:4 sparsity)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPUSpec:
    """One GPU's headline numbers. ridge = peak / bandwidth, in FLOP per byte (§1, §3.2)."""

    name: str
    peak_fp16_flops: float  # dense FP16 tensor-core FLOP/s
    hbm_bandwidth: float  # bytes/s
    sms: int
    smem_per_sm: int  # bytes of shared memory per SM (max configurable)
    l2_bytes: int | None  # None where we do not state a figure (not used by any table)
    hbm_bytes: int
    fp32_flops: float | None = None  # non-tensor FP32 FLOP/s (§6.3 quotes A100's 19.5 T)

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a kernel is compute bound."""
        return self.peak_fp16_flops / self.hbm_bandwidth


V100 = GPUSpec("V100 SXM2 32GB", 125e12, 900e9, 80, 96 * KiB, 6 * MiB, 32 * 10**9, 15.7e12)
A100 = GPUSpec("A100 SXM4 80GB", 312e12, 2039e9, 108, 164 * KiB, 40 * MiB, 80 * 10**9, 19.5e12)
H100 = GPUSpec("H100 SXM5 80GB", 989e12, 3.35e12, 132, 228 * KiB, 50 * MiB, 80 * 10**9, 67e12)
# B200 (HGX): 2.25 PFLOP/s dense FP16, 8 TB/s HBM3e, 148 SMs, 180 GB. Its ridge (281) is a
# little *below* H100's (295): the trend of §7.6 is not strictly monotone across generations.
B200 = GPUSpec("B200 (HGX) 180GB", 2.25e15, 8e12, 148, 228 * KiB, None, 180 * 10**9)

GPUS: dict[str, GPUSpec] = {"V100": V100, "A100": A100, "H100": H100, "B200": B200}
GENERATIONS: tuple[GPUSpec, ...] = (V100, A100, H100, B200)  # Volta, Ampere, Hopper, Blackwell


def roofline_time(flops: float, nbytes: float, gpu: GPUSpec = H100, launches: int = 1) -> float:
    """Seconds for a kernel: max(compute time, memory time) + launch overheads."""
    return max(flops / gpu.peak_fp16_flops, nbytes / gpu.hbm_bandwidth) + launches * LAUNCH_OVERHEAD_S


def _bound(flops: float, nbytes: float, gpu: GPUSpec) -> str:
    """Which side of the roofline a kernel sits on: "compute" or "memory"."""
    return "compute" if flops / gpu.peak_fp16_flops >= nbytes / gpu.hbm_bandwidth else "memory"


# --------------------------------------------------------------------------------------------
# FLOP and traffic formulas (elements, one head)
# --------------------------------------------------------------------------------------------
def attention_flops(N: int, d: int, causal: bool = False) -> float:
    """Matmul FLOPs of one head's forward: QK^T and PV, 2N^2d each (§3.1); causal halves it."""
    flops = 4 * N * N * d
    return flops / 2 if causal else flops


def io_standard(N: int, d: int) -> int:
    """Standard attention, 3 kernels, ideal cache: read Q,K,V + write O (4Nd); S and P (4N^2) (§3.2)."""
    return 4 * N * d + 4 * N * N


def io_flash(N: int, d: int, Br: int) -> int:
    """FA2 forward, no cache: Q read and O written once (2Nd), K/V re-read by each of the
    ceil(N/Br) Q blocks (2Nd * N/Br), L written (N) (§5.4)."""
    return 2 * N * d + 2 * N * d * math.ceil(N / Br) + N


def io_flash_ideal(N: int, d: int) -> int:
    """FA2 forward with K/V served from L2 after their first read: 4Nd + N (§5.5)."""
    return 4 * N * d + N


def io_fa1(N: int, d: int, Br: int, Bc: int) -> int:
    """FA1 forward (K/V blocks outer, §6.3): K, V read once (2Nd); for each of the ceil(N/Bc)
    K/V blocks every Q block is read (Nd), O read and written back (2Nd) and m, l read and
    written back (4N). Br sets how the inner loop is tiled but not the count."""
    del Br  # the inner Q tiling does not change the traffic
    return 2 * N * d + math.ceil(N / Bc) * (3 * N * d + 4 * N)


def backward_flops_standard(N: int, d: int) -> float:
    """Standard backward with P stored: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: 8N^2d."""
    return 8 * N * N * d


def backward_flops_flash(N: int, d: int) -> float:
    """Flash backward: the four products above plus recomputing S = QK^T: 10N^2d (§7.5), i.e.
    exactly 2.5x the forward's 4N^2d."""
    return 10 * N * N * d


def io_backward_standard(N: int, d: int) -> int:
    """Standard backward, 5 kernels, ideal cache for the Nd-sized tensors (§7.5, exercise 6):
    read Q, K, V, dO and write dQ, dK, dV (7Nd); the N^2 matrices go through HBM: P read twice
    (for dV and for dS), dP written and read, dS written and read twice (for dQ and dK): 7N^2."""
    return 7 * N * N + 7 * N * d


def io_backward_flash(N: int, d: int) -> int:
    """Flash backward, ideal cache: read Q, K, V, O, dO (5Nd) and L (N), write dQ, dK, dV (3Nd).
    D = rowsum(dO * O) is formed on chip from the O and dO already read."""
    return 8 * N * d + N


# --------------------------------------------------------------------------------------------
# §3.1 / §3.2: the 7B layer
# --------------------------------------------------------------------------------------------
def layer_linear_flops_per_token(d_model: int = 4096, d_ffn: int = 11008) -> float:
    """FLOPs per token of one Llama-style layer outside attention: 4 projections (Q, K, V, O:
    2 * 4 d_model^2) and the SwiGLU FFN's three matrices (2 * 3 d_model d_ffn)."""
    return 2 * (4 * d_model * d_model + 3 * d_model * d_ffn)


def layer_flops_table(
    seq_lens: tuple[int, ...] = (1024, 4096, 16384, 32768, 131072),
    d_model: int = 4096,
    n_heads: int = 32,
    d_ffn: int = 11008,
    causal: bool = True,
) -> list[dict]:
    """§3.1: FLOPs of one 7B-scale layer (d_model 4096, 32 x 128, FFN 11008) against N.

    attention = QK^T + PV over all heads (4 N^2 d_model, halved when causal); S size is one
    layer's scores over all heads in fp16 (the notes' last column: 64 GiB at 32K).
    """
    rows = []
    for N in seq_lens:
        linear = N * layer_linear_flops_per_token(d_model, d_ffn)
        attn = n_heads * attention_flops(N, d_model // n_heads, causal)
        s_bytes = n_heads * N * N * FP16_BYTES
        rows.append(
            {
                "N": N,
                "linear_flops": linear,
                "attention_flops": attn,
                "attention_share": attn / (attn + linear),
                "s_bytes": s_bytes,
                "s_gib": s_bytes / GiB,
            }
        )
    return rows


def attention_traffic_vs_matmul(
    seq_lens: tuple[int, ...] = (4096, 32768),
    n_heads: int = 32,
    d: int = 128,
    gpu: GPUSpec = H100,
) -> list[dict]:
    """§3.2: one layer's standard attention on an H100: HBM traffic time (4Nd + 4N^2 per head,
    fp16) against matmul time (4N^2d per head, the masked half included), no launch overheads.
    At 32K: S is 64 GiB, 86% of the 80 GB, and traffic takes ~82 ms against ~18 ms of matmul."""
    rows = []
    for N in seq_lens:
        nbytes = n_heads * io_standard(N, d) * FP16_BYTES
        flops = n_heads * attention_flops(N, d)
        s_bytes = n_heads * N * N * FP16_BYTES
        rows.append(
            {
                "N": N,
                "traffic_bytes": nbytes,
                "traffic_ms": nbytes / gpu.hbm_bandwidth * 1e3,
                "matmul_flops": flops,
                "matmul_ms": flops / gpu.peak_fp16_flops * 1e3,
                "s_gib": s_bytes / GiB,
                "s_fraction_of_hbm": s_bytes / gpu.hbm_bytes,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# §5.5: the H100 forward estimate
# --------------------------------------------------------------------------------------------
def h100_forward_estimate(
    N: int = 4096, d: int = 128, n_heads: int = 32, block_rows: int = 128, gpu: GPUSpec = H100
) -> list[dict]:
    """§5.5: standard attention (3 kernels) against one flash kernel, FP16, all heads.

    Rows: the three standard kernels, the standard total (~1,334 µs incl. 3 launches), flash
    with K/V served from L2 (io_flash_ideal, ~282 µs, 4.7x) and flash re-reading K/V from HBM
    (io_flash with B_r = block_rows, 2.0x). Each row: flops, bytes, compute_us, memory_us,
    time_us (roofline + launches), bound, speedup (standard total / this row's time).
    """
    H, b = n_heads, FP16_BYTES
    kernels = [
        ("standard kernel 1: S = QK^T/sqrt(d)", H * 2 * N * N * d, H * (2 * N * d + N * N) * b),
        ("standard kernel 2: P = softmax(S)", 0.0, H * 2 * N * N * b),
        ("standard kernel 3: O = PV", H * 2 * N * N * d, H * (N * N + 2 * N * d) * b),
    ]
    rows = [_row(name, f, nb, gpu, 1) for name, f, nb in kernels]
    total = {
        "name": "standard total (3 kernels)",
        "flops": sum(r["flops"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "compute_us": sum(r["compute_us"] for r in rows),
        "memory_us": sum(r["memory_us"] for r in rows),
        "time_us": sum(r["time_us"] for r in rows),
        "bound": "memory" if all(r["bound"] == "memory" for r in rows) else "mixed",
        "launches": 3,
    }
    rows.append(total)
    flops = H * attention_flops(N, d)
    rows.append(_row("flash, K/V from L2 (4Nd + N)", flops, H * io_flash_ideal(N, d) * b, gpu, 1))
    rows.append(_row(f"flash, K/V from HBM (B_r = {block_rows})", flops, H * io_flash(N, d, block_rows) * b, gpu, 1))
    for r in rows:
        r["speedup"] = total["time_us"] / r["time_us"]
    return rows


def _row(name: str, flops: float, nbytes: float, gpu: GPUSpec, launches: int) -> dict:
    """One table row: a kernel (or kernels) of `flops` FLOPs moving `nbytes` bytes, on the roofline."""
    return {
        "name": name,
        "flops": flops,
        "bytes": nbytes,
        "compute_us": flops / gpu.peak_fp16_flops * 1e6,
        "memory_us": nbytes / gpu.hbm_bandwidth * 1e6,
        "time_us": roofline_time(flops, nbytes, gpu, launches) * 1e6,
        "bound": _bound(flops, nbytes, gpu),
        "launches": launches,
    }


def attainable_flops(intensity: float, gpu: GPUSpec = H100) -> float:
    """The roofline: FLOP/s a kernel of `intensity` FLOP/byte can reach, min(peak, intensity x bandwidth)."""
    return min(gpu.peak_fp16_flops, intensity * gpu.hbm_bandwidth)


def roofline_points(N: int = 4096, d: int = 128, n_heads: int = 32, block_rows: int = 128,
                    gpu: GPUSpec = H100) -> list[dict]:
    """§5.5 on the roofline: each kernel of `h100_forward_estimate` with its arithmetic intensity
    (FLOP/byte), the FLOP/s the roofline allows at that intensity, and its bound. The softmax kernel
    (no matmul FLOPs, intensity 0) and the 3-kernel total are left out: a log axis has no 0."""
    rows = []
    for r in h100_forward_estimate(N, d, n_heads, block_rows, gpu):
        if r["flops"] == 0 or r["launches"] != 1:
            continue
        intensity = r["flops"] / r["bytes"]
        rows.append({"name": r["name"], "intensity": intensity, "attainable_flops": attainable_flops(intensity, gpu),
                     "bound": "compute" if intensity >= gpu.ridge else "memory"})
    return rows


# --------------------------------------------------------------------------------------------
# §6.1 block sizes, §6.3 FA1 vs FA2
# --------------------------------------------------------------------------------------------
def block_size_table(
    d: int = 128, blocks: tuple[int, ...] = (32, 64, 128, 256), N: int = 4096, gpu: GPUSpec = H100
) -> list[dict]:
    """§6.1: shared memory for B_r = B_c = B at head dim d in FP16 with K/V double-buffered:
    Q block B*d plus 2 buffers x (K block + V block) = B*d + 4*B*d elements. Also the K/V
    traffic 2Nd * N/B_r that the block size controls, and whether it fits one SM."""
    rows = []
    for B in blocks:
        smem = (B * d + 2 * 2 * B * d) * FP16_BYTES
        rows.append(
            {
                "block": B,
                "smem_bytes": smem,
                "smem_kib": smem / KiB,
                "fits": smem <= gpu.smem_per_sm,
                "kv_passes": math.ceil(N / B),
                "kv_traffic_elements": 2 * N * d * math.ceil(N / B),
                "acc_floats_per_row": d,
            }
        )
    return rows


def fa1_vs_fa2(
    N: int = 4096, d: int = 128, Br: int = 128, Bc: int = 128, batch: int = 1, n_heads: int = 32
) -> list[dict]:
    """§6.3: HBM traffic (elements, one head) and thread blocks for FA1 and FA2.

    FA1 ~51.9M, FA2 ~34.6M, FA2 with K/V in L2 ~2.1M at N=4096, d=128, B=128; FA1 can only
    parallelise over (batch, head) = 32 blocks, FA2 also over Q blocks = 1,024.
    """
    fa1_blocks = batch * n_heads
    fa2_blocks = batch * n_heads * math.ceil(N / Br)
    return [
        {"name": "FA1 (K/V outer)", "elements": io_fa1(N, d, Br, Bc), "thread_blocks": fa1_blocks},
        {"name": "FA2 (Q outer)", "elements": io_flash(N, d, Br), "thread_blocks": fa2_blocks},
        {"name": "FA2, K/V in L2", "elements": io_flash_ideal(N, d), "thread_blocks": fa2_blocks},
    ]


# --------------------------------------------------------------------------------------------
# §7: backward
# --------------------------------------------------------------------------------------------
def p_storage_table(
    seq_lens: tuple[int, ...] = (4096, 16384, 32768, 65536, 131072), n_heads: int = 32
) -> list[dict]:
    """§7.1/§7.2: storing P (fp16, all heads of one layer) against storing only L (fp32).
    64K: P 256 GiB, L 8 MiB, 32,768x smaller."""
    rows = []
    for N in seq_lens:
        p = n_heads * N * N * FP16_BYTES
        l_ = n_heads * N * LSE_BYTES
        rows.append({"N": N, "p_bytes": p, "p_gib": p / GiB, "l_bytes": l_, "l_mib": l_ / MiB, "ratio": p / l_})
    return rows


def backward_estimate(N: int = 4096, d: int = 128, n_heads: int = 32, gpu: GPUSpec = H100) -> list[dict]:
    """§7.5: standard backward (P stored; 5 kernels, each memory bound) against the flash
    backward (one fused kernel, P recomputed from L), FP16, all heads, with launch overheads.

    Rows: standard, flash, and a "ratio" row (flash / standard for FLOPs and bytes, standard /
    flash for time): +25% FLOPs, 1/29 of the traffic, 3.3x faster.
    """
    H, b = n_heads, FP16_BYTES
    # One roofline over the five kernels' summed FLOPs and bytes: each kernel moves at least N^2
    # elements for at most 2N^2d FLOPs, so each is memory bound and the sum of their rooflines
    # equals the roofline of the sums (plus 5 launches).
    std = _row("standard backward (P stored, 5 kernels)", H * backward_flops_standard(N, d),
               H * io_backward_standard(N, d) * b, gpu, 5)
    fl = _row("flash backward (recompute P)", H * backward_flops_flash(N, d), H * io_backward_flash(N, d) * b, gpu, 1)
    ratio = {
        "name": "flash / standard",
        "flops_ratio": fl["flops"] / std["flops"],
        "bytes_ratio": fl["bytes"] / std["bytes"],
        "speedup": std["time_us"] / fl["time_us"],
    }
    return [std, fl, ratio]


def recompute_ratio_table(
    head_dims: tuple[int, ...] = (64, 128, 256), gpus: tuple[GPUSpec, ...] = GENERATIONS
) -> list[dict]:
    """§7.6: recomputing one score costs 2d FLOPs, reading a stored P element back costs 2
    bytes, so recompute / read-back = (2d / peak) / (2 / bandwidth) = d / ridge, independent of
    N. Below 1 recomputing is cheaper. The crossover head dim is the ridge (V100: d > 139)."""
    rows = []
    for gpu in gpus:
        row = {"gpu": gpu.name, "peak_tflops": gpu.peak_fp16_flops / 1e12, "bandwidth_tbs": gpu.hbm_bandwidth / 1e12,
               "ridge": gpu.ridge, "crossover_d": gpu.ridge}
        for d in head_dims:
            row[f"ratio_d{d}"] = d / gpu.ridge
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# §8: inference
# --------------------------------------------------------------------------------------------
def kv_cache_bytes(
    tokens: int = 1, batch: int = 1, n_layers: int = 32, d_model: int = 4096, bytes_per: int = FP16_BYTES
) -> int:
    """§8.2: K and V (2 x d_model numbers) per token per layer. 7B: 0.5 MiB per token;
    batch 128 x 2048 tokens: 128 GiB."""
    return 2 * d_model * n_layers * bytes_per * tokens * batch


def prefill_decode_table(
    context: int = 2048,
    batches: tuple[int, ...] = (1, 8, 32, 128),
    d_model: int = 4096,
    n_heads: int = 32,
    d_ffn: int = 11008,
    gpu: GPUSpec = H100,
) -> list[dict]:
    """§8.3: one 7B-scale layer on an H100 (FP16, ridge 295), prefill against decode.

    Assumptions: prefill = one sequence of `context` tokens, causal flash attention (FLOPs
    2 N^2 d_model, traffic 4Nd + N per head); decode = one new token per sequence attending a
    KV cache of `context` tokens. Linear traffic = the layer's weights (fp16), read once per
    step and shared by the batch (activations, <5% at batch 128, are ignored), so the linear
    layers' intensity is ~batch FLOP/byte. Decode attention reads each sequence's own K/V
    cache (2 x context x d_model) plus q and o: intensity ~1 whatever the batch. Kernel launch
    overheads are left out. Attention share: 8% at batch 1, 91% at batch 128; a decode token
    at batch 1 costs ~300x a prefill token.
    """
    weights = 4 * d_model * d_model + 3 * d_model * d_ffn
    d = d_model // n_heads
    bw, peak = gpu.hbm_bandwidth, gpu.peak_fp16_flops

    def row(phase: str, batch: int, tokens_per_seq: int, attn_flops: float, attn_bytes: float) -> dict:
        lin_flops = 2 * weights * batch * tokens_per_seq
        lin_bytes = weights * FP16_BYTES
        lin_t = max(lin_flops / peak, lin_bytes / bw)
        attn_t = max(attn_flops / peak, attn_bytes / bw)
        return {
            "phase": phase,
            "batch": batch,
            "tokens": batch * tokens_per_seq,
            "linear_intensity": lin_flops / lin_bytes,
            "linear_us": lin_t * 1e6,
            "linear_bound": _bound(lin_flops, lin_bytes, gpu),
            "attention_intensity": attn_flops / attn_bytes,
            "attention_us": attn_t * 1e6,
            "attention_bound": _bound(attn_flops, attn_bytes, gpu),
            "attention_share": attn_t / (attn_t + lin_t),
            "us_per_token": (attn_t + lin_t) * 1e6 / (batch * tokens_per_seq),
        }

    N = context
    rows = [row("prefill", 1, N, n_heads * attention_flops(N, d, causal=True),
                n_heads * io_flash_ideal(N, d) * FP16_BYTES)]
    for B in batches:
        attn_flops = B * 4 * context * d_model  # q.K^T and p.V for one query over the cache
        attn_bytes = B * (2 * context + 2) * d_model * FP16_BYTES  # K, V cache + q, o
        rows.append(row("decode", B, 1, attn_flops, attn_bytes))
    return rows


def flash_decoding_estimate(
    context: int = 32768,
    splits: tuple[int, ...] = (1, 2, 4, 5, 8),
    batch: int = 1,
    n_heads: int = 32,
    d: int = 128,
    gpu: GPUSpec = H100,
) -> list[dict]:
    """§8.4: a decode step's attention split into S segments per (batch, head), FP16.

    Simplified model of the notes: batch*heads*S thread blocks, each reading its segment of
    K and V (2 x ceil(context/S) x d elements) at 1/sms of the HBM bandwidth (an upper bound
    on the gap: one real SM can draw more); blocks beyond one per SM wait for the next wave;
    one launch overhead. The small combine kernel is not modelled. 32K: S=4 ~169 µs, S=5
    ~268 µs (160 blocks, two waves).
    """
    per_sm_bw = gpu.hbm_bandwidth / gpu.sms
    rows = []
    for S in splits:
        blocks = batch * n_heads * S
        waves = math.ceil(blocks / gpu.sms)
        block_bytes = 2 * math.ceil(context / S) * d * FP16_BYTES
        t = waves * block_bytes / per_sm_bw + LAUNCH_OVERHEAD_S
        rows.append(
            {
                "splits": S,
                "thread_blocks": blocks,
                "waves": waves,
                "sm_busy": blocks / (waves * gpu.sms),
                "block_bytes": block_bytes,
                "time_us": t * 1e6,
            }
        )
    return rows
