"""Part 6 scenarios (run in the worker): split_kv's views, flash_decode with its segments, the tracer."""
from __future__ import annotations

from typing import Any

import torch

from .tracing import trace_call


def _shares_storage(seg: Any, whole: torch.Tensor) -> bool:
    return isinstance(seg, torch.Tensor) and seg.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()


def split(student, k, v, num_splits) -> dict[str, Any]:
    """split_kv(k, v, num_splits): the segments, and for each whether k_seg / v_seg share k's / v's storage."""
    segments = student.function("flash_decoding.split_kv")(k, v, num_splits)
    segments = list(segments) if isinstance(segments, (list, tuple)) else segments
    if not isinstance(segments, list) or not all(isinstance(s, (tuple, list)) and len(s) == 2 for s in segments):
        return {"segments": segments, "k_views": [], "v_views": []}  # the judge reports the wrong type
    return {
        "segments": [(ks, vs) for ks, vs in segments],
        "k_views": [_shares_storage(ks, k) for ks, _ in segments],
        "v_views": [_shares_storage(vs, v) for _, vs in segments],
    }


def decode(student, q, k, v, num_splits, scale=None) -> dict[str, Any]:
    """flash_decode(q, k, v, num_splits, scale) and the lengths of split_kv's segments (None if it fails),
    so that the judge can tell which wrong combine rule the output matches."""
    result = student.function("flash_decoding.flash_decode")(q, k, v, num_splits, scale=scale)
    try:
        lengths = [int(ks.shape[-2]) for ks, _ in student.function("flash_decoding.split_kv")(k, v, num_splits)]
    except Exception:  # noqa: BLE001 -- only used to word the hint
        lengths = None
    return {"result": result, "seg_lengths": lengths}


def trace_decode(student, q, k, v, num_splits, scale=None) -> dict[str, Any]:
    """flash_decode(...) traced: {"result", "trace"}."""
    fn = student.function("flash_decoding.flash_decode")
    result, trace = trace_call(fn, q, k, v, num_splits, scale=scale)
    return {"result": result, "trace": trace}
