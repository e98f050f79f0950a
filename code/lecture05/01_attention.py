"""Lecture 5, program 01: attention as a soft lookup, and why attention is slow (§2–§3).

Demo 1 (§2.2)  the tiny transformer on LikesWorld: accuracy on held-out worlds vs the random-item baseline,
               and with your flash_forward (part 2) as its attention
Demo 2 (§2.2)  what the heads do: layer 0 points each item at its owner, layer 1 looks the item up
               (attention maps saved as PNG heatmaps in code/lecture05/figures/)
Demo 3 (§2.2)  ablation: accuracy with each of the 8 heads removed
Demo 4 (§3.1–§3.2)  one 7B-scale layer: FLOPs against N, the size of S, traffic against matmul at 32K

Run from the repository root: python code/lecture05/01_attention.py
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (course/), and attention_kernels.py

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from course import cost_model, likesworld  # noqa: E402
from course.tiny_transformer import TinyTransformer, attention_weights, load_checkpoint, standard_attention  # noqa: E402
import attention_kernels as ak  # noqa: E402  (your implementation: --impl DIR)

FIGURES = Path(__file__).resolve().parent / "figures"
EXAMPLE = ("<bos> eve likes tea . dan likes jam . hal likes figs . gus likes plums . "
           "q dan jam . q gus plums . <eos>")                      # the §2.2 sequence
console = Console(width=110)


# ---------------------------------------------------------------------------------------- demo 1
def accuracy_demo(model: TinyTransformer) -> dict:
    """Test accuracy (held-out worlds) against answering with a random item from the context."""
    return {"params": model.num_params(),
            "test_accuracy": likesworld.evaluate(model, "test"),
            "baseline": likesworld.random_item_baseline("test"),
            "questions": sum(len(e.answer_at) for e in likesworld.examples("test"))}


def flash_accuracy(model: TinyTransformer) -> float:
    """Test accuracy with part 2's flash_forward (attention_kernels) in every layer."""
    def attention(q, k, v, causal=True):
        return ak.flash_forward(q, k, v, causal=causal)[0]
    return likesworld.evaluate(model, "test", attention=[attention] * len(model.blocks))


# ---------------------------------------------------------------------------------------- demo 2
@torch.no_grad()
def attention_maps(model: TinyTransformer, tokens: torch.Tensor) -> list[torch.Tensor]:
    """P of every layer, (B, H, T, T) each, recorded by per-layer attention functions."""
    maps: list[torch.Tensor] = []

    def recorder(q, k, v, causal=True):
        p = attention_weights(q, k, causal)
        maps.append(p)
        return p @ v

    model(tokens, [recorder] * len(model.blocks))
    return maps


def head_roles(model: TinyTransformer, n: int = 300) -> dict:
    """Mean attention weights of every head (layer, head) on n test examples:
    owner:  at each fact's item, the weight on the token two back (the item's owner);
    marker: at each asked person, the weight on the "q" right before it;
    lookup: at each asked person, the weight on that person's item in the facts."""
    exs = likesworld.examples("test", n)
    inputs, _ = likesworld.collate(exs)
    P = torch.stack(attention_maps(model, inputs), 1)           # (B, layers, H, T, T)
    owner, marker, lookup = [], [], []
    for b, e in enumerate(exs):
        items = [3 + 4 * f for f in range(e.n_items)]           # fact f: tokens 1+4f .. 4+4f
        owner += [P[b, :, :, j, j - 2] for j in items]
        for i in e.answer_at:                                   # the answer is tokens[i + 1]
            where = next(j for j in items if e.tokens[j] == e.tokens[i + 1])
            marker.append(P[b, :, :, i, i - 1])
            lookup.append(P[b, :, :, i, where])
    out = {name: torch.stack(v).mean(0) for name, v in (("owner", owner), ("marker", marker), ("lookup", lookup))}
    out["owner_head"] = (0, int(out["owner"][0].argmax()))
    out["marker_head"] = (0, int(out["marker"][0].argmax()))
    out["lookup_head"] = (1, int(out["lookup"][1].argmax()))
    return out


def save_heatmaps(model: TinyTransformer, roles: dict, out_dir: Path = FIGURES) -> list[Path]:
    """The two role heads' attention maps on the §2.2 sequence, as PNG heatmaps."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = likesworld.encode(EXAMPLE)
    words = EXAMPLE.split()
    maps = attention_maps(model, torch.tensor([ids]))
    paths = []
    for role, title in (("owner", "item → its owner"), ("lookup", "asked person → its item")):
        layer, head = roles[f"{role}_head"]
        p = maps[layer][0, head].numpy()
        fig, ax = plt.subplots(figsize=(8.5, 7.5))
        ax.imshow(p, cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_xticks(range(len(words)), words, rotation=90, fontsize=8)
        ax.set_yticks(range(len(words)), words, fontsize=8)
        ax.set_xlabel("key (attended token)")
        ax.set_ylabel("query")
        ax.set_title(f"layer {layer} head {head}: {title}")
        fig.tight_layout()
        path = out_dir / f"{role}_head.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------- demo 3
def _without_heads(*heads: int):
    def attention(q, k, v, causal=True):
        o = standard_attention(q, k, v, causal)
        o[:, list(heads)] = 0.0           # these heads contribute nothing to W_O's input
        return o
    return attention


def ablation(model: TinyTransformer) -> dict[tuple[int, int] | str, float]:
    """Test accuracy with one head's output zeroed, for each (layer, head); and with all of
    layer 1's heads zeroed ("layer 1")."""
    out: dict[tuple[int, int] | str, float] = {}
    L, H = len(model.blocks), model.config.n_heads
    for layer in range(L):
        for head in range(H):
            attns = [standard_attention] * L
            attns[layer] = _without_heads(head)
            out[(layer, head)] = likesworld.evaluate(model, "test", attention=attns)
    out["layer 1"] = likesworld.evaluate(model, "test", attention=[standard_attention, _without_heads(*range(H))])
    return out


