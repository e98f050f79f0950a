"""Lecture 5, program 04: the backward pass with recomputation (§7).

Demo 1 (§7.3, §7.4)  flash backward against autograd in float64 (N = 300, d = 32, blocks 64 x 48,
                     non-causal and causal); the D_i = dO_i · O_i identity; dQ atomic adds counted
Demo 2 (§7.1, §7.2)  storing P against storing L
Demo 3 (§7.5)        the H100 estimate: 25% more FLOPs, 1/29 of the traffic
Demo 4 (§7.6)        recompute / read-back = d / ridge for four GPU generations
Demo 5 (§7.7)        30 training steps of the tiny transformer, flash against standard attention

Run from the repository root: python code/lecture05/04_backward.py
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
from torch.overrides import TorchFunctionMode  # noqa: E402

from course import cost_model  # noqa: E402
from course.reference import attention_plain  # noqa: E402
import attention_kernels as ak  # noqa: E402  (your implementation: --impl DIR)

SEED = 0
N, D_HEAD, BLOCK_Q, BLOCK_K = 300, 32, 64, 48
console = Console(width=120)


# ---------------------------------------------------------------------------------------- demo 1
def _inputs(n: int = N, d: int = D_HEAD, seed: int = SEED, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(n, d, generator=g, dtype=dtype) for _ in range(4))
    return q, k, v, do


def gradients_vs_autograd(n: int = N, d: int = D_HEAD, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> list[dict]:
    """§7.4: max |flash - autograd| of dQ, dK, dV in float64, non-causal and causal."""
    rows = []
    for causal in (False, True):
        q, k, v, do = _inputs(n, d)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o_ref, _ = attention_plain(q, k, v, causal)  # float64: this is autograd on the reference
        ref = torch.autograd.grad(o_ref, (q, k, v), do)
        with torch.no_grad():
            o, lse = ak.flash_forward(q, k, v, causal, block_q, block_k)
            got = ak.flash_backward(q, k, v, o, lse, do, causal, block_q, block_k)
        rows.append({"causal": causal, **{f"max_diff_{name}": (a - b).abs().max().item()
                                          for name, a, b in zip(("dq", "dk", "dv"), got, ref)}})
    return rows


def d_identity(n: int = N, d: int = D_HEAD) -> dict:
    """§7.3: D_i = Σ_k P_ik dP_ik (needs the whole row of P) equals dO_i · O_i (needs one row)."""
    q, k, v, do = _inputs(n, d)
    p = torch.softmax(q @ k.T / math.sqrt(d), dim=-1)
    o, dp = p @ v, do @ v.T
    from_row = (p * dp).sum(-1)
    from_o = (do * o).sum(-1)
    return {"max_diff": (from_row - from_o).abs().max().item(), "max_abs": from_o.abs().max().item()}


class _AddCounter(TorchFunctionMode):
    """Records every in-place add (`t += x`, `t.add_(x)`) as (address of t's storage, elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: list[tuple[int, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("add_", "__iadd__") and isinstance(args[0], torch.Tensor):
            self.adds.append((args[0].untyped_storage().data_ptr(), args[0].numel()))
        return func(*args, **(kwargs or {}))


def count_dq_adds(n: int = N, d: int = D_HEAD, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                  causal: bool = False) -> dict:
    """§7.4: elements added into dQ by the backward, counted by tracing its in-place adds whose
    target lives in the storage of the dQ it returns. On a GPU each one is an atomic add to HBM,
    because the K/V blocks that contribute to one dQ_i belong to different thread blocks."""
    q, k, v, do = _inputs(n, d, dtype=torch.float32)
    o, lse = ak.flash_forward(q, k, v, causal, block_q, block_k)
    with _AddCounter() as counter:
        dq, _, _ = ak.flash_backward(q, k, v, o, lse, do, causal, block_q, block_k)
    ptr = dq.untyped_storage().data_ptr()
    counted = sum(numel for p, numel in counter.adds if p == ptr)
    return {"counted": counted, "formula": math.ceil(n / block_k) * n * d, "kv_blocks": math.ceil(n / block_k)}


# ---------------------------------------------------------------------------------------- demo 5
def train_flash_vs_standard(steps: int = 30, seed: int = 0) -> dict:
    """§7.7: train the tiny transformer `steps` steps from the same init with the standard
    attention and with FlashAttentionFunction; max loss and parameter differences."""
    from course.tiny_transformer import make_model, standard_attention, train

    def flash(q, k, v, causal=True):
        return ak.flash_attention(q, k, v, causal)

    models, losses = {}, {}
    for name, attn in (("standard", standard_attention), ("flash", flash)):
        models[name] = make_model(seed)
        losses[name] = train(models[name], steps, attention=attn, seed=seed)
    params = dict(models["standard"].named_parameters())
    return {
        "steps": steps,
        "first_loss": losses["standard"][0],
        "last_loss": losses["standard"][-1],
        "max_loss_diff": max(abs(a - b) for a, b in zip(losses["standard"], losses["flash"])),
        "max_param_diff": max((params[n] - p).abs().max().item() for n, p in models["flash"].named_parameters()),
    }


def saved_by_function(n: int = 256, d: int = 32) -> list[tuple[int, ...]]:
    """Shapes of the tensors FlashAttentionFunction saves for backward (q, k, v, o, lse)."""
    q, k, v, _ = _inputs(n, d, dtype=torch.float32)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (shapes.append(tuple(t.shape)), t)[1], lambda t: t):
        ak.FlashAttentionFunction.apply(q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), True, 64, 64, None)
    return shapes


