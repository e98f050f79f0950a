"""A tiny Llama-style transformer for LikesWorld (§2.5), in one readable file.

    x = x + Attention(RMSNorm(x))        RoPE rotates q and k (§2.5)
    x = x + SwiGLU_FFN(RMSNorm(x))

2 layers, 4 heads of 16 dims, d_model 64, SwiGLU hidden 128, untied embeddings: 86,080 parameters.
The attention implementation is a parameter (an AttentionFn), so the same weights run with
standard attention, FlashAttention (part 2) or Flash-Decoding (part 6); this module never
imports the graded solutions.

    python -m course.tiny_transformer train   # retrains course/checkpoints/likesworld.pt
    python -m course.tiny_transformer eval    # accuracy of the committed checkpoint
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course import likesworld

CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "likesworld.pt"

# AttentionFn(q, k, v, causal) -> o, q: (B, H, Tq, d), k/v: (B, H, Tk, d), o: (B, H, Tq, d).
# causal=True is bottom-right aligned: the Tq queries are the LAST Tq of the Tk positions.
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
# kv(k_new, v_new) -> (k_all, v_all): a KV cache hook, called once per block after RoPE (§8.2).
KVFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


# §2.3 scaled dot-product attention -----------------------------------------------------------
def attention_weights(q: torch.Tensor, k: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """P = softmax(q kᵀ / √d) with the bottom-right causal mask: (B, H, Tq, Tk).
    A query that may see no key (causal, Tq > Tk) gets an all-zero row."""
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    S = (q @ k.transpose(-2, -1)) / math.sqrt(d)                     # (B, H, Tq, Tk)
    if causal:   # query i may see key j iff j <= i + (Tk - Tq)
        i = torch.arange(Tq).unsqueeze(1)
        j = torch.arange(Tk).unsqueeze(0)
        visible = j <= i + (Tk - Tq)
        P = torch.softmax(S.masked_fill(~visible, float("-inf")), dim=-1)
        return P if Tq <= Tk else P.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # rows with no key
    return torch.softmax(S, dim=-1)


def standard_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       causal: bool = True) -> torch.Tensor:
    """The standard implementation: materialises S and P (§3.2). o = P v: (B, H, Tq, d)."""
    return attention_weights(q, k, causal) @ v


def decoding_attention(decode: Callable[..., tuple[torch.Tensor, torch.Tensor]], num_splits: int,
                       prefill: AttentionFn = standard_attention) -> AttentionFn:
    """An AttentionFn that uses Flash-Decoding (§8.4) for 1-query steps and `prefill` otherwise.
    `decode(q, k, v, num_splits) -> (o, lse)` is e.g. solutions.flash_decoding.flash_decode; a
    single query is the last position, so it sees every cached key and needs no mask."""
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
        if q.shape[-2] == 1:
            return decode(q, k, v, num_splits)[0]
        return prefill(q, k, v, causal)
    return attention


# §2.5 the model ------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    vocab_size: int = likesworld.VOCAB_SIZE
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128              # SwiGLU hidden size
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class RMSNorm(nn.Module):
    """x / rms(x) * g: LayerNorm without the mean (one reduction fewer, §2.5)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as a function: x (..., d), weight (d,) -> (..., d). The model's pieces are functions too
    (rms_norm, attention_heads, merge_heads, swiglu): the grader computes them with these (part 5)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate each pair of dims (x[2i], x[2i+1]) of x (B, H, T, d) by angle positions[t] * base^(-2i/d)
    (§2.5). Then rope(q, m) · rope(k, n) depends only on m - n: attention sees relative offsets."""
    return rope_rotate(x, *rope_angles(positions, x.shape[-1], base, x.dtype))


def rope_angles(positions: torch.Tensor, d: int, base: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles positions[t] * base^(-2i/d), computed in float64: (T, d/2) each, in dtype."""
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)           # (d/2,)
    angle = positions.to(torch.float64).unsqueeze(-1) * inv_freq                    # (T, d/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, d) with each pair (x[2i], x[2i+1]) rotated by the angle whose cos and sin (T, d/2) are given."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attention: AttentionFn,
                kv: KVFn | None = None) -> torch.Tensor:
        q, k, v = self.heads(x, positions)       # (B, H, T, d) each
        if kv is not None:                       # §8.2: append to the cache, attend to all of it
            k, v = kv(k, v)
        o = attention(q, k, v, True)             # (B, H, T, d)
        return self.merge(o, x.shape[0], x.shape[1])

    def heads(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, T, d) of x (B, T, d_model): the projections split into heads, q and k rotated (RoPE)."""
        return attention_heads(x, positions, self.wq.weight, self.wk.weight, self.wv.weight, self.cfg.n_heads,
                               self.cfg.rope_base)

    def merge(self, o: torch.Tensor, B: int, T: int) -> torch.Tensor:
        """The heads of o (B, H, T, d) side by side, projected by wo: (B, T, d_model)."""
        return self.wo(o.transpose(1, 2).reshape(B, T, self.cfg.n_heads * self.cfg.head_dim))


def attention_heads(x: torch.Tensor, positions: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                    n_heads: int, base: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention.heads as a function: x (B, T, d_model), positions (T,), wq/wk/wv (d_model, d_model) ->
    q, k, v (B, H, T, d), q and k rotated by RoPE."""
    B, T, _ = x.shape
    d = wq.shape[0] // n_heads
    q, k, v = (F.linear(x, w).view(B, T, n_heads, d).transpose(1, 2) for w in (wq, wk, wv))
    cos, sin = rope_angles(positions, q.shape[-1], base, q.dtype)   # rope(q, ...) and rope(k, ...), one table
    return rope_rotate(q, cos, sin), rope_rotate(k, cos, sin), v


