"""The FA2 forward kernel (solutions/flash_kernel.py, part 3) and FA1 on the simulator: the lecture's
figures, the closed forms byte for byte over a sweep of shapes, causal skipping, races.

Exact DRAM bytes (one head; d and B_r multiples of 8, so every tile starts on a 32-byte sector):
    no cache : 4·(2·Nq·d + 2·d·Σ_i keys_i) + 32·⌈Nq/8⌉     (non-causal keys_i = Nk: 2Nd + 2Nd·⌈N/B_r⌉ + N)
    ideal    : 4·(2·Nq·d + 2·d·max_i keys_i) + 32·⌈Nq/8⌉   (non-causal: 4Nd + N)
keys_i = the keys of the K/V blocks that Q block i reads; here derived from the causal mask (the
blocks holding at least one allowed pair), independently of the kernel's loop bound."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import solutions.flash_kernel as fk
from course import cost_model as cm
from course import gpusim as gs
from course.reference import attention_plain, attention_reference, causal_mask


def qkv(nq, nk, d, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*lead, n, d, generator=g, dtype=torch.float64).float() for n in (nq, nk, nk)]


def keys_per_q_block(nq, nk, br, bc, causal):
    if not causal:
        return [nk] * math.ceil(nq / br)
    allowed = causal_mask(nq, nk)
    return [sum(min(bc, nk - c0) for c0 in range(0, nk, bc) if bool(allowed[r0:r0 + br, c0:c0 + bc].any()))
            for r0 in range(0, nq, br)]


def closed_form(nq, nk, d, br, bc, causal):
    keys = keys_per_q_block(nq, nk, br, bc, causal)
    lse = 32 * math.ceil(nq / 8)
    return 4 * (2 * nq * d + 2 * d * sum(keys)) + lse, 4 * (2 * nq * d + 2 * d * max(keys)) + lse


def launch_flash(q, k, v, br, bc, causal=False, **gpu_kw):
    """The part-3 kernel on a GPU with options (run_flash_kernel always uses the defaults)."""
    (nq, d), nk = q.shape, k.shape[0]
    gpu = gs.GPU(**gpu_kw)
    bufs = [gpu.array(n, x) for n, x in (("Q", q), ("K", k), ("V", v))]
    O, L = gpu.zeros("O", (nq, d)), gpu.zeros("L", nq)
    return gpu.launch(fk.flash_forward_kernel, math.ceil(nq / br), br, *bufs, O, L, nq, nk, d, d**-0.5, causal, bc)


# ------------------------------------------------------------------------------------------------
# The lecture's figures (§5.3, §6.2)


def test_lecture_shape_counts():
    q, k, v = qkv(256, 256, 64)
    o, lse, st = fk.run_flash_kernel(q, k, v)
    assert st["shared_wavefronts"] == 71_680, (  # 4,096 + 65,536 + 1,024 + 1,024 (course rule)
        f"§5.3: the flash kernel takes 71,680 shared wavefronts, got {st['shared_wavefronts']:,}"
    )
    assert st["shared_bank_conflicts"] == 0, "padded Q/O tile, contiguous float4 K/V stores, broadcast reads"
    assert st["dram_bytes_no_cache"] == 4 * cm.io_flash(256, 64, 64) == 656_384, "no cache: 2Nd + 2Nd·N/B_r + N"
    assert st["dram_bytes_ideal_cache"] == 4 * cm.io_flash_ideal(256, 64) == 263_168, "ideal cache: 4Nd + N"
    assert sorted(st["buffers"]) == ["K", "L", "O", "Q", "V"], "S and P never appear in global memory"
    assert st["races"] == 0, st["race_reports"]
    assert (st["launches"], st["thread_blocks"]) == (1, 4), "one launch, one thread block per Q block"
    strict = launch_flash(q[0:256], k, v, 64, 64, shared_rule="quarter-warp")
    assert strict["shared_wavefronts"] == 268_288, "quarter-warp rule: a broadcast float4 costs 4 wavefronts"


def test_lecture_causal_skipping():
    q, k, v = qkv(256, 256, 64, seed=1)
    _, _, full = fk.run_flash_kernel(q, k, v)
    _, _, causal = fk.run_flash_kernel(q, k, v, causal=True)
    kv = lambda s: s["buffers"]["K"]["dram_bytes_no_cache"] + s["buffers"]["V"]["dram_bytes_no_cache"]  # noqa: E731
    assert (kv(full), kv(causal)) == (524_288, 327_680), "§6.2: K/V bytes, 16 -> 10 block pairs at T = 4"


@pytest.mark.parametrize("T, B", [(1, 32), (2, 16), (3, 32), (5, 16), (8, 8)])
def test_causal_reads_t_t_plus_1_over_2_block_pairs(T, B):
    d = 16
    q, k, v = qkv(T * B, T * B, d, seed=T)
    _, _, st = fk.run_flash_kernel(q, k, v, causal=True, block_rows=B, block_cols=B)
    kv = st["buffers"]["K"]["dram_bytes_no_cache"] + st["buffers"]["V"]["dram_bytes_no_cache"]
    assert kv == T * (T + 1) // 2 * 2 * B * d * 4, f"causal: K/V of T(T+1)/2 = {T * (T + 1) // 2} block pairs"


# ------------------------------------------------------------------------------------------------
# Closed forms over a sweep, ragged N and Nq != Nk included


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    nq=st.sampled_from([1, 40, 64, 100, 113, 136]),
    nk=st.sampled_from([1, 64, 100, 113]),
    d=st.sampled_from([8, 16, 32]),
    br=st.sampled_from([16, 32, 48, 64]),
    bc=st.sampled_from([8, 24, 32, 64]),
    causal=st.booleans(),
)
def test_dram_bytes_equal_the_closed_form(nq, nk, d, br, bc, causal):
    q, k, v = qkv(nq, nk, d, seed=nq + nk)
    o, lse, st = fk.run_flash_kernel(q, k, v, causal=causal, block_rows=br, block_cols=bc)
    got = (st["dram_bytes_no_cache"], st["dram_bytes_ideal_cache"])
    assert got == closed_form(nq, nk, d, br, bc, causal), f"DRAM bytes (no cache, ideal) {got} != the closed form"
    if nq == nk and nq % 8 == 0 and not causal:
        assert st["dram_bytes_no_cache"] == 4 * cm.io_flash(nq, d, br), "cost_model.io_flash"
        assert st["dram_bytes_ideal_cache"] == 4 * cm.io_flash_ideal(nq, d), "cost_model.io_flash_ideal"
    assert st["races"] == 0, st["race_reports"]
    ref_o, ref_lse = attention_reference(q, k, v, causal=causal)
    plain_o, plain_lse = attention_plain(q, k, v, causal=causal)
    for got, ref, plain in ((o, ref_o, plain_o), (lse, ref_lse, plain_lse)):
        fin = torch.isfinite(ref)  # lse = -inf for rows that see no key (causal, Nq > Nk)
        assert torch.equal(torch.isfinite(got), fin) and not torch.isnan(got).any(), "-inf exactly on fully masked rows"
        assert maxabs(got, ref, fin) <= 2 * maxabs(plain, ref, fin) + 1e-6, "error > 2 x plain float32 + 1e-6"


def maxabs(a, ref, where) -> float:
    diff = (a.double() - ref)[where].abs()
    return float(diff.max()) if diff.numel() else 0.0


def test_several_heads_and_float32_rounding():
    q, k, v = qkv(96, 80, 24, seed=5, lead=(2, 3))
    o, lse, st = fk.run_flash_kernel(q, k, v, causal=True, block_rows=32, block_cols=16)
    ref, _ = attention_reference(q, k, v, causal=True)
    plain, _ = attention_plain(q, k, v, causal=True)
    err, err_plain = float((o.double() - ref).abs().max()), float((plain.double() - ref).abs().max())
    assert err <= 2 * err_plain + 1e-6 and err < 2e-6  # float32 rounding (~4e-7 at N = 256, §5.3)
    assert st["thread_blocks"] == 3 * 6


def test_input_errors_are_one_line():
    q, k, v = qkv(8, 8, 8)
    for bad, match in (((q.double(), k, v), "float32"), ((q[:, :6], k[:, :6], v[:, :6]), "multiple of 4")):
        with pytest.raises(ValueError, match=match):
            fk.run_flash_kernel(*bad)


# ------------------------------------------------------------------------------------------------
# Races: remove any one barrier and the detector reports it


def _without_barrier(i: int):
    """flash_forward_kernel with its i-th t.syncthreads() replaced by pass, compiled at the
    kernel's own line numbers so that race reports name the real lines."""
    lines, first = inspect.getsourcelines(fk.flash_forward_kernel)
    src = "".join(lines)
    at = [m.start() for m in re.finditer(r"t\.syncthreads\(\)", src)][i]
    ns = dict(vars(fk))
    exec(compile("\n" * (first - 1) + src[:at] + "pass" + src[at + len("t.syncthreads()"):], fk.__file__, "exec"), ns)
    return ns["flash_forward_kernel"]


