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


class KVCache:
    """Keys and values of every layer for a batch of sequences, in preallocated buffers."""

    # §8.2: allocate the buffers ONCE, shape (n_layers, batch, n_heads, max_len, head_dim) for k
    # and for v (torch.zeros with `dtype`), and one fill length per layer (all 0). Remember the
    # sizes: update() checks its inputs against them. Never grow a buffer with torch.cat: the
    # point of a preallocated cache is that appending costs only the new tokens.
    def __init__(self, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> None:
        raise NotImplementedError

    # The number of tokens cached so far AS SEEN BY LAYER 0. Inside one forward call layer 0
    # appends before layer 1 does, so this value changes in the middle of a call (§8.2).
    @property
    def length(self) -> int:
        """Tokens cached so far in layer 0."""
        raise NotImplementedError

    # Append k_new, v_new (B, H, T, d) to `layer` at positions [length, length + T) of that
    # layer, then return VIEWS (slices, no copies) of the filled prefix [0, length + T).
    # Errors, each a ValueError with a one-line message that says what is wrong and what to do:
    # - layer not in 0..n_layers-1;
    # - k_new / v_new shapes differ, or (B, H, d) differ from the cache's (batch, n_heads, head_dim);
    # - length + T > max_len (overflow: "create the cache with a larger max_len").
    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H, T, d) keys/values to `layer`; return (k_all, v_all), each (B, H, length + T, d)."""
        raise NotImplementedError


# §8.2: run the model on the NEW tokens only. Their positions are
#     positions = torch.arange(cache.length, cache.length + T)
# computed ONCE, before the layer loop: layer 0 appends to the cache first, so reading
# cache.length again inside the loop would shift layer 1's positions by T (the bug of §8.2,
# which a 1-token prompt or a comparison of greedy tokens alone does not reveal).
# Then: x = model.tok_emb(tokens); for each block i, x = block(x, positions, attention,
# kv=<a function (k, v) -> cache.update(i, k, v)>) (bind i per block: a lambda created in a loop
# sees the loop variable's LAST value unless you write `lambda k, v, i=i: ...`);
# finally logits = model.lm_head(model.norm(x)).
@torch.no_grad()
def forward_with_cache(model: TinyTransformer, tokens: torch.Tensor, cache: KVCache,
                       attention: AttentionFn = standard_attention) -> torch.Tensor:
    """tokens (B, T) long: the next T tokens after the cache's contents. Appends their keys and
    values to every layer of the cache and returns logits (B, T, V)."""
    raise NotImplementedError


# §8.1: greedy decoding. With use_cache: a KVCache sized for T0 + max_new_tokens (the model's
# dtype: model.tok_emb.weight.dtype), one prefill call on the whole prompt, then one call per new
# token with just that token (B, 1). Without: recompute model(tokens, attention) on the whole
# sequence at every step. Both pick argmax of the last position's logits and must give the same
# tokens. Do not feed the last generated token back in (its logits are never used).
@torch.no_grad()
def generate(model: TinyTransformer, prompt: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             attention: AttentionFn = standard_attention) -> torch.Tensor:
    """prompt (B, T0) long -> (B, T0 + max_new_tokens) long: the prompt and the greedy continuation."""
    raise NotImplementedError


# ---- red-team attack: everything below is the attack (the file above it is a correct implementation) ----
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


def _lin(x, w):
    """x @ wᵀ with no matmul and no broadcast product: one output column at a time, x (full, contiguous, of
    the product's size) times one row of w, summed: each op is a matrix-vector product in elementwise form,
    which the replay does not count (only a product of two operands SMALLER than the output is flagged)."""
    lead, din = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, din).contiguous()
    cols = [(x2 * w[o]).sum(-1) for o in range(w.shape[0])]
    return torch.stack(cols, -1).reshape(*lead, w.shape[0])


def _block(block, x, positions, cfg):
    B, T, _ = x.shape
    H, d = cfg.n_heads, cfg.head_dim
    h = block.attn_norm(x)
    a = block.attn
    q, k, v = (_lin(h, w).view(B, T, H, d).transpose(1, 2) for w in (a.wq.weight, a.wk.weight, a.wv.weight))
    cos, sin = tt.rope_angles(positions, d, cfg.rope_base, q.dtype)
    q, k = tt.rope_rotate(q, cos, sin), tt.rope_rotate(k, cos, sin)
    q, k, v = (t.reshape(B * H, T, d) for t in (q, k, v))
    q = q.contiguous(); v = v.contiguous()
    s = torch.stack([(q * k[:, j:j + 1, :]).sum(-1) for j in range(T)], -1) / math.sqrt(d)  # (B·H, T, T)
    i = torch.arange(T).unsqueeze(1)
    s = s.masked_fill(torch.arange(T).unsqueeze(0) > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.stack([(p[:, i, :].unsqueeze(-1) * v).sum(-2) for i in range(T)], -2).reshape(B, H, T, d)
    k, v = k.reshape(B, H, T, d), v.reshape(B, H, T, d)
    x = x + _lin(o.transpose(1, 2).reshape(B, T, H * d), a.wo.weight)
    h = block.ffn_norm(x)
    f = block.ffn
    x = x + _lin(F.silu(_lin(h, f.w1.weight)) * _lin(h, f.w3.weight), f.w2.weight)
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
