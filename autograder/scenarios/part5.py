"""Part 5 scenarios (run in the worker): drive the committed tiny model with the student's KV cache.

cached_logits, generate and cache_updates RECORD what the student's code does (tracing.Recorder, the
model's parameters named so that the judge substitutes its own copies); the judge replays the records
(autograder/engine/replay.py) and grades the replay's logits, tokens, FLOPs per call and storages.
Nothing measured here decides a point.

The course model's own pieces that contain no student code are recorded as ONE op each on the tensors
they were called with (tracing.Recorder.trusted): "judge::embedding", "judge::rms_norm", "judge::swiglu",
"judge::linear" (lm_head), and in each attention block "judge::attention_heads" (the q, k, v projections
and RoPE, before the KV cache hook) and "judge::merge_heads" (the output projection, after the attention
call). The judge computes them with its own copy of the course function and counts their matmul FLOPs
from the shapes (autograder/tests/cases_part5.TRUSTED). Everything else stays recorded op by op: the
student's forward_with_cache and generate, KVCache.update, the attention call, the course code in
between (residual adds). A call whose arguments do not fit the judge's signature (another dtype or
shape) runs the course code op by op instead.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from course import tiny_transformer as tt
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


_FLOATS = (torch.float32, torch.float64)


def _floats(x: Any, *weights: torch.Tensor) -> bool:
    """x a plain tensor, and x and the module's weights (parameters) float32 or float64 of one dtype:
    what the judge's judge:: ops take."""
    return type(x) is torch.Tensor and x.dtype in _FLOATS and all(w.dtype == x.dtype for w in weights)


