"""Lecture 5, program 05: inference — the KV cache, prefill vs decode, Flash-Decoding (§8).

Demo 1 (§8.2)  KV cache vs recomputing the sequence on 60 prompts: identical generations, the
               largest logit difference, and the compute the cache saves
               (--buggy-cache also runs the first version's layer-0 cache-length bug)
Demo 2 (§8.3)  prefill vs decode for one 7B-scale layer on an H100
Demo 3 (§8.4)  Flash-Decoding in the tiny model's decode steps: 2, 4 and 7 splits
Demo 4 (§8.4)  how many splits at 32K context: the wave-quantisation estimate

Run from the repository root: python code/lecture05/05_inference.py [--buggy-cache]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (course/), and attention_kernels.py

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from course import cost_model, likesworld  # noqa: E402
from course.tiny_transformer import (  # noqa: E402
    AttentionFn,
    TinyTransformer,
    decoding_attention,
    load_checkpoint,
    standard_attention,
)
import attention_kernels as ak  # noqa: E402  (your implementation: --impl DIR)

MAX_NEW = 8
console = Console(width=110)
ForwardFn = Callable[[TinyTransformer, torch.Tensor, Any, AttentionFn], torch.Tensor]  # (model, tokens, KVCache, attention)


def flash_attention(q, k, v, causal=True):
    """Part 2's flash_forward as an AttentionFn (its lse is not needed here)."""
    return ak.flash_forward(q, k, v, causal=causal)[0]


@torch.no_grad()
def forward_with_cache_first_version(model: TinyTransformer, tokens: torch.Tensor, cache: ak.KVCache,
                                     attention: AttentionFn = standard_attention) -> torch.Tensor:
    """The first version of the cached forward, kept to show its bug (§8.2): the positions are read
    from cache.length INSIDE the layer loop. cache.length is layer 0's length, and layer 0 has
    already appended the new tokens when layer 1 runs, so layer 1 uses positions shifted by T."""
    x = model.tok_emb(tokens)
    for i, block in enumerate(model.blocks):
        positions = torch.arange(cache.length, cache.length + tokens.shape[1])   # the bug
        x = block(x, positions, attention, kv=lambda k, v, i=i: cache.update(i, k, v))
    return model.lm_head(model.norm(x))


# ---------------------------------------------------------------------------------------- demo 1
# The prompts run in batches of equal length (5 lengths: 2..6 facts), one row per prompt; every
# figure is per prompt. A row never sees another row, so batching changes nothing but the speed.
@torch.no_grad()
def recompute_run(model: TinyTransformer, prompts: torch.Tensor, max_new: int = MAX_NEW,
                  attention: AttentionFn = standard_attention) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy generation that recomputes the whole sequence every step. prompts (B, L) ->
    tokens (B, L + max_new) and the step logits (max_new, B, V)."""
    tokens, logits = prompts, []
    for _ in range(max_new):
        last = model(tokens, attention)[:, -1]
        logits.append(last)
        tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], 1)
    return tokens, torch.stack(logits)


@torch.no_grad()
def cached_run(model: TinyTransformer, prompts: torch.Tensor, max_new: int = MAX_NEW,
               attention: AttentionFn = standard_attention,
               forward: ForwardFn | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy generation with a KV cache (forward: part 5's forward_with_cache unless given): a
    prefill of the prompts (B, L), then one token per step. Returns tokens (B, L + max_new) and the
    step logits (max_new, B, V)."""
    forward = forward or ak.forward_with_cache
    cfg = model.config
    cache = ak.KVCache(cfg.n_layers, prompts.shape[0], cfg.n_heads, prompts.shape[1] + max_new, cfg.head_dim)
    tokens = prompts
    last = forward(model, tokens, cache, attention)[:, -1]
    logits = [last]
    for step in range(max_new):
        nxt = last.argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], 1)
        if step + 1 < max_new:
            last = forward(model, nxt, cache, attention)[:, -1]
            logits.append(last)
    return tokens, torch.stack(logits)


