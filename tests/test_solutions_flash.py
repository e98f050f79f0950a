"""Parts 2 and 4 reference solutions: flash forward, flash backward and the autograd.Function.

Tolerances (FlashAttention's own test rule): in float32 the error
against the float64 reference may be at most 2x the plain float32 implementation's error +
1e-6 (3x for gradients). A correct tiled implementation measures 0.5-1.3x; real bugs 1e5x and
more. In float64 everything is compared at 1e-12 (observed errors are ~1e-15).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from course.reference import attention_plain, attention_reference, causal_mask
from solutions.flash_backward import FlashAttentionFunction, flash_attention, flash_backward
from solutions.flash_forward import flash_forward

TIGHT = 1e-12  # float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _qkv(nq, nk, d=16, dv=None, lead=(2, 3), seed=0, dtype=torch.float64, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    q = q_scale * torch.randn(*lead, nq, d, generator=g, dtype=dtype)
    k = torch.randn(*lead, nk, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, nk, dv, generator=g, dtype=dtype)
    do = torch.randn(*lead, nq, dv, generator=g, dtype=dtype)
    return q, k, v, do


def _grads_autograd(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(fn(q, k, v), (q, k, v), do)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over entries where b is finite; NaN/inf pattern must agree (checked separately)."""
    finite = torch.isfinite(b)
    return (a.double()[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


# Shapes that expose known bugs: N = 1; N not a multiple of the block (113, 203: ragged last
# block); N smaller than a block; Nq != Nk both ways (top-left vs bottom-right alignment).
SWEEP = [
    ((1, 1), (64, 64)),
    ((1, 203), (32, 64)),
    ((203, 1), (32, 64)),
    ((20, 20), (64, 64)),
    ((113, 113), (32, 32)),
    ((113, 203), (32, 48)),
    ((203, 113), (64, 32)),
]


# --------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("shape,blocks", SWEEP)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_float64_matches_reference(shape, blocks, causal):
    (nq, nk), (bq, bk) = shape, blocks
    q, k, v, _ = _qkv(nq, nk, dv=8)
    o, lse = flash_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape, "o (..., Nq, dv), lse (..., Nq)"
    assert o.dtype == q.dtype and lse.dtype == q.dtype, "outputs have q's dtype"
    assert not o.isnan().any() and not lse.isnan().any(), "no NaN in o or lse"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref)), "lse = -inf exactly on fully masked rows"
    assert _max_err(o, o_ref) < TIGHT, f"o differs from the reference by {_max_err(o, o_ref):.1e}"
    assert _max_err(lse, lse_ref) < TIGHT, f"lse (natural log, scaled scores) off by {_max_err(lse, lse_ref):.1e}"


@pytest.mark.parametrize("lead", [(), (5,), (2, 1, 3)])
def test_forward_any_leading_dims_and_explicit_scale(lead):
    q, k, v, _ = _qkv(37, 50, lead=lead)
    o, lse = flash_forward(q, k, v, causal=True, block_q=16, block_k=16, scale=0.7)
    o_ref, lse_ref = attention_reference(q, k, v, causal=True, scale=0.7)
    assert o.shape == (*lead, 37, 16) and lse.shape == (*lead, 37), "leading dims are kept"
    assert _max_err(o, o_ref) < TIGHT and _max_err(lse, lse_ref) < TIGHT, "scale=0.7 with leading dims"


@pytest.mark.parametrize("q_scale", [1.0, 40.0])  # x40: peaked scores, exp would overflow unshifted
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(113, 203), (203, 113)])
def test_forward_float32_tolerance_rule(nq, nk, causal, q_scale):
    q, k, v, _ = _qkv(nq, nk, dtype=torch.float32, q_scale=q_scale)
    o, lse = flash_forward(q, k, v, causal=causal, block_q=32, block_k=64)
    o_ref, lse_ref = attention_reference(q, k, v, causal=causal)
    o_plain, lse_plain = attention_plain(q, k, v, causal=causal)
    assert torch.isfinite(o).all(), "no overflow: o is finite"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref)) and not lse.isnan().any(), (
        "lse must be -inf exactly on the rows that may attend no key (and never NaN)"
    )
    for name, got, plain, ref in (("o", o, o_plain, o_ref), ("lse", lse, lse_plain, lse_ref)):
        err, err_plain = _max_err(got, ref), _max_err(plain, ref)
        assert err <= 2 * err_plain + 1e-6, f"{name}: error {err:.2e} > 2 x plain float32 error {err_plain:.2e} + 1e-6"