def _trusted_methods(m: nn.Module, ops: dict[str, Callable[..., Any]], cfg: Any) -> dict[str, Callable[..., Any]]:
    """Replacements for methods of the course module m that record it as one judge:: op when the
    arguments fit the judge's signature (the checks of cases_part5.TRUSTED's costs), else run m's own
    method (recorded op by op); {} for modules that hold no trusted piece."""
    if isinstance(m, tt.RMSNorm):
        def rms_norm(x: torch.Tensor) -> torch.Tensor:
            w = m.weight
            if _floats(x, w) and 1 <= x.dim() <= 4 and x.shape[-1] == w.shape[0]:
                return ops["rms_norm"](x, w)
            return tt.RMSNorm.forward(m, x)
        return {"forward": rms_norm}
    if isinstance(m, tt.SwiGLU):
        def swiglu(x: torch.Tensor) -> torch.Tensor:
            w1, w3, w2 = m.w1.weight, m.w3.weight, m.w2.weight
            if _floats(x, w1, w3, w2) and 1 <= x.dim() <= 4 and x.shape[-1] == w1.shape[1]:
                return ops["swiglu"](x, w1, w3, w2)
            return tt.SwiGLU.forward(m, x)
        return {"forward": swiglu}
    if isinstance(m, tt.Attention):  # its projections and RoPE, and its output projection: not the attention
        def heads(x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            ws = m.wq.weight, m.wk.weight, m.wv.weight
            if _floats(x, *ws) and x.dim() == 3 and all(w.shape == (cfg.d_model, cfg.d_model) for w in ws) \
                    and x.shape[-1] == cfg.d_model and _positions(positions, x.shape[1]):
                return ops["attention_heads"](x, positions, *ws)
            return tt.Attention.heads(m, x, positions)

        def merge(o: torch.Tensor, B: int, T: int) -> torch.Tensor:
            w = m.wo.weight
            if _floats(o, w) and tuple(o.shape) == (B, cfg.n_heads, T, cfg.head_dim) \
                    and w.shape == (cfg.d_model, cfg.d_model):
                return ops["merge_heads"](o, w)
            return tt.Attention.merge(m, o, B, T)
        return {"heads": heads, "merge": merge}
    if type(m) is nn.Linear and m.bias is None:
        def linear(x: torch.Tensor) -> torch.Tensor:
            w = m.weight
            if _floats(x, w) and 1 <= x.dim() <= 4 and x.shape[-1] == w.shape[1]:
                return ops["linear"](x, w)
            return nn.Linear.forward(m, x)
        return {"forward": linear}
    if type(m) is nn.Embedding and m.max_norm is None:
        def embedding(tokens: torch.Tensor) -> torch.Tensor:
            w = m.weight
            if type(tokens) is torch.Tensor and tokens.dtype == torch.long and 1 <= tokens.dim() <= 4 \
                    and w.dtype in _FLOATS:
                return ops["embedding"](tokens, w)
            return nn.Embedding.forward(m, tokens)
        return {"forward": embedding}
    return {}


def _positions(positions: Any, T: int) -> bool:
    return type(positions) is torch.Tensor and positions.dtype == torch.long and tuple(positions.shape) == (T,)


@contextmanager
def _course_ops_trusted(rec: Recorder, model: TinyTransformer) -> Iterator[None]:
    """During the block: model's trusted pieces (see the module docstring) record as judge:: ops of rec,
    through instance attributes of its modules (found before their class's methods); removed on exit."""
    cfg = model.config
    ops = {"rms_norm": rec.trusted("rms_norm", lambda x, w: tt.rms_norm(x, w, cfg.norm_eps)),
           "swiglu": rec.trusted("swiglu", tt.swiglu), "linear": rec.trusted("linear", F.linear),
           "embedding": rec.trusted("embedding", F.embedding),
           "attention_heads": rec.trusted("attention_heads", lambda x, p, wq, wk, wv: tt.attention_heads(
               x, p, wq, wk, wv, cfg.n_heads, cfg.rope_base)),
           "merge_heads": rec.trusted("merge_heads", tt.merge_heads)}
    patched: list[tuple[nn.Module, str]] = []
    for m in model.modules():
        for attr, method in _trusted_methods(m, ops, cfg).items():
            object.__setattr__(m, attr, method)
            patched.append((m, attr))
    try:
        yield
    finally:
        for m, attr in patched:
            m.__dict__.pop(attr, None)


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
    with _course_ops_trusted(rec, model), rec:
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
    with _course_ops_trusted(rec, model), rec:
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
                 prefill: tuple[torch.Tensor, torch.Tensor], bad_updates: dict[str, tuple[int, torch.Tensor, torch.Tensor]],
                 splits: dict[str, int], fits: dict[str, tuple[int, torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """For each named bad update: a fresh cache that gets prefill's tokens in every layer (prefill: k, v of
    shape (n_layers, B, H, T0, d)) in `splits[name]` updates per layer, then update(layer, k, v) that must
    raise, then the update fits[name] that fits and must not. Returns {name: {"raised": exception type name
    or None, "value_error": bool, "message": str(exception), "after": {"raised": ..., "message": ...,
    "value": what the fitting update returned}}}."""
    kv = student.module("kv_cache")
    out = {}
    k0, v0 = prefill
    for name, (layer, k_new, v_new) in bad_updates.items():
        cache = kv.KVCache(n_layers, batch, n_heads, max_len, head_dim)
        cuts = torch.linspace(0, k0.shape[3], splits[name] + 1).round().long().tolist()
        for a, b in zip(cuts, cuts[1:]):
            for i in range(n_layers):
                cache.update(i, k0[i, :, :, a:b].clone(), v0[i, :, :, a:b].clone())
        try:
            cache.update(layer, k_new, v_new)
        except Exception as exc:  # noqa: BLE001 -- the exception IS the result here
            out[name] = {"raised": type(exc).__name__, "value_error": isinstance(exc, ValueError),
                         "message": str(exc)}
        else:
            out[name] = {"raised": None, "value_error": False, "message": ""}
        fit_layer, k_fit, v_fit = fits[name]
        try:
            value = cache.update(fit_layer, k_fit, v_fit)
        except Exception as exc:  # noqa: BLE001 -- an error here is the result too
            out[name]["after"] = {"raised": type(exc).__name__, "message": str(exc), "value": None}
        else:
            if type(value) in (tuple, list):
                value = tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in value)
            out[name]["after"] = {"raised": None, "message": "", "value": value}
    return out