# ---------------------------------------------------------------------------------------- main
def _gib(x: float) -> str:
    return f"{x:,.3g} GiB" if x >= 1 else f"{x * 1024:,.3g} MiB"


def main(argv: list[str] | None = None) -> None:
    ak.setup(__doc__, argv)
    torch.set_num_threads(1)  # small tensors: one thread avoids OpenMP waits on a busy 2-core machine
    console.rule(f"Demo 1 (§7.3, §7.4): flash backward vs autograd, float64, N = {N}, d = {D_HEAD}, "
                 f"B_r x B_c = {BLOCK_Q} x {BLOCK_K}")
    with ak.part_demo():
        t = Table("mask", "max |dQ diff|", "max |dK diff|", "max |dV diff|")
        for r in gradients_vs_autograd():
            t.add_row("causal" if r["causal"] else "none", f"{r['max_diff_dq']:.1e}", f"{r['max_diff_dk']:.1e}",
                      f"{r['max_diff_dv']:.1e}")
        console.print(t)
        di = d_identity()
        console.print(f"D_i: Σ_k P_ik dP_ik vs dO_i · O_i: max |diff| = {di['max_diff']:.1e} (values up to {di['max_abs']:.2f})")
        ad = count_dq_adds()
        console.print(f"dQ atomic adds (counted in the backward): {ad['counted']:,} elements "
                      f"= ceil(N/B_c) · N · d = {ad['kv_blocks']} x {N} x {D_HEAD} = {ad['formula']:,}")
        console.print(f"FlashAttentionFunction saves: {saved_by_function()} (q, k, v, o, lse; no N x N tensor)")

    console.rule("Demo 2 (§7.1, §7.2): store P or store L? one layer, 32 heads")
    t = Table("N", "P (fp16)", "L (fp32)", "P / L")
    for r in cost_model.p_storage_table():
        t.add_row(f"{r['N']:,}", _gib(r["p_gib"]), f"{r['l_mib']:g} MiB", f"{r['ratio']:,.0f}")
    console.print(t)

    console.rule("Demo 3 (§7.5): backward on an H100, N = 4096, d = 128, 32 heads, FP16")
    rows = cost_model.backward_estimate()
    t = Table("backward", "GFLOP", "HBM MB", "compute µs", "memory µs", "launches", "time µs", "bound")
    for r in rows[:2]:
        t.add_row(r["name"], f"{r['flops'] / 1e9:,.0f}", f"{r['bytes'] / 1e6:,.0f}", f"{r['compute_us']:,.0f}",
                  f"{r['memory_us']:,.0f}", str(r["launches"]), f"{r['time_us']:,.0f}", r["bound"])
    console.print(t)
    ratio = rows[2]
    console.print(f"flash / standard: FLOPs x{ratio['flops_ratio']:.2f} (+{ratio['flops_ratio'] - 1:.0%}), "
                  f"traffic 1/{1 / ratio['bytes_ratio']:.0f}, speedup {ratio['speedup']:.1f}x "
                  f"(roofline with {cost_model.LAUNCH_OVERHEAD_S * 1e6:.0f} µs per launch)")

    console.rule("Demo 4 (§7.6): recompute / read back = d / ridge")
    t = Table("GPU", "FP16 TFLOP/s", "HBM TB/s", "ridge FLOP/B", "d = 64", "d = 128", "d = 256", "recompute loses for d >")
    for r in cost_model.recompute_ratio_table():
        t.add_row(r["gpu"], f"{r['peak_tflops']:,.0f}", f"{r['bandwidth_tbs']:.3g}", f"{r['ridge']:.0f}",
                  f"{r['ratio_d64']:.2f}", f"{r['ratio_d128']:.2f}", f"{r['ratio_d256']:.2f}", f"{r['crossover_d']:.0f}")
    console.print(t)

    console.rule("Demo 5 (§7.7): 30 training steps, flash vs standard attention, same init")
    with ak.part_demo():
        try:
            tr = train_flash_vs_standard()
        except ImportError as e:
            console.print(f"skipped: the tiny transformer is not available ({e})")
            return
        console.print(f"loss {tr['first_loss']:.4f} -> {tr['last_loss']:.4f} over {tr['steps']} steps; "
                      f"max loss diff {tr['max_loss_diff']:.1e}; max parameter diff {tr['max_param_diff']:.1e}")


if __name__ == "__main__":
    main()
