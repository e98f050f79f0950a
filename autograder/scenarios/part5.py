"""Part 5 scenarios (run in the worker): drive the committed tiny model with the student's KV cache.

Every scenario returns plain data (tensors, ints, bools, strings, lists/dicts of them); the judge
recomputes every expected value itself with the course model WITHOUT a cache.
"""
from __future__ import annotations

from typing import Any

import torch

from course.tiny_transformer import TinyTransformer, load_checkpoint

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_MODELS: dict[str, TinyTransformer] = {}


def _model(dtype: str) -> TinyTransformer:
    """The committed checkpoint (loaded once per worker) in `dtype`."""
    if dtype not in _MODELS:
        _MODELS[dtype] = load_checkpoint().to(_DTYPES[dtype]).requires_grad_(False)
    return _MODELS[dtype]


def _new_cache(kv, model: TinyTransformer, batch: int, max_len: int, dtype: str):
    cfg = model.config
    return kv.KVCache(cfg.n_layers, batch, cfg.n_heads, max_len, cfg.head_dim, dtype=_DTYPES[dtype])


def cached_logits(student, tokens: torch.Tensor, chunks: list[int], dtype: str = "float32",
                  max_len: int | None = None) -> dict[str, Any]:
    """Feed tokens (B, T) to forward_with_cache in consecutive chunks of the given sizes (the first
    chunk is the prefill). Returns {"logits": [(B, c, V) per chunk], "lengths": [cache.length
    after each chunk]}."""
    kv = student.module("kv_cache")
    model = _model(dtype)
    total = sum(chunks)
    cache = _new_cache(kv, model, tokens.shape[0], max_len or total, dtype)
    logits, lengths, start = [], [], 0
    for c in chunks:
        logits.append(kv.forward_with_cache(model, tokens[:, start:start + c], cache))
        lengths.append(cache.length)
        start += c
    return {"logits": logits, "lengths": lengths}


def generate(student, prompts: list[list[int]], max_new_tokens: int, use_cache: bool = True,
             batched: bool = False, dtype: str = "float32") -> list[list[int]]:
    """The student's greedy generate() on each prompt (batch 1 each), or on all prompts at once as
    one (B, T0) batch when `batched` (then they must have the same length), with the model in
    `dtype`. Returns token lists."""
    kv = student.module("kv_cache")
    model = _model(dtype)
    groups = [prompts] if batched else [[p] for p in prompts]
    out: list[list[int]] = []
    for group in groups:
        result = kv.generate(model, torch.tensor(group, dtype=torch.long), max_new_tokens, use_cache=use_cache)
        if not isinstance(result, torch.Tensor):
            return result  # the judge reports the wrong type
        out.extend(result.tolist())
    return out


def cache_updates(student, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int,
                  updates: list[tuple[int, torch.Tensor, torch.Tensor]], dtype: str = "float32") -> dict[str, Any]:
    """KVCache(...) and update(layer, k, v) for each update in order. Returns the returned
    (k_all, v_all), cache.length after each update, and storage facts: whether each returned tensor
    lives in the storage its layer returned the first time (a preallocated buffer, not a fresh
    copy), and that storage's size in bytes."""
    kv = student.module("kv_cache")
    cache = kv.KVCache(n_layers, batch, n_heads, max_len, head_dim, dtype=_DTYPES[dtype])
    first_ptr: dict[tuple[int, str], int] = {}
    results, lengths, same_storage, storage_bytes = [], [], [], []
    for layer, k_new, v_new in updates:
        k_all, v_all = cache.update(layer, k_new, v_new)
        results.append((k_all, v_all))
        lengths.append(cache.length)
        same, size = [], []
        for name, t in (("k", k_all), ("v", v_all)):
            if not isinstance(t, torch.Tensor):
                same.append(False)
                size.append(0)
                continue
            ptr = t.untyped_storage().data_ptr()
            same.append(first_ptr.setdefault((layer, name), ptr) == ptr)
            size.append(t.untyped_storage().nbytes())
        same_storage.append(same)
        storage_bytes.append(size)
    return {"results": results, "lengths": lengths, "same_storage": same_storage, "storage_bytes": storage_bytes}


def cache_errors(student, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int,
                 prefill: int, bad_updates: dict[str, tuple[int, torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """For each named bad update: a fresh cache filled with `prefill` tokens in every layer, then
    update(layer, k, v) that must raise. Returns {name: {"raised": exception type name or None,
    "value_error": bool, "message": str(exception)}}."""
    kv = student.module("kv_cache")
    out = {}
    for name, (layer, k_new, v_new) in bad_updates.items():
        cache = kv.KVCache(n_layers, batch, n_heads, max_len, head_dim)
        for i in range(n_layers):
            cache.update(i, torch.zeros(batch, n_heads, prefill, head_dim), torch.zeros(batch, n_heads, prefill, head_dim))
        try:
            cache.update(layer, k_new, v_new)
        except Exception as exc:  # noqa: BLE001 -- the exception IS the result here
            out[name] = {"raised": type(exc).__name__, "value_error": isinstance(exc, ValueError),
                         "message": str(exc)}
        else:
            out[name] = {"raised": None, "value_error": False, "message": ""}
    return out