@pytest.mark.parametrize("i", range(4))
def test_each_barrier_removed_is_reported_as_a_race(i):
    assert inspect.getsource(fk.flash_forward_kernel).count("t.syncthreads()") == 4
    q, k, v = qkv(100, 100, 16, seed=6)
    gpu = gs.GPU()
    bufs = [gpu.array(n, x) for n, x in (("Q", q), ("K", k), ("V", v))]
    O, L = gpu.zeros("O", (100, 16)), gpu.zeros("L", 100)
    st = gpu.launch(_without_barrier(i), 2, 64, *bufs, O, L, 100, 100, 16, 0.25, False, 32)
    assert st["races"] > 0, f"syncthreads() number {i} removed, yet no race reported"
    # lockstep execution hides the bug in the values: only the detector shows it
    ref, _ = attention_reference(q, k, v)
    assert float((torch.from_numpy(O.numpy()).double() - ref).abs().max()) < 1e-5


# ------------------------------------------------------------------------------------------------
# FA1 (§6.3): K/V outer, O, m, ℓ through HBM


@pytest.mark.parametrize("n, d, b", [(256, 64, 64), (100, 16, 32)])
def test_fa1_traffic_and_values(n, d, b):
    q, k, v = qkv(n, n, d, seed=7)
    o, lse, st = fk.run_fa1_kernel(q, k, v, block_rows=b, block_cols=b)
    want = 4 * cm.io_fa1(n, d, b, b) if n % 8 == 0 else None
    if want is not None:
        assert st["dram_bytes_no_cache"] == want, "FA1: 2Nd + ⌈N/B_c⌉(3Nd + 4N) elements (§6.3)"
    assert st["thread_blocks"] == 1, "FA1 parallelises over heads only"
    assert st["races"] == 0, st["race_reports"]
    ref_o, ref_lse = attention_reference(q, k, v)
    assert float((o.double() - ref_o).abs().max()) < 2e-6
    np.testing.assert_allclose(lse.numpy(), ref_lse.numpy(), atol=2e-6)
