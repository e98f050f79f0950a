"""Part 5 scenarios (run in the worker): drive the committed tiny model with the student's KV cache.

cached_logits, generate and cache_updates RECORD what the student's code does (tracing.Recorder, the
model's parameters named so that the judge substitutes its own copies); the judge replays the records
(autograder/engine/replay.py) and grades the replay's logits, tokens, FLOPs per call and storages.
Nothing measured here decides a point.
"""
from __future__ import annotations

from typing import Any

import torch

from course.tiny_transformer import TinyTransformer, load_checkpoint

from .tracing import Recorder

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


def _recorder(model: TinyTransformer, *inputs: torch.Tensor) -> Recorder:
    rec = Recorder()
    rec.inputs(*inputs)
    for name, p in model.named_parameters():
        rec.name(p, f"param:{name}")
    return rec


def cached_logits(student, tokens: torch.Tensor, chunks: list[int], dtype: str = "float32",
                  max_len: int | None = None) -> dict[str, Any]:
    """Feed tokens (B, T) to forward_with_cache in consecutive chunks of the given sizes (the first
    chunk is the prefill), recorded. The record's result: {"logits": [(B, c, V) per chunk],
    "lengths": [cache.length after each chunk]}; mark "call" at the start of each chunk's call."""
    kv = student.module("kv_cache")
    model = _model(dtype)
    total = sum(chunks)
    rec = _recorder(model, tokens)
    logits, lengths, start = [], [], 0
    with rec:
        cache = _new_cache(kv, model, tokens.shape[0], max_len or total, dtype)
        for c in chunks:
            rec.mark("call")
            logits.append(kv.forward_with_cache(model, tokens[:, start:start + c], cache))
            lengths.append(cache.length)
            start += c
        rec.mark("call")
    return rec.record({"logits": logits, "lengths": lengths})


def generate(student, batches: list[list[list[int]]], max_new_tokens: int, use_cache: bool = True,
             dtype: str = "float32") -> dict[str, Any]:
    """The student's greedy generate() on each batch of same-length prompts (one (B, T0) call per
    batch), the model in `dtype`, recorded as one program (inputs: the batches' token tensors; mark
    "call" at the start of each call and after the last). The record's result: the returned value of
    each call (a tensor, or None for anything else). The judge replays it and grades the replay's tokens."""
    kv = student.module("kv_cache")
    model = _model(dtype)
    xs = [torch.tensor(b, dtype=torch.long) for b in batches]
    rec = _recorder(model, *xs)
    results: list[Any] = []
    with rec:
        for x in xs:
            rec.mark("call")
            out = kv.generate(model, x, max_new_tokens, use_cache=use_cache)
            results.append(out if isinstance(out, torch.Tensor) else None)
        rec.mark("call")
    return rec.record(results)


def cache_updates(student, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int,
                  updates: list[tuple[int, torch.Tensor, torch.Tensor]], dtype: str = "float32") -> dict[str, Any]:
    """KVCache(...) and update(layer, k, v) for each update in order, recorded (inputs: the k, v of
    every update in order). The record's result: {"results": the returned (k_all, v_all) per update,
    "lengths": cache.length after each}. The judge tells views of one preallocated buffer from copies
    by the storages of its own replay."""
    kv = student.module("kv_cache")
    rec = Recorder()
    rec.inputs(*[t for _, k, v in updates for t in (k, v)])
    results, lengths = [], []
    with rec:
        cache = kv.KVCache(n_layers, batch, n_heads, max_len, head_dim, dtype=_DTYPES[dtype])
        for layer, k_new, v_new in updates:
            k_all, v_all = cache.update(layer, k_new, v_new)
            results.append((k_all, v_all))
            lengths.append(cache.length)
    return rec.record({"results": results, "lengths": lengths})


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