def by_length(prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """(indices, (B, L) tensor) for each prompt length."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    return [(idx, torch.tensor([prompts[i] for i in idx])) for idx in groups.values()]


def max_logit_diff(a: torch.Tensor, b: torch.Tensor, toks_a: list[int], toks_b: list[int], prompt_len: int) -> float:
    """Largest |difference| of one prompt's step logits (max_new, V) while both runs have produced
    the same tokens (after a different token the inputs differ)."""
    worst = 0.0
    for t in range(a.shape[0]):
        worst = max(worst, float((a[t] - b[t]).abs().max()))
        if toks_a[prompt_len + t] != toks_b[prompt_len + t]:
            break
    return worst


def compare_runs(prompts: list[list[int]], run_a, run_b) -> dict:
    """run_a / run_b: (B, L) tensor -> (tokens, logits). Per prompt: tokens of both, same or not,
    the largest logit difference; plus run_b's outputs (to reuse as a reference)."""
    rows: list[dict] = [{} for _ in prompts]
    for idx, x in by_length(prompts):
        (ta, la), (tb, lb) = run_a(x), run_b(x)
        for row, i in enumerate(idx):
            a, b = ta[row].tolist(), tb[row].tolist()
            rows[i] = {"prompt": prompts[i], "a": a, "b": b, "same": a == b, "b_logits": lb[:, row],
                       "max_diff": max_logit_diff(la[:, row], lb[:, row], a, b, len(prompts[i]))}
    return {"rows": rows, "identical": sum(r["same"] for r in rows), "max_diff": max(r["max_diff"] for r in rows)}


def cache_vs_recompute(model: TinyTransformer, prompts: list[list[int]],
                       forward: ForwardFn | None = None) -> dict:
    """Generate MAX_NEW tokens from each prompt both ways; compare tokens and step logits.
    Rows: "a" = recompute, "b" = cached."""
    return compare_runs(prompts, lambda x: recompute_run(model, x), lambda x: cached_run(model, x, forward=forward))


def forward_flops(model: TinyTransformer, new: int, cached: int) -> int:
    """Matmul FLOPs (torch's FlopCounterMode: projections, FFN, QKᵀ, PV) of one forward of `new`
    tokens after `cached` ones; cached = 0 is a plain forward (the recompute path)."""
    key = (id(model), new, cached)
    if key not in _FLOPS:
        cfg = model.config
        cache = ak.KVCache(cfg.n_layers, 1, cfg.n_heads, new + cached, cfg.head_dim)
        for layer in range(cfg.n_layers if cached else 0):     # `cached` earlier tokens (values do not matter)
            filler = torch.zeros(1, cfg.n_heads, cached, cfg.head_dim)
            cache.update(layer, filler, filler)
        with FlopCounterMode(display=False) as counter:
            if cached:
                ak.forward_with_cache(model, torch.zeros(1, new, dtype=torch.long), cache)
            else:
                model(torch.zeros(1, new, dtype=torch.long))
        _FLOPS[key] = counter.get_total_flops()
    return _FLOPS[key]


_FLOPS: dict[tuple[int, int, int], int] = {}   # the FLOPs depend only on the shapes: count each once


def compute_saved(model: TinyTransformer, prompts: list[list[int]]) -> dict:
    """Work of generating MAX_NEW tokens per prompt, recompute vs cache, counted two ways:
    token-forwards (tokens pushed through the model: Σ_t (L + t) vs L + MAX_NEW - 1) and matmul
    FLOPs (recompute: full forwards of L, L+1, ...; cache: a prefill of L, then 1-token steps)."""
    fwd_r = sum(sum(len(p) + t for t in range(MAX_NEW)) for p in prompts)
    fwd_c = sum(len(p) + MAX_NEW - 1 for p in prompts)
    flops_r = sum(forward_flops(model, len(p) + t, 0) for p in prompts for t in range(MAX_NEW))
    flops_c = sum(forward_flops(model, len(p), 0) + sum(forward_flops(model, 1, len(p) + t) for t in range(MAX_NEW - 1))
                  for p in prompts)
    return {"mean_prompt": sum(map(len, prompts)) / len(prompts),
            "forwards_recompute": fwd_r, "forwards_cached": fwd_c, "forwards_ratio": fwd_r / fwd_c,
            "flops_recompute": flops_r, "flops_cached": flops_c, "flops_ratio": flops_r / flops_c}


# ---------------------------------------------------------------------------------------- demo 3
def flash_decoding_runs(model: TinyTransformer, prompts: list[list[int]], splits: tuple[int, ...] = (2, 4, 7)) -> dict:
    """Cached generation whose decode steps use Flash-Decoding with S splits (prefill: flash_forward),
    against cached generation with standard attention."""
    out = {}
    for S in splits:
        attn = decoding_attention(ak.flash_decode, S, prefill=flash_attention)
        res = compare_runs(prompts, lambda x: cached_run(model, x), lambda x: cached_run(model, x, attention=attn))
        out[S] = {"identical": res["identical"], "max_diff": res["max_diff"]}
    return out


def _continuation(row: dict, key: str) -> str:
    return likesworld.decode(row[key][len(row["prompt"]):])


def main(argv: list[str] | None = None) -> None:
    ap = ak.argument_parser(__doc__)
    ap.add_argument("--buggy-cache", action="store_true",
                    help="also run the first version's layer-0 cache-length bug and list the prompts it changes")
    args = ak.setup(__doc__, argv, ap)
    torch.set_num_threads(1)   # tiny tensors: extra threads only add hand-off (and spin-wait) costs
    model = load_checkpoint()
    prompts = likesworld.make_prompts(60)

    console.rule("Demo 1 (§8.2): KV cache vs recomputing the whole sequence")
    with ak.part_demo():
        res = cache_vs_recompute(model, prompts)
        cost = compute_saved(model, prompts)
        console.print(f"{len(prompts)} prompts (mean {cost['mean_prompt']:.1f} tokens), {MAX_NEW} new tokens each, greedy")
        console.print(f"identical generations: {res['identical']}/{len(prompts)}")
        console.print(f"max |logit difference| over all steps: {res['max_diff']:.1e} (float32 rounding)")
        ex = res["rows"][0]
        console.print(f"e.g. {likesworld.decode(ex['prompt'])!r} -> {_continuation(ex, 'b')!r}")
        t = Table("work", "recompute", "KV cache", "ratio")
        t.add_row("token-forwards", f"{cost['forwards_recompute']:,}", f"{cost['forwards_cached']:,}", f"{cost['forwards_ratio']:.1f}×")
        t.add_row("matmul FLOPs (FlopCounterMode)", f"{cost['flops_recompute']:,}", f"{cost['flops_cached']:,}", f"{cost['flops_ratio']:.1f}×")
        console.print(t)
        if args.buggy_cache:
            bug = cache_vs_recompute(model, prompts, forward=forward_with_cache_first_version)
            bad = [r for r in bug["rows"] if not r["same"]]
            console.print(f"[bold]--buggy-cache[/bold]: positions read from cache.length inside the layer loop")
            console.print(f"identical generations: {bug['identical']}/{len(prompts)}; "
                          f"max |logit difference| before the first differing token: {bug['max_diff']:.1e}")
            t = Table("prompt", "recompute", "buggy cache")
            for r in bad:
                t.add_row(likesworld.decode(r["prompt"]), _continuation(r, "a"), _continuation(r, "b"))
            console.print(t)
        else:
            console.print("(run with --buggy-cache to see what the first version's cache-length bug changes)")

    console.rule("Demo 2 (§8.3): prefill vs decode, one 7B-scale layer on an H100 (context 2048)")
    t = Table("phase", "batch", "linear FLOP/B", "linear µs", "attention FLOP/B", "attention µs", "attention share",
              "µs / token")
    for r in cost_model.prefill_decode_table():
        t.add_row(r["phase"], str(r["batch"]), f"{r['linear_intensity']:.0f}", f"{r['linear_us']:.1f}",
                  f"{r['attention_intensity']:.1f}", f"{r['attention_us']:.1f}", f"{r['attention_share']:.0%}",
                  f"{r['us_per_token']:.2f}")
    console.print(t)

    console.rule("Demo 3 (§8.4): Flash-Decoding in the decode steps (prefill: flash_forward)")
    with ak.part_demo():
        fd = flash_decoding_runs(model, prompts)
        t = Table("splits S", "identical generations", "max |logit difference|")
        for S, r in fd.items():
            t.add_row(str(S), f"{r['identical']}/{len(prompts)}", f"{r['max_diff']:.1e}")
        console.print(t)

    console.rule("Demo 4 (§8.4): splits at 32K context, batch 1, 32 heads, d = 128, H100 (132 SMs)")
    t = Table("S", "thread blocks", "waves", "SMs busy", "time")
    for r in cost_model.flash_decoding_estimate():
        t.add_row(str(r["splits"]), str(r["thread_blocks"]), str(r["waves"]), f"{r['sm_busy']:.0%}",
                  f"{r['time_us']:.0f} µs")
    console.print(t)


if __name__ == "__main__":
    main()
