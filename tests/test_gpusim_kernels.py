"""The lecture's non-assignment kernels on the simulator: standard attention (§5.2), the backward
of §7.4 and Flash-Decoding (§8.4): outputs against float64 references, and their counts.

Tolerances: float32 kernels against float64 math. Following the course's rule, the kernel's error
may be at most 2x (forward) or 3x (gradients) the error of a plain float32 implementation of the
same math, + 1e-6; correct tiled code measures 0.5-1.5x, a wrong kernel is off by >= 1e-2."""

from __future__ import annotations

import math

import pytest
import torch

from course import cost_model as cm
from course.gpusim.kernels import flash_backward, flash_decode, standard_attention
from course.reference import attention_plain, attention_reference


def qkv(nq, nk, d, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*lead, n, d, generator=g, dtype=torch.float64).float() for n in (nq, nk, nk)]


def err(a, ref) -> float:
    a = torch.as_tensor(a).double()
    return float((a - ref).abs().max())


def sectors_bytes(elements: int) -> int:
    """DRAM bytes of touching `elements` contiguous floats once: whole 32-byte sectors."""
    return 32 * math.ceil(elements / 8)


# ------------------------------------------------------------------------------------------------
# Standard attention: three kernels


def test_standard_attention_lecture_figures():
    """§5.3 at N = 256, d = 64: 616,448 shared wavefronts (294,912 + 26,624 + 294,912) and
    4Nd + 4N² elements of DRAM traffic with an ideal cache."""
    N, d = 256, 64
    q, k, v = qkv(N, N, d)
    o, st = standard_attention(q, k, v)
    per_kernel = [p["shared_wavefronts"] for p in st["per_launch"]]
    assert st["shared_wavefronts"] == 616_448, f"§5.3: 616,448 shared wavefronts, got {st['shared_wavefronts']:,}"
    assert per_kernel == [294_912, 26_624, 294_912], f"QKᵀ, softmax, PV: 294,912 + 26,624 + 294,912, got {per_kernel}"
    assert st["dram_bytes_ideal_cache"] == 4 * cm.io_standard(N, d) == 1_310_720, "ideal cache: 4Nd + 4N² elements"
    assert set(st["buffers"]) == {"Q", "K", "V", "S", "P", "O"}, "S and P are global buffers in standard attention"
    assert st["races"] == 0, st["race_reports"]
    ref, _ = attention_reference(q, k, v)
    plain, _ = attention_plain(q, k, v)
    assert err(o, ref) <= 2 * err(plain, ref) + 1e-6


@pytest.mark.parametrize("nq, nk, d, causal", [(64, 64, 16, False), (100, 113, 8, True), (113, 100, 24, True), (40, 40, 32, False)])
def test_standard_attention_ideal_cache_closed_form(nq, nk, d, causal):
    """Q, K, V read once, S written and read, P written and read, O written: 4Nd + 4N² when
    N is a multiple of 8; in general every touched buffer costs whole sectors."""
    q, k, v = qkv(nq, nk, d, seed=1)
    o, st = standard_attention(q, k, v, causal=causal)
    want = sectors_bytes(nq * d) * 2 + sectors_bytes(nk * d) * 2 + 4 * sectors_bytes(nq * nk)
    assert st["dram_bytes_ideal_cache"] == want, "Q, K, V, O once each; S and P written once and read once each"
    if nq == nk and nq % 8 == 0:
        assert want == 4 * cm.io_standard(nq, d)
    ref, _ = attention_reference(q, k, v, causal=causal)
    plain, _ = attention_plain(q, k, v, causal=causal)
    assert err(o, ref) <= 2 * err(plain, ref) + 1e-6


# ------------------------------------------------------------------------------------------------
# Backward (§7.4): K/V blocks outer, dQ through atomic adds


def _grads(nq, nk, d, causal, seed):
    q, k, v = (x.double().requires_grad_() for x in qkv(nq, nk, d, seed))
    o, lse = attention_reference(q, k, v, causal=causal)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64)
    ref = torch.autograd.grad(o, (q, k, v), do)
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    o32, _ = attention_plain(q32, k32, v32, causal=causal)
    plain = torch.autograd.grad(o32, (q32, k32, v32), do.float())
    return (q, k, v, o, lse, do), ref, plain


@pytest.mark.parametrize(
    "nq, nk, d, br, bc, causal",
    [(300, 300, 32, 64, 48, False), (113, 203, 16, 32, 48, True), (203, 113, 16, 64, 32, True)],
)
def test_backward_gradients_and_atomic_adds(nq, nk, d, br, bc, causal):
    inputs, ref, plain = _grads(nq, nk, d, causal, seed=2)
    q, k, v, o, lse, do = (x.detach().float() for x in inputs)
    dq, dk, dv, st = flash_backward(q, k, v, o, lse, do, causal=causal, block_rows=br, block_cols=bc)
    for name, got, r, p in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, plain):
        assert err(got, r) <= 3 * err(p, r) + 1e-6, f"{name}: error {err(got, r):.1e} > 3 x plain {err(p, r):.1e}"
    assert st["races"] == 0, st["race_reports"]
    if not causal:  # every K/V block adds each dQ element once: ⌈N/B_c⌉·N·d
        assert st["atomic_element_ops"] == math.ceil(nk / bc) * nq * d, "dQ atomic adds = ⌈N/B_c⌉·N·d (§7.4)"
        if (nq, d, bc) == (300, 32, 48):
            assert st["atomic_element_ops"] == 67_200, "§7.4: 67,200 dQ atomic adds at N = 300, d = 32, B_c = 48"
    else:  # only the Q blocks that see some key of the K/V block
        allowed = torch.arange(nk)[None] <= torch.arange(nq)[:, None] + (nk - nq)
        want = 0
        for c0 in range(0, nk, bc):
            for r0 in range(0, nq, br):
                if bool(allowed[r0:r0 + br, c0:c0 + bc].any()):
                    want += min(br, nq - r0) * d
        assert st["atomic_element_ops"] == want, "causal: Q blocks above the diagonal add nothing to dQ"


# ------------------------------------------------------------------------------------------------
# Flash-Decoding (§8.4)


@pytest.mark.parametrize("splits, nk", [(1, 100), (2, 100), (3, 100), (7, 100), (13, 10)])  # 13 > 10: empty segments
def test_flash_decode_matches_reference(splits, nk):
    H, d = 3, 32
    q, k, v = qkv(1, nk, d, seed=3, lead=(H,))
    q = q * 20  # peaked attention: averaging the segments instead of ⊕ would be far off
    o, lse, st = flash_decode(q[:, 0], k, v, splits)
    ref_o, ref_lse = attention_reference(q, k, v)
    plain_o, plain_lse = attention_plain(q, k, v)
    assert err(o, ref_o[:, 0]) <= 2 * err(plain_o[:, 0], ref_o[:, 0]) + 1e-6, f"o, {splits} splits of {nk} keys"
    assert err(lse, ref_lse[:, 0]) <= 2 * err(plain_lse[:, 0], ref_lse[:, 0]) + 1e-6, f"lse, {splits} splits"
    assert st["launches"] == 2, "split kernel + combine kernel"
    assert st["per_launch"][0]["thread_blocks"] == splits * H, "one thread block per (segment, head) (§8.4)"
    assert st["races"] == 0, st["race_reports"]