# ---------------------------------------------------------------------------------------- demo 4
def cost_tables() -> dict:
    return {"flops": cost_model.layer_flops_table(), "traffic": cost_model.attention_traffic_vs_matmul()}


def _n(N: int) -> str:
    return f"{N // 1024}K"


def main(argv: list[str] | None = None) -> None:
    ak.setup(__doc__, argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)   # tiny tensors: extra threads only add hand-off (and spin-wait) costs
    model = load_checkpoint()

    console.rule("Demo 1 (§2.2): the tiny transformer on LikesWorld")
    acc = accuracy_demo(model)
    cfg = model.config
    console.print(f"model: {cfg.n_layers} layers, {cfg.n_heads} heads × {cfg.head_dim} dims, d_model {cfg.d_model}, "
                  f"SwiGLU {cfg.d_ff}, RoPE, RMSNorm: {acc['params']:,} parameters")
    console.print(f"example: {EXAMPLE}")
    console.print(f"test accuracy (held-out worlds, {acc['questions']} questions): {acc['test_accuracy']:.1%}")
    console.print(f"random item from the context: {acc['baseline']:.1%}")
    with ak.part_demo():
        console.print(f"with your flash_forward (part 2) as the attention: {flash_accuracy(model):.1%} "
                      f"(exact attention gives the {acc['test_accuracy']:.1%} above)")

    console.rule("Demo 2 (§2.2): what the heads do")
    roles = head_roles(model)
    t = Table("head", "item → its owner (2 back)", "asked person → the 'q' before it", "asked person → its item")
    for layer in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            t.add_row(f"L{layer}H{h}", *(f"{roles[k][layer, h]:.0%}" for k in ("owner", "marker", "lookup")))
    console.print(t)
    (l0, h0), (lm, hm), (l1, h1) = roles["owner_head"], roles["marker_head"], roles["lookup_head"]
    console.print(f"owner head: L{l0}H{h0} puts {roles['owner'][l0, h0]:.0%} of each item's attention on its owner "
                  f"(the item now carries who likes it)")
    console.print(f"question head: L{lm}H{hm} puts {roles['marker'][lm, hm]:.0%} of the asked person's attention on "
                  f"the 'q' before it (this name is a question)")
    looked = ", ".join(f"L1H{h} {roles['lookup'][1, h]:.0%}" for h in range(cfg.n_heads))
    console.print(f"lookup heads: the asked person's attention on that person's item: {looked}")
    for path in save_heatmaps(model, roles):
        console.print(f"saved {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")

    console.rule("Demo 3 (§2.2): accuracy with one head removed")
    abl = ablation(model)
    names = {(l0, h0): "owner", (lm, hm): "question", (l1, h1): "lookup"}
    t = Table("removed", "test accuracy", "role (demo 2)")
    for key, a in abl.items():
        if key != "layer 1":
            t.add_row(f"L{key[0]}H{key[1]}", f"{a:.1%}", names.get(key, "lookup" if key[0] == 1 else ""))
    t.add_row("all of layer 1", f"{abl['layer 1']:.1%}", "every lookup head")
    console.print(t)
    singles = {k: v for k, v in abl.items() if k != "layer 1"}
    worst = sorted(singles, key=singles.get)[:2]
    console.print(f"largest drops: {', '.join(f'L{l}H{h} ({singles[(l, h)]:.1%})' for l, h in worst)}; "
                  f"heads that can go with accuracy still >= 99%: {sum(a >= 0.99 for a in singles.values())} of "
                  f"{len(singles)}; random item: {acc['baseline']:.1%}")

    console.rule("Demo 4 (§3.1–§3.2): one 7B-scale layer (d_model 4096, 32 × 128, FFN 11008, causal)")
    tabs = cost_tables()
    t = Table("N", "linear TFLOP", "attention TFLOP", "attention share", "S, all heads (fp16)")
    for r in tabs["flops"]:
        t.add_row(_n(r["N"]), f"{r['linear_flops'] / 1e12:.2f}", f"{r['attention_flops'] / 1e12:.2f}",
                  f"{r['attention_share']:.0%}", f"{r['s_gib']:,.0f} GiB" if r["s_gib"] >= 1 else f"{r['s_gib'] * 1024:.0f} MiB")
    console.print(t)
    t = Table("N", "HBM traffic (4Nd + 4N², fp16)", "traffic time", "matmul time", "S / H100 HBM")
    for r in tabs["traffic"]:
        t.add_row(_n(r["N"]), f"{r['traffic_bytes'] / 2**30:.1f} GiB", f"{r['traffic_ms']:.1f} ms",
                  f"{r['matmul_ms']:.1f} ms", f"{r['s_fraction_of_hbm']:.0%}")
    console.print(t)


if __name__ == "__main__":
    main()
