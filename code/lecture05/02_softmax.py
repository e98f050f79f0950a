"""Lecture 5, program 02: three softmaxes and the merge ⊕ (§4).

Demo 1 (§4.1)  overflow thresholds of exp in float32/float16, and the naive softmax's NaN
Demo 2 (§4.2–§4.3)  passes over the input counted element by element, and the online rebases
Demo 3 (§4.4)  four merge orders of (m, ℓ) summaries against torch.logsumexp
Demo 4 (§4.5)  one query row streaming through four K/V blocks as (m, ℓ, o)

Run from the repository root: python code/lecture05/02_softmax.py
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (course/), and attention_kernels.py

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from course.counting import ReadCounter  # noqa: E402
from course.reference import attention_reference  # noqa: E402
import attention_kernels as ak  # noqa: E402  (your implementation: --impl DIR)

SEED = 0
console = Console(width=110)


# ---------------------------------------------------------------------------------------- demo 1
def overflow_thresholds() -> dict[str, float]:
    """§4.1: exp(x) overflows once x > log(largest finite value of the dtype)."""
    return {str(dt).replace("torch.", ""): math.log(torch.finfo(dt).max) for dt in (torch.float32, torch.float16)}


def naive_nan_demo() -> dict[str, list[float]]:
    """Scores of 10, 90, 100 in float32: exp(90) = inf, inf/inf = nan (naive); safe is fine."""
    x = torch.tensor([10.0, 90.0, 100.0], dtype=torch.float32)
    return {"x": x.tolist(), "naive": ak.naive_softmax(x).tolist(), "safe": ak.safe_softmax(x).tolist()}


# ---------------------------------------------------------------------------------------- demo 2
def pass_counts(n: int = 4096, seed: int = SEED) -> dict:
    """§4.2–§4.3: element reads / n for the three counted softmaxes, and the online rebases.

    Expected rebases on randomly ordered data: Σ_{k=2}^{n} 1/k = H_n - 1 (≈ ln n)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=g, dtype=torch.float64).tolist()
    out = {}
    for name, fn in (("naive", ak.naive_softmax_counted), ("safe", ak.safe_softmax_counted), ("online", ak.online_softmax_counted)):
        counter = ReadCounter(values)
        result = fn(counter)
        out[name] = counter.reads / len(counter)
        if name == "online":
            out["rebases"] = result[1]
    out["expected_rebases"] = sum(1.0 / k for k in range(2, n + 1))
    out["ln_n"] = math.log(n)
    return out


