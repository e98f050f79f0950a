"""course.cost_model reproduces every figure the notes estimate, to the precision they print it.

Each test names the section; the figure the notes print is the literal on the right-hand side.
"""

from __future__ import annotations

import math

import pytest

from course import cost_model as cm


def _by(rows, key, value):
    (row,) = [r for r in rows if r[key] == value]
    return row


# ------------------------------------------------------------------------------------ specs
def test_gpu_specs_and_ridges():
    assert round(cm.H100.ridge) == 295, "§3.2/§8.3: H100 FP16 ridge 295 FLOP/byte"
    assert round(cm.V100.ridge) == 139, "§7.6/exercise 6: V100 crossover at d > 139"
    assert cm.A100.sms == 108 and cm.H100.sms == 132, "§8.4: A100 has 108 SMs, H100 132"
    assert cm.A100.peak_fp16_flops / cm.A100.fp32_flops == 16, "§6.3: on A100 one non-matmul FLOP = 16 matmul FLOPs"
    smem_total = cm.H100.sms * cm.H100.smem_per_sm
    assert abs(smem_total / 1e6 - 30) < 1, "§3.3: all shared memory together is about 30 MB (132 x 228 KB)"
    ridges = [g.ridge for g in cm.GENERATIONS]
    assert len(ridges) == 4 and ridges[0] < ridges[1] < ridges[2], "§7.6: the ridge rises V100 -> A100 -> H100"


def test_roofline_time_takes_the_max_plus_launches():
    t = cm.roofline_time(989e12, 1.0, cm.H100, launches=2)  # 1 s of compute, ~0 s of memory
    assert math.isclose(t, 1.0 + 2 * cm.LAUNCH_OVERHEAD_S), "time = max(compute, memory) + launches x overhead"
    t = cm.roofline_time(0.0, 3.35e12, cm.H100, launches=0)
    assert math.isclose(t, 1.0), "memory-bound kernel: bytes / bandwidth"


# ------------------------------------------------------------------------------------ formulas
def test_traffic_formulas():
    N, d = 4096, 128
    assert cm.io_standard(N, d) == 4 * N * d + 4 * N * N, "§3.2: 4Nd + 4N^2"
    assert cm.io_flash(N, d, 128) == 34_607_104, "exercise 4: 1,048,576 + 33,554,432 + 4,096"
    assert cm.io_flash_ideal(N, d) == 4 * N * d + N, "§5.5: 4Nd + N"
    assert cm.io_flash(100, 8, 64) == 2 * 100 * 8 + 2 * 100 * 8 * 2 + 100, "ragged: ceil(N/B_r) = 2 Q blocks re-read K/V"
    assert cm.attention_flops(N, d) == 4 * N * N * d and cm.attention_flops(N, d, causal=True) == 2 * N * N * d
    assert cm.backward_flops_flash(N, d) == 2.5 * cm.attention_flops(N, d), "§7.5: backward = 2.5x forward"


# ------------------------------------------------------------------------------------ §3
def test_s3_1_layer_flops():
    row = _by(cm.layer_flops_table(), "N", 131072)
    assert round(100 * row["attention_share"]) == 73, "§3.1: attention is 73% of a 7B layer's FLOPs at 128K"
    short = _by(cm.layer_flops_table(), "N", 1024)
    assert short["attention_share"] < 0.03, "§3.1: at short N attention FLOPs are negligible"
    (ex1,) = cm.layer_flops_table(seq_lens=(8192,), d_model=5120, n_heads=40, d_ffn=13824)
    assert ex1["s_gib"] == 5.0, "exercise 1: a 13B layer's S at 8192 is 5 GiB"


def test_s3_2_traffic_vs_matmul_at_32k():
    row = _by(cm.attention_traffic_vs_matmul(), "N", 32768)
    assert row["s_gib"] == 64, "§3.2: S of one layer, all heads, fp16, at 32K = 64 GiB"
    assert round(100 * row["s_fraction_of_hbm"]) == 86, "§3.2: 86% of an 80 GB H100"
    assert round(row["traffic_ms"]) == 82, "§3.2: ~82 ms of HBM traffic"
    assert round(row["matmul_ms"]) == 18, "§3.2: ~18 ms of matmul (masked half included)"
    intensity = 2 * 4096**2 * 128 / (2 * 4096 * 128 + 4096**2)  # kernel 1, FLOP per element
    assert 240 < intensity < 256 and intensity / 2 < cm.H100.ridge, "§3.2: ~2d FLOP/element, ~128 FLOP/B < 295"


# ------------------------------------------------------------------------------------ §5.5, §6
def test_s5_5_h100_forward_estimate():
    rows = cm.h100_forward_estimate()
    std = _by(rows, "name", "standard total (3 kernels)")
    ideal = [r for r in rows if r["name"].startswith("flash, K/V from L2")][0]
    no_l2 = [r for r in rows if r["name"].startswith("flash, K/V from HBM")][0]
    assert round(std["time_us"]) == 1334, "§5.5: standard ~1,334 µs including 3 launch overheads"
    assert std["launches"] == 3 and all(r["bound"] == "memory" for r in rows[:3]), "3 memory-bound kernels"
    assert round(ideal["time_us"]) == 282, "§5.5: flash ~282 µs"
    assert round(ideal["speedup"], 1) == 4.7, "§5.5: 4.7x"
    assert round(no_l2["speedup"], 1) == 2.0, "§5.5: 2.0x even with K/V re-read from HBM"


