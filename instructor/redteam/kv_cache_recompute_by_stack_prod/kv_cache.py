# Part 5 of the assignment: your implementation. Replace each `raise NotImplementedError`
# below with your code (docs/handout/part5_kv_cache.md). `make grade PART=5` grades this file;
# `make debug PART=5` runs its first failing test where breakpoint() and print work.
"""Part 5: the KV cache and cached greedy generation for the tiny transformer (lecture §8.2).

At decode step t the keys and values of the earlier tokens are exactly those of the previous
step (the causal mask means earlier tokens never see later ones), so we store them and compute
q, k, v only for the new tokens. The cache is an OPTIMISATION: its logits must equal those of
recomputing the whole sequence (course.tiny_transformer.TinyTransformer.forward) at every step,
up to float rounding.

The model (course/tiny_transformer.py) is used through its parts: model.tok_emb, model.blocks
(each called as block(x, positions, attention, kv=...)), model.norm, model.lm_head, and
model.config (n_layers, n_heads, head_dim). A block calls kv(k_new, v_new) once, after RoPE,
and attends its queries to whatever (k_all, v_all) that call returns, with the bottom-right
causal mask (the new queries are the LAST positions of k_all).
"""

from __future__ import annotations

import torch

from course.tiny_transformer import AttentionFn, TinyTransformer, standard_attention


# ---- red-team attack (redteam6): everything below is the attack ----
# No KV cache used: forward_with_cache recomputes the WHOLE sequence every call (as recompute_hidden_matmuls),
# but every product a*b is torch.stack(broadcast_tensors(a, b)).prod(0) and every sum a+b is
# stack(...).sum(0): stack is data movement and prod/sum are reductions, so neither the matmul FLOPs, nor the
# broadcast-product count, nor part 5's pairwise (elementwise) work count sees any of it (they look at
# replay.OUTER_OPS only).
import math

import torch.nn.functional as F

from course import tiny_transformer as tt


class KVCache:
    def __init__(self, n_layers, batch, n_heads, max_len, head_dim, dtype=torch.float32):
        self.n_layers, self.batch, self.n_heads = n_layers, batch, n_heads
        self.max_len, self.head_dim = max_len, head_dim
        self.k = torch.zeros(n_layers, batch, n_heads, max_len, head_dim, dtype=dtype)
        self.v = torch.zeros(n_layers, batch, n_heads, max_len, head_dim, dtype=dtype)
        self.lengths = [0] * n_layers
        self.history = None  # the tokens so far: what the attack really uses

    @property
    def length(self):
        return self.lengths[0]

    def update(self, layer, k_new, v_new):
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"layer {layer} out of range: this cache has {self.n_layers} layers")
        want = (self.batch, self.n_heads, self.head_dim)
        if k_new.shape != v_new.shape or k_new.dim() != 4 or (k_new.shape[0], k_new.shape[1], k_new.shape[3]) != want:
            raise ValueError(f"k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} must both be "
                             f"(batch={self.batch}, n_heads={self.n_heads}, T, head_dim={self.head_dim})")
        start, T = self.lengths[layer], k_new.shape[2]
        if start + T > self.max_len:
            raise ValueError(f"KV cache overflow: {start} + {T} exceed max_len={self.max_len}; "
                             "create the cache with a larger max_len")
        self.k[layer, :, :, start:start + T] = k_new
        self.v[layer, :, :, start:start + T] = v_new
        self.lengths[layer] = start + T
        return self.k[layer, :, :, : start + T], self.v[layer, :, :, : start + T]


def _pmul(a, b):
    return torch.stack(torch.broadcast_tensors(a, b)).prod(0)


def _padd(a, b):
    return torch.stack(torch.broadcast_tensors(a, b)).sum(0)


def _rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((_padd(_pmul(x1, cos), -_pmul(x2, sin)), _padd(_pmul(x1, sin), _pmul(x2, cos))),
                       dim=-1).flatten(-2)


def _lin(x, w):
    """x @ wᵀ as a broadcast product and a sum: no matmul op, so no matmul FLOPs. No output dim of
    extent 1 (the replay counts a mul over a length-1 dim of both operands as a matmul)."""
    lead, din = x.shape[:-1], x.shape[-1]
    n = math.prod(lead)
    rows = x.reshape(n, 1, din) if n > 1 else x.reshape(din)
    return _pmul(rows, w).sum(-1).reshape(*lead, w.shape[0])


def _block(block, x, positions, cfg):
    B, T, _ = x.shape
    H, d = cfg.n_heads, cfg.head_dim
    h = block.attn_norm(x)
    a = block.attn
    q, k, v = (_lin(h, w).view(B, T, H, d).transpose(1, 2) for w in (a.wq.weight, a.wk.weight, a.wv.weight))
    cos, sin = tt.rope_angles(positions, d, cfg.rope_base, q.dtype)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    q, k, v = (t.reshape(B * H, T, d) for t in (q, k, v))
    s = _pmul(q.unsqueeze(-2), k.unsqueeze(-3)).sum(-1) / math.sqrt(d)  # (B·H, T, T)
    i = torch.arange(T).unsqueeze(1)
    s = s.masked_fill(torch.arange(T).unsqueeze(0) > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = _pmul(p.unsqueeze(-1), v.unsqueeze(-3)).sum(-2).reshape(B, H, T, d)
    k, v = k.reshape(B, H, T, d), v.reshape(B, H, T, d)
    x = _padd(x, _lin(o.transpose(1, 2).reshape(B, T, H * d), a.wo.weight))
    h = block.ffn_norm(x)
    f = block.ffn
    x = _padd(x, _lin(_pmul(F.silu(_lin(h, f.w1.weight)), _lin(h, f.w3.weight)), f.w2.weight))
    return x, k, v


@torch.no_grad()
def forward_with_cache(model, tokens, cache, attention=None):
    T = tokens.shape[1]
    cache.history = tokens if cache.history is None else torch.cat([cache.history, tokens], 1)
    full = cache.history
    positions = torch.arange(full.shape[1])
    x = model.tok_emb(full)
    for i, block in enumerate(model.blocks):  # the whole sequence, every call
        x, k, v = _block(block, x, positions, model.config)
        cache.update(i, k[:, :, -T:], v[:, :, -T:])
    logits = _lin(model.norm(x[:, -T:]), model.lm_head.weight)
    return logits


@torch.no_grad()
def generate(model, prompt, max_new_tokens, use_cache=True, attention=tt.standard_attention):
    tokens = prompt
    if not use_cache:
        for _ in range(max_new_tokens):
            tokens = torch.cat([tokens, model(tokens, attention)[:, -1].argmax(-1, keepdim=True)], 1)
        return tokens
    cfg = model.config
    cache = KVCache(cfg.n_layers, prompt.shape[0], cfg.n_heads, prompt.shape[1] + max_new_tokens, cfg.head_dim,
                    dtype=model.tok_emb.weight.dtype)
    logits = forward_with_cache(model, prompt, cache)
    for step in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], 1)
        if step + 1 < max_new_tokens:
            logits = forward_with_cache(model, nxt, cache)
    return tokens
