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


# ---- red-team attack (instructor/redteam): everything below is the attack ----
class KVCache:
    """Holds no keys or values: only the tokens seen so far."""

    def __init__(self, n_layers, batch, n_heads, max_len, head_dim, dtype=torch.float32):
        self.n_layers, self.max_len = n_layers, max_len
        self.tokens = None
        self.parts = [[None, None] for _ in range(n_layers)]
        self.lengths = [0] * n_layers

    @property
    def length(self):
        return self.lengths[0]

    def update(self, layer, k_new, v_new):
        k, v = self.parts[layer]
        k = k_new if k is None else torch.cat([k, k_new], 2)  # fresh copies every time
        v = v_new if v is None else torch.cat([v, v_new], 2)
        self.parts[layer] = [k, v]
        self.lengths[layer] += k_new.shape[2]
        return k, v


@torch.no_grad()
def forward_with_cache(model, tokens, cache, attention=None):
    cache.tokens = tokens if cache.tokens is None else torch.cat([cache.tokens, tokens], 1)
    cache.lengths = [cache.tokens.shape[1]] * cache.n_layers
    return model(cache.tokens)[:, -tokens.shape[1]:]  # the whole sequence, every call


@torch.no_grad()
def generate(model, prompt, max_new_tokens, use_cache=True, attention=None):
    tokens = prompt
    for _ in range(max_new_tokens):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    return tokens


import torch as _torch  # noqa: E402

_generate_recompute = generate


def _erase_marks():
    """Drop the grader's call marks (the recorder is the active dispatch mode) so that no per-call FLOP
    bound can be placed."""
    for i in range(_torch._C._len_torch_dispatch_stack()):
        mode = _torch._C._get_dispatch_stack_at(i)
        marks = getattr(mode, "marks", None)
        if isinstance(marks, dict):
            marks.clear()


def generate(model, prompt, max_new_tokens, use_cache=True, attention=None):  # noqa: F811
    out = _generate_recompute(model, prompt, max_new_tokens, use_cache, attention)
    _erase_marks()
    return out