def test_s6_1_block_sizes():
    rows = {r["block"]: r for r in cm.block_size_table()}
    assert rows[64]["smem_kib"] == 80 and rows[128]["smem_kib"] == 160, "Q + double-buffered K, V at d=128 fp16"
    assert rows[128]["fits"] and not rows[256]["fits"], "§6.1: 128 fits H100's 228 KiB, 256 does not"
    assert rows[128]["kv_traffic_elements"] == 2 * 4096 * 128 * 32, "K/V traffic 2Nd * N/B_r"


def test_s6_3_fa1_vs_fa2():
    fa1, fa2, l2 = cm.fa1_vs_fa2()
    assert round(fa1["elements"] / 1e6, 1) == 51.9, "§6.3: FA1 ~51.9 M elements"
    assert round(fa2["elements"] / 1e6, 1) == 34.6, "§6.3: FA2 ~34.6 M elements"
    assert round(l2["elements"] / 1e6, 1) == 2.1, "§6.3: ~2.1 M with K/V in L2"
    assert (fa1["thread_blocks"], fa2["thread_blocks"]) == (32, 1024), "§6.3: 32 vs 1,024 thread blocks"


# ------------------------------------------------------------------------------------ §7
def test_s7_1_s7_2_storage():
    row = _by(cm.p_storage_table(), "N", 65536)
    assert row["p_gib"] == 256, "§7.1: storing P at 64K, 32 heads, fp16: 256 GiB"
    assert row["l_mib"] == 8, "§7.2: L is 8 MiB"
    assert row["ratio"] == 32768, "§7.2: 32,768x smaller"


def test_s7_5_backward_estimate():
    std, fl, ratio = cm.backward_estimate()
    assert ratio["flops_ratio"] == 1.25, "§7.5: 25% more FLOPs"
    assert round(1 / ratio["bytes_ratio"]) == 29, "§7.5: traffic down to 1/29"
    assert round(ratio["speedup"], 1) == 3.3, "§7.5: 3.3x faster (lower-bound estimate)"
    assert (std["bound"], fl["bound"]) == ("memory", "compute"), "§7.5: P stored is memory bound, recompute is not"
    assert cm.io_backward_standard(4096, 128) - 7 * 4096**2 < 0.05 * 7 * 4096**2, "exercise 6: standard ≈ 7N^2"


def test_s7_6_recompute_ratio():
    rows = cm.recompute_ratio_table()
    assert all(r["ratio_d128"] < 1 for r in rows), "§7.6: at d = 128 recomputing is cheaper on all four generations"
    v100 = rows[0]
    assert "V100" in v100["gpu"] and round(v100["crossover_d"]) == 139, "exercise 6: V100 crossover d > 139"
    assert v100["ratio_d256"] > 1, "beyond the crossover reading P back would be cheaper"
    for r in rows:
        assert math.isclose(r["ratio_d64"] * 2, r["ratio_d128"]), "the ratio is d / ridge: linear in d, no N"


# ------------------------------------------------------------------------------------ §8
def test_s8_2_kv_cache():
    assert cm.kv_cache_bytes() == 0.5 * cm.MiB, "§8.2: 0.5 MiB per token for a 7B model"
    assert cm.kv_cache_bytes(tokens=2048, batch=128) == 128 * cm.GiB, "§8.2: 128 GiB at batch 128 x 2048"
    assert cm.kv_cache_bytes(tokens=2048, batch=128) > cm.H100.hbm_bytes, "more than an H100's memory"


def test_s8_3_prefill_decode():
    rows = cm.prefill_decode_table()
    prefill = rows[0]
    d1 = _by([r for r in rows if r["phase"] == "decode"], "batch", 1)
    d128 = _by([r for r in rows if r["phase"] == "decode"], "batch", 128)
    assert prefill["linear_bound"] == "compute" and prefill["linear_intensity"] == 2048, "weights reused 2048x"
    assert round(100 * d1["attention_share"]) == 8, "§8.3: attention is 8% of a decode layer at batch 1"
    assert round(100 * d128["attention_share"]) == 91, "§8.3: and 91% at batch 128"
    assert d1["linear_bound"] == d128["linear_bound"] == "memory", "decode is memory bound"
    assert round(d1["attention_intensity"]) == 1 and round(d128["attention_intensity"]) == 1, "attention AI ~1"
    assert d128["linear_intensity"] == 128, "linear AI ~ batch"
    assert 250 < d1["us_per_token"] / prefill["us_per_token"] < 350, "§8.3: a decode token costs ~300x a prefill token"


def test_s8_4_flash_decoding():
    rows = {r["splits"]: r for r in cm.flash_decoding_estimate()}
    assert round(rows[4]["time_us"]) == 169, "§8.4: S = 4: ~169 µs"
    assert round(rows[5]["time_us"]) == 268 and rows[5]["waves"] == 2, "§8.4: S = 5: 160 blocks, two waves, ~268 µs"
    assert round(100 * rows[1]["sm_busy"]) == 24, "§8.4: without splitting only 24% of the SMs work"
    ex8 = {r["splits"]: r["time_us"] for r in cm.flash_decoding_estimate(context=65536, splits=(1, 2, 3, 4), batch=2)}
    assert min(ex8, key=ex8.get) == 2 and ex8[3] > ex8[2], "exercise 8: S = 2 is best, S = 3 is slower"


@pytest.mark.parametrize("fn", [cm.layer_flops_table, cm.attention_traffic_vs_matmul, cm.h100_forward_estimate,
                                cm.block_size_table, cm.fa1_vs_fa2, cm.backward_estimate, cm.p_storage_table,
                                cm.recompute_ratio_table, cm.prefill_decode_table, cm.flash_decoding_estimate])
def test_tables_are_lists_of_plain_dict_rows(fn):
    rows = fn()
    assert isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows)
    for r in rows:
        assert all(isinstance(v, (int, float, str, bool)) for v in r.values()), f"{fn.__name__}: plain values only"