def test_fully_masked_rows_forward():
    q, k, v, _ = _qkv(70, 30, dtype=torch.float32)  # causal, Nq > Nk: rows 0..39 see no key
    o, lse = flash_forward(q, k, v, causal=True, block_q=16, block_k=16)
    assert not o.isnan().any() and not lse.isnan().any(), "fully masked rows must not produce NaN"
    assert (o[..., :40, :] == 0).all(), "a row that may attend no key has o = 0"
    assert torch.isneginf(lse[..., :40]).all() and torch.isfinite(lse[..., 40:]).all(), "its lse is -inf"


def _expected_tile_flops(nq, nk, d, bq, bk, causal, lead=1):
    """4 * rows * cols * d for every (Q block, K/V block) pair that has at least one allowed
    (query, key) pair under the reference mask: whole blocks above the diagonal are skipped."""
    allowed = causal_mask(nq, nk) if causal else torch.ones(nq, nk, dtype=torch.bool)
    total = 0
    for i0 in range(0, nq, bq):
        for j0 in range(0, nk, bk):
            tile = allowed[i0:i0 + bq, j0:j0 + bk]
            if tile.any():
                total += 4 * tile.shape[0] * tile.shape[1] * d
    return total * lead


def test_forward_flops_exact_non_causal_and_causal():
    # N = 256, d = 32, B_r = B_c = 32 (T = 8 blocks each way), two heads: 2 x 4N^2d = 16,777,216
    # matmul FLOPs non-causal; causal computes T(T+1)/2 = 36 of the 64 tiles of 4·B²·d: 9,437,184.
    q, k, v, _ = _qkv(256, 256, d=32, lead=(2,), dtype=torch.float32)
    for causal, expected in ((False, 16_777_216), (True, 9_437_184)):
        with FlopCounterMode(display=False) as fc:
            flash_forward(q, k, v, causal=causal, block_q=32, block_k=32)
        assert fc.get_total_flops() == expected, (
            f"causal={causal}: {fc.get_total_flops():,} matmul FLOPs, expected {expected:,} "
            "(causal: T(T+1)/2 block pairs, whole blocks above the diagonal skipped)"
        )
    assert (16_777_216, 9_437_184) == (2 * 4 * 256**2 * 32, 2 * (8 * 9 // 2) * 4 * 32**2 * 32), "the figures' formulas"


@pytest.mark.parametrize("nq,nk,bq,bk", [(113, 203, 32, 48), (203, 113, 64, 32), (100, 100, 24, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_flops_on_ragged_shapes(nq, nk, bq, bk, causal):
    q, k, v, do = _qkv(nq, nk, d=8, lead=(1,), dtype=torch.float32)
    with FlopCounterMode(display=False) as fc:
        o, lse = flash_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    fwd = fc.get_total_flops()
    assert fwd == _expected_tile_flops(nq, nk, 8, bq, bk, causal), "forward computes exactly the needed tiles"
    with FlopCounterMode(display=False) as fc:
        flash_backward(q, k, v, o, lse, do, causal=causal, block_q=bq, block_k=bk)
    assert fc.get_total_flops() * 2 == fwd * 5, (
        f"backward {fc.get_total_flops():,} FLOPs must be exactly 2.5x the forward's {fwd:,} "
        "(recompute QK^T, dV, dP, dQ, dK: 5 tile matmuls against 2)"
    )


class _LargestStorage(TorchDispatchMode):
    """Largest storage (bytes) of any tensor an op returns inside the mode."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def test_no_n_by_n_tensor_forward_or_backward():
    n, d = 256, 16
    q, k, v, do = _qkv(n, n, d=d, lead=(1,), dtype=torch.float32)
    with _LargestStorage() as fwd:
        o, lse = flash_forward(q, k, v, causal=True, block_q=32, block_k=32)
    with _LargestStorage() as bwd:
        flash_backward(q, k, v, o, lse, do, causal=True, block_q=32, block_k=32)
    n_by_n = n * n * 4
    # Largest legitimate tensors: the (1, N, d) outputs, 16 KiB; one S tile is 4 KiB; N x N is 256 KiB.
    assert fwd.largest < n_by_n and bwd.largest < n_by_n, (
        f"largest storage forward {fwd.largest:,} B, backward {bwd.largest:,} B: an N x N ({n_by_n:,} B) tensor appeared"
    )


@pytest.mark.parametrize(
    "args,match",
    [
        (((2, 4, 8), (2, 5, 6), (2, 5, 6)), "head dim"),
        (((2, 4, 8), (2, 5, 8), (2, 6, 8)), "number of keys"),
        (((2, 4, 8), (3, 5, 8), (3, 5, 8)), "leading dims"),
    ],
)
def test_forward_bad_shapes_give_one_line_errors(args, match):
    q, k, v = (torch.zeros(s) for s in args)
    with pytest.raises(ValueError, match=match) as info:
        flash_forward(q, k, v)
    assert "\n" not in str(info.value), "errors are one line"
    with pytest.raises(ValueError, match="block_q must be a positive int"):
        flash_forward(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), block_q=0)


# --------------------------------------------------------------------------------- backward
@pytest.mark.parametrize("shape,blocks", SWEEP)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_float64_matches_autograd(shape, blocks, causal):
    (nq, nk), (bq, bk) = shape, blocks
    q, k, v, do = _qkv(nq, nk, dv=8, lead=(2,))
    o, lse = flash_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    got = flash_backward(q, k, v, o, lse, do, causal=causal, block_q=bq, block_k=bk)
    ref = _grads_autograd(lambda q, k, v: attention_plain(q, k, v, causal=causal)[0], q, k, v, do)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{name} shape/dtype"
        assert not a.isnan().any(), f"{name} has NaN"
        assert _max_err(a, b) < TIGHT, f"{name} differs from autograd by {_max_err(a, b):.1e}"


@pytest.mark.parametrize("q_scale", [1.0, 40.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(113, 203), (203, 113)])
def test_backward_float32_tolerance_rule(nq, nk, causal, q_scale):
    q, k, v, do = _qkv(nq, nk, dtype=torch.float32, q_scale=q_scale, lead=(2,))
    got = _grads_autograd(lambda q, k, v: FlashAttentionFunction.apply(q, k, v, causal, 32, 48, None), q, k, v, do)
    plain = _grads_autograd(lambda q, k, v: attention_plain(q, k, v, causal=causal)[0], q, k, v, do)
    ref = _grads_autograd(lambda q, k, v: attention_reference(q, k, v, causal=causal)[0], q.double(), k.double(),
                          v.double(), do.double())
    for name, a, p, r in zip(("dq", "dk", "dv"), got, plain, ref):
        err, err_plain = _max_err(a, r), _max_err(p, r)
        assert err <= 3 * err_plain + 1e-6, f"{name}: error {err:.2e} > 3 x plain float32 error {err_plain:.2e} + 1e-6"


def test_fully_masked_rows_get_zero_gradients():
    q, k, v, do = _qkv(50, 20, dtype=torch.float32, lead=(2,))  # causal: rows 0..29 see no key
    dq, dk, dv = _grads_autograd(lambda q, k, v: FlashAttentionFunction.apply(q, k, v, True, 16, 16, None), q, k, v, do)
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert not g.isnan().any(), f"{name} has NaN: guard exp(S - lse) where lse = -inf"
    assert (dq[:, :30] == 0).all(), "fully masked query rows have zero gradient"


@pytest.mark.parametrize(
    "nq,nk,bq,bk,causal", [(5, 5, 2, 3, False), (5, 5, 2, 3, True), (4, 7, 3, 2, True), (7, 4, 2, 3, True)]
)
def test_function_gradcheck(nq, nk, bq, bk, causal):
    q, k, v, _ = _qkv(nq, nk, d=3, lead=(2,))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: FlashAttentionFunction.apply(q, k, v, causal, bq, bk, None),
                                    (q, k, v)), "gradcheck through FlashAttentionFunction"


def test_function_saves_only_q_k_v_o_lse():
    n = 96
    q, k, v, _ = _qkv(n, n, lead=(2,), dtype=torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t), t)[1], lambda t: t):
        o = FlashAttentionFunction.apply(q, k, v, True, 32, 32, None)
    shapes = sorted(tuple(t.shape) for t in saved)
    assert shapes == sorted([(2, n, 16)] * 4 + [(2, n)]), f"saved {shapes}: only q, k, v, o (..., N, d), lse (..., N)"
    assert all(t.numel() < n * n for t in saved), "no N x N tensor is saved (P is recomputed)"
    ptrs = {t.untyped_storage().data_ptr() for t in saved}
    assert {t.untyped_storage().data_ptr() for t in (q, k, v, o)} <= ptrs, "the saved tensors are q, k, v and o"


def test_flash_attention_wrapper():
    q, k, v, do = _qkv(70, 70, lead=(2, 2))
    got = _grads_autograd(lambda q, k, v: flash_attention(q, k, v, causal=True), q, k, v, do)
    ref = _grads_autograd(lambda q, k, v: attention_plain(q, k, v, causal=True)[0], q, k, v, do)
    assert all(_max_err(a, b) < TIGHT for a, b in zip(got, ref)), "flash_attention gradients = autograd's"
    o = flash_attention(q, k, v)
    assert _max_err(o, attention_reference(q, k, v)[0]) < TIGHT, "flash_attention(causal=False) output"


def test_backward_checks_o_and_lse_shapes():
    q, k, v, do = _qkv(8, 8, lead=())
    o, lse = flash_forward(q, k, v)
    with pytest.raises(ValueError, match="lse"):
        flash_backward(q, k, v, o, lse[:-1], do)