def merge_heads(o: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """Attention.merge as a function of o (B, H, T, d) alone: (B, T, H·d) @ woᵀ."""
    B, H, T, d = o.shape
    return F.linear(o.transpose(1, 2).reshape(B, T, H * d), wo)


class SwiGLU(nn.Module):
    """W2(SiLU(W1 x) ⊙ W3 x), Llama's FFN (§2.5)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.w1.weight, self.w3.weight, self.w2.weight)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """SwiGLU as a function: x (..., d), w1 and w3 (d_ff, d), w2 (d, d_ff) -> (..., d)."""
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attention: AttentionFn,
                kv: KVFn | None = None) -> torch.Tensor:
        """x: (B, T, d_model); positions: (T,) long, the absolute positions of these T tokens."""
        x = x + self.attn(self.attn_norm(x), positions, attention, kv)   # pre-norm
        x = x + self.ffn(self.ffn_norm(x))
        return x


class TinyTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, tokens: torch.Tensor,
                attention: AttentionFn | Sequence[AttentionFn] = standard_attention) -> torch.Tensor:
        """tokens (B, T) long -> logits (B, T, V), no cache, positions 0..T-1. `attention` is one
        AttentionFn, or a sequence with one per layer (the head-ablation demo uses that)."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a (B, T) long tensor, got {tuple(tokens.shape)} {tokens.dtype}")
        per_layer = list(attention) if isinstance(attention, Sequence) else [attention] * len(self.blocks)
        positions = torch.arange(tokens.shape[1])
        x = self.tok_emb(tokens)
        for block, attn in zip(self.blocks, per_layer, strict=True):
            x = block(x, positions, attn)
        return self.lm_head(self.norm(x))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())      # tied weights counted once


def make_model(seed: int = 0, config: ModelConfig | None = None) -> TinyTransformer:
    """A freshly initialised model; the same seed gives the same weights."""
    torch.manual_seed(seed)
    model = TinyTransformer(config or ModelConfig())
    for name, p in model.named_parameters():
        if p.dim() == 2:   # GPT-2 style init; residual output projections scaled by depth
            std = 0.02 / math.sqrt(2 * model.config.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)
    return model


@torch.no_grad()
def greedy_generate(model: TinyTransformer, prompt: torch.Tensor, max_new_tokens: int,
                    attention: AttentionFn = standard_attention) -> torch.Tensor:
    """Greedy decoding WITHOUT a cache: each step recomputes the whole sequence (§8.1).
    prompt (B, T0) long -> (B, T0 + max_new_tokens)."""
    tokens = prompt
    for _ in range(max_new_tokens):
        nxt = model(tokens, attention)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


# training ------------------------------------------------------------------------------------
# Two things made LikesWorld learnable in 2,500 steps (code/lecture05/README.md, "plan vs actual"):
# - a curriculum: the first EASY_STEPS batches have 2 facts per example. With few tokens before an
#   item, layer 0's owner -> item signal is strong enough for layer 1's lookup to start; on the
#   full 2..6 facts from step 0 the same model stayed at 20-44% for 1,250-2,000 steps;
# - answer tokens weigh ANSWER_WEIGHT in the loss: most other tokens are random draws (who is
#   named next, which item) that carry no signal about the lookup.
TRAIN_STEPS, EASY_STEPS, BATCH_SIZE, LR, WARMUP, ANSWER_WEIGHT = 2500, 1000, 32, 2e-3, 100, 10.0