# ---------------------------------------------------------------------------------------- demo 3
def _fold(summaries: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left to right: ((s0 ⊕ s1) ⊕ s2) ⊕ ...; starts from the identity (-inf, 0)."""
    dt = summaries[0][0].dtype
    acc = (torch.tensor(float("-inf"), dtype=dt), torch.tensor(0.0, dtype=dt))
    for s in summaries:
        acc = ak.merge_summary(acc, s)
    return acc


def _tree(m: torch.Tensor, l: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pairwise tree of element summaries, one vectorised ⊕ per level; pads with the identity."""
    levels = 0
    while m.numel() > 1:
        if m.numel() % 2:
            m = torch.cat([m, m.new_full((1,), float("-inf"))])
            l = torch.cat([l, l.new_zeros(1)])
        m, l = ak.merge_summary((m[0::2], l[0::2]), (m[1::2], l[1::2]))
        levels += 1
    return m[0], l[0], levels


def merge_orders(n: int = 10_000, seed: int = SEED, scale: float = 5.0) -> dict:
    """§4.4: logsumexp of n values from four merge orders of (m, ℓ) summaries, in float64,
    each compared with torch.logsumexp; plus the float32 gap between merging element by element
    and computing at once. Values are scale * N(0, 1), so logsumexp is around 20."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(n, generator=g, dtype=torch.float64)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, n), 6))  # 7 uneven blocks
    blocks = [x[a:b] for a, b in zip([0] + cuts, cuts + [n])]
    block_summaries = [ak.online_summary(b) for b in blocks]
    shuffled = block_summaries[:]
    rng.shuffle(shuffled)

    def elements(t: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(xi, torch.ones((), dtype=t.dtype)) for xi in t.unbind()]  # one element: (x, 1)

    orders = {}
    m, l = _fold(elements(x))
    orders["left to right, element by element"] = m + torch.log(l)
    m, l = _fold(block_summaries)
    orders["7 uneven blocks"] = m + torch.log(l)
    m, l, levels = _tree(x.clone(), torch.ones_like(x))
    orders[f"pairwise tree ({levels} levels)"] = m + torch.log(l)
    m, l = _fold(shuffled)
    orders["7 blocks, shuffled order"] = m + torch.log(l)

    exact = torch.logsumexp(x, dim=0)
    x32 = x.float()
    m32, l32 = _fold(elements(x32))
    fp32_stream = (m32 + torch.log(l32)).item()
    fp32_once = torch.logsumexp(x32, dim=0).item()
    return {
        "n": n,
        "block_sizes": [len(b) for b in blocks],
        "tree_levels": levels,
        "logsumexp": exact.item(),
        "orders": {k: {"value": v.item(), "diff": abs(v.item() - exact.item())} for k, v in orders.items()},
        "fp32_stream": fp32_stream,
        "fp32_once": fp32_once,
        "fp32_diff": abs(fp32_stream - fp32_once),
    }


# ---------------------------------------------------------------------------------------- demo 4
def online_trace(n_keys: int = 16, n_blocks: int = 4, d: int = 2, seed: int = SEED) -> dict:
    """§4.5: one query row (d = 2) against n_keys keys in n_blocks K/V blocks, merged with ⊕ as
    (m, ℓ, o). Each step records the block's max, the running m, the rescale factor
    exp(m_old - m_new) applied to the old ℓ and o, ℓ, the unnormalised o and o / ℓ. Also returns
    the row's scores and the values, so that each step can be checked against its prefix."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, d, generator=g, dtype=torch.float64)
    k = torch.randn(n_keys, d, generator=g, dtype=torch.float64)
    v = torch.randn(n_keys, d, generator=g, dtype=torch.float64)
    s = (q @ k.T).squeeze(0) / math.sqrt(d)
    state = (torch.tensor(float("-inf"), dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64), torch.zeros(d, dtype=torch.float64))
    steps = []
    for b, idx in enumerate(torch.arange(n_keys).chunk(n_blocks)):
        s_b = s[idx]
        m_b = s_b.max()
        p_b = torch.exp(s_b - m_b)
        part = (m_b, p_b.sum(), p_b @ v[idx])
        m_old = state[0]
        state = ak.merge_partial(state, part)
        rescale = math.exp(m_old.item() - state[0].item()) if b > 0 else float("nan")
        steps.append(
            {
                "block": b + 1,
                "block_max": m_b.item(),
                "m": state[0].item(),
                "rescale": rescale,
                "l": state[1].item(),
                "o": state[2].tolist(),
                "out": (state[2] / state[1]).tolist(),
            }
        )
    ref, _ = attention_reference(q, k, v)
    final = state[2] / state[1]
    return {"steps": steps, "scores": s.tolist(), "values": v.tolist(), "reference": ref.squeeze(0).tolist(),
            "max_diff": (final - ref.squeeze(0)).abs().max().item()}


# ---------------------------------------------------------------------------------------- main
def _vec(xs: list[float]) -> str:
    return "[" + ", ".join(f"{x:+.4f}" for x in xs) + "]"


def main(argv: list[str] | None = None) -> None:
    ak.setup(__doc__, argv)
    torch.set_num_threads(1)  # small tensors: one thread avoids OpenMP waits on a busy 2-core machine
    console.rule("Demo 1 (§4.1): naive softmax overflows")
    with ak.part_demo():
        thr = overflow_thresholds()
        t = Table("dtype", "largest finite value", "exp(x) = inf for x >", title="overflow threshold = log(finfo.max)")
        for name, dt in (("float32", torch.float32), ("float16", torch.float16)):
            big = torch.finfo(dt).max
            t.add_row(name, f"{big:,.0f}" if big < 1e6 else f"{big:.4g}", f"{thr[name]:.2f}")
        console.print(t)
        demo = naive_nan_demo()
        console.print(f"x = {demo['x']} (float32): naive {demo['naive']}   safe {[round(p, 6) for p in demo['safe']]}")

    console.rule("Demo 2 (§4.2–§4.3): passes over 4,096 values, counted per element read")
    with ak.part_demo():
        pc = pass_counts()
        t = Table("softmax", "reads / N", caption=f"N(0, 1) values, seed {SEED}")
        for name in ("naive", "safe", "online"):
            t.add_row(name, f"{pc[name]:g}")
        console.print(t)
        console.print(
            f"online rebases: {pc['rebases']} (expected Σ_(k=2..N) 1/k = {pc['expected_rebases']:.2f}; ln N = {pc['ln_n']:.2f})"
        )

    console.rule("Demo 3 (§4.4): four merge orders of (m, ℓ) on 10,000 values, float64")
    with ak.part_demo():
        mo = merge_orders()
        t = Table("merge order", "m + log ℓ", "|diff| vs torch.logsumexp",
                  title=f"torch.logsumexp = {mo['logsumexp']:.15f}; blocks {mo['block_sizes']}")
        for name, r in mo["orders"].items():
            t.add_row(name, f"{r['value']:.15f}", f"{r['diff']:.1e}")
        console.print(t)
        console.print(
            f"float32: element-by-element merge {mo['fp32_stream']:.7f} vs torch.logsumexp at once "
            f"{mo['fp32_once']:.7f}: differ by {mo['fp32_diff']:.1e}"
        )

    console.rule("Demo 4 (§4.5): one query row through 4 K/V blocks, d = 2")
    with ak.part_demo():
        tr = online_trace()
        t = Table("block", "block max", "m", "rescale exp(m_old - m_new)", "ℓ", "o (unnormalised)", "o / ℓ",
                  title=f"16 keys, 4 blocks of 4, seed {SEED}")
        for st in tr["steps"]:
            rescale = "-" if math.isnan(st["rescale"]) else f"{st['rescale']:.3f}"
            t.add_row(str(st["block"]), f"{st['block_max']:+.3f}", f"{st['m']:+.3f}", rescale, f"{st['l']:.4f}",
                      _vec(st["o"]), _vec(st["out"]))
        console.print(t)
        console.print(f"standard attention: {_vec(tr['reference'])}   max |diff| = {tr['max_diff']:.1e}")


if __name__ == "__main__":
    main()