def train(model: TinyTransformer, steps: int = TRAIN_STEPS, attention: AttentionFn = standard_attention,
          seed: int = 0, batch_size: int = BATCH_SIZE, lr: float = LR, easy_steps: int = EASY_STEPS,
          answer_weight: float = ANSWER_WEIGHT, log_every: int = 0,
          on_step: Callable[[float], None] | None = None) -> list[float]:
    """AdamW (no weight decay) on next-token cross-entropy over LikesWorld training batches,
    answers weighted by `answer_weight`; linear warm-up, constant during the curriculum's easy
    steps, then cosine decay to 0. Deterministic: fixed data order for `seed`, deterministic
    algorithms, one thread (the same float32 summation order every run). `on_step(loss)` is
    called after every step (benchmarks time the steps with it). Returns the losses."""
    batches = likesworld.training_batches(batch_size, seed, easy_steps)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)

    def schedule(s: int) -> float:
        warm = min(1.0, (s + 1) / WARMUP)
        if s < easy_steps:
            return warm
        return warm * 0.5 * (1 + math.cos(math.pi * (s - easy_steps) / max(steps - easy_steps, 1)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False   # a debugging aid; costs ~10% here
    losses = []
    try:
        model.train()
        for step in range(steps):
            inputs, targets = next(batches)
            logits = model(inputs, attention)
            weight = torch.where(likesworld.answer_mask(inputs), answer_weight, 1.0) * (targets != -100)
            loss_all = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
            loss = (loss_all * weight.flatten()).sum() / weight.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(losses[-1])
            if log_every and (step + 1) % log_every == 0:
                print(f"step {step + 1:5d}  loss {loss.item():.4f}")
    finally:
        model.eval()
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    return losses


def save_checkpoint(model: TinyTransformer, path: Path | str = CHECKPOINT, meta: dict | None = None) -> None:
    # tied weights are one storage: torch.save writes them once
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict(), "meta": meta or {}}, path)


def load_checkpoint(path: Path | str | None = None) -> TinyTransformer:
    """The trained model (eval mode). Default: course/checkpoints/likesworld.pt."""
    path = Path(path) if path is not None else CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; run `python -m course.tiny_transformer train`")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyTransformer(ModelConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["state_dict"])
    return model.eval()


def _report(model: TinyTransformer) -> dict:
    acc_test = likesworld.evaluate(model, "test")
    acc_train = likesworld.evaluate(model, "train")
    base = likesworld.random_item_baseline("test")
    print(f"parameters              {model.num_params():,}")
    print(f"train-split accuracy    {acc_train:.1%}")
    print(f"test-split accuracy     {acc_test:.1%}   (held-out worlds, {likesworld.EVAL_SIZE} examples)")
    print(f"random-item baseline    {base:.1%}   (uniform over the items in the context)")
    return {"params": model.num_params(), "train_accuracy": acc_train, "test_accuracy": acc_test,
            "random_item_baseline": base}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m course.tiny_transformer")
    ap.add_argument("command", choices=["train", "eval"])
    ap.add_argument("--steps", type=int, default=TRAIN_STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--easy-steps", type=int, default=EASY_STEPS)
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--out", type=Path, default=CHECKPOINT)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)      # tiny tensors: more threads only add OpenMP hand-off costs
    if args.command == "eval":
        _report(load_checkpoint(args.out))
        return
    model = make_model(args.seed)
    t0 = time.perf_counter()
    losses = train(model, args.steps, seed=args.seed, lr=args.lr, easy_steps=args.easy_steps, log_every=250)
    seconds = time.perf_counter() - t0
    print(f"trained {args.steps} steps in {seconds:.1f} s (1 thread)")
    meta = {"steps": args.steps, "easy_steps": args.easy_steps, "seed": args.seed, "batch_size": BATCH_SIZE, "lr": args.lr,
            "answer_weight": ANSWER_WEIGHT,
            "final_loss": losses[-1], "train_seconds": round(seconds, 1), "torch": str(torch.__version__)}
    meta |= _report(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, args.out, meta)
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
