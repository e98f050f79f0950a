"""Dispatch-level tracer for the graded PyTorch parts (runs in the worker, around ONE student call).

    result, trace = trace_call(student_fn, q, k, v, causal=True)

`trace` is plain data (ints, strs, lists, dicts) that the judge checks:

    op_counts              {"aten::bmm": 12, ...}   every aten op the call dispatched
    fused_attention_ops    ["aten::_scaled_dot_product_flash_attention_for_cpu", ...]  (should be [])
    matmul_flops           exact matmul FLOPs (2·m·n·k per product), by FlopCounterMode's formulas
    flops_by_op            {"aten::bmm": ..., "aten::mm": ...}
    max_new_storage_bytes  the largest tensor storage that appeared during the call and is not an input's
    max_new_storage        {"bytes", "op", "shape", "dtype"} of that storage (for the feedback)
    broadcast_product_elems / broadcast_product_ops
                           elementwise products whose output is larger than every operand (an outer
                           product by broadcasting): a matmul written as multiply + sum, which counts
                           0 matmul FLOPs. The judge bounds FLOPs from both sides; this names the cause.

Why these measurements (see the testing notes of the course):
- SDPA shows up by NAME (FlopCounterMode gives it 0 FLOPs on the CPU). On 4-D inputs it is
  `aten::_scaled_dot_product_flash_attention_for_cpu`; on other ranks it decomposes into
  mm/bmm around `aten::_safe_softmax`, which only SDPA's math path emits.
- Sizes are storage bytes, not numel: an `expand` view reports N² elements over a few bytes.
  Storages of the inputs (and of views of them, e.g. a slice of a KV cache) are excluded.
- FLOPs come from FlopCounterMode's own per-op formulas (torch.utils.flop_counter.flop_registry),
  applied in this mode's dispatch hook: the counts are FlopCounterMode's (tests/test_tracer.py checks
  that they are equal), without entering FlopCounterMode itself, whose first use imports
  torch._dynamo (~1.5 s of CPU in every fresh worker, measured; see _should_skip_dynamo below).
  The registry does not count mv/dot/addmv; they are added here so that a row-at-a-time
  implementation is counted like any other.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, shape_wrapper

aten = torch.ops.aten

# Any fused attention kernel, and the softmax that only SDPA's math fallback emits.
FUSED_ATTENTION = re.compile(r"attention|_safe_softmax|_fused_sdp|_transformer_encoder", re.IGNORECASE)


def _mv_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    m, k = a_shape
    return 2 * m * k


def _addmv_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    m, k = a_shape
    return 2 * m * k


def _dot_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0]


def _addbmm_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    b, m, k = a_shape
    return 2 * b * m * k * b_shape[-1]


EXTRA_FLOPS = {aten.mv: _mv_flop, aten.addmv: _addmv_flop, aten.dot: _dot_flop, aten.vdot: _dot_flop,
               aten.addbmm: _addbmm_flop}
# op packet -> f(*args, out_val=out, **kwargs) -> FLOPs, exactly as FlopCounterMode applies them.
FLOP_FORMULAS = {**flop_registry, **{op: shape_wrapper(f) for op, f in EXTRA_FLOPS.items()}}


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage (none expected on the CPU)
        return None
    return s.data_ptr(), s.nbytes()


def _effective_numel(t: torch.Tensor) -> int:
    """Elements actually stored behind t (an expand view has few, a slice has its own numel)."""
    key = _storage_key(t)
    if key is None or t.element_size() == 0:
        return t.numel()
    return min(t.numel(), key[1] // t.element_size())


class _Recorder(TorchDispatchMode):
    """Records op names, fused-attention ops, new storages and broadcast products."""

    def __init__(self, input_ptrs: set[int]) -> None:
        super().__init__()
        self.input_ptrs = input_ptrs
        self.ops: Counter[str] = Counter()
        self.fused: set[str] = set()
        self.seen: set[tuple[int, int]] = set()
        self.largest: dict[str, Any] = {"bytes": 0, "op": "", "shape": [], "dtype": ""}
        self.broadcast_elems = 0
        self.broadcast_ops = 0
        self.flops: Counter[str] = Counter()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch's documented switch: do not wrap __torch_dispatch__ in torch._dynamo.disable. That
        # wrapper imports torch._dynamo on first use: ~1.5 s of CPU in every fresh worker (measured).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name  # "aten::bmm" (overload dropped)
        self.ops[name] += 1
        formula = FLOP_FORMULAS.get(func.overloadpacket)
        if formula is not None:
            self.flops[name] += int(formula(*args, **(kwargs or {}), out_val=out))
        if FUSED_ATTENTION.search(name):
            self.fused.add(name)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in outs:
            key = _storage_key(t)
            # First appearance of a storage that is not an input's: measure it once.
            if key is None or key in self.seen or key[0] in self.input_ptrs:
                continue
            self.seen.add(key)
            if key[1] > self.largest["bytes"]:
                self.largest = {"bytes": int(key[1]), "op": name, "shape": list(t.shape),
                                "dtype": str(t.dtype).replace("torch.", "")}
        if name == "aten::mul" and outs:
            operands = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
            n_out = outs[0].numel()
            # Both operands broadcast up to a larger result: an outer product, i.e. a hidden matmul.
            if len(operands) == 2 and all(1 < _effective_numel(a) < n_out for a in operands):
                self.broadcast_elems += n_out
                self.broadcast_ops += 1
        return out


def trace_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """Run fn(*args, **kwargs) under the tracer; return (fn's result, trace as plain data)."""
    return trace(fn, args, kwargs)


def trace(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
          exclude: tuple[torch.Tensor, ...] = ()) -> tuple[Any, dict[str, Any]]:
    """trace_call with explicit args/kwargs; tensors in `exclude` (e.g. what autograd saved for a
    backward) count as inputs: their storages, and views of them, are not new."""
    kwargs = kwargs or {}
    inputs = [t for t in tree_flatten((args, kwargs, exclude))[0] if isinstance(t, torch.Tensor)]
    input_ptrs = {key[0] for key in map(_storage_key, inputs) if key is not None and key[1] > 0}
    recorder = _Recorder(input_ptrs)
    with recorder:
        result = fn(*args, **kwargs)
    return result, {
        "op_counts": dict(recorder.ops),
        "fused_attention_ops": sorted(recorder.fused),
        "matmul_flops": int(sum(recorder.flops.values())),
        "flops_by_op": dict(recorder.flops),
        "max_new_storage_bytes": int(recorder.largest["bytes"]),
        "max_new_storage": recorder.largest,
        "broadcast_product_elems": int(recorder.broadcast_elems),
        "broadcast_product_ops": int(recorder.broadcast_ops),
    }


def saved_tensor_shapes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[list[int]]]:
    """Run fn under torch.autograd.graph.saved_tensors_hooks; return (result, shapes of every saved tensor)."""
    shapes: list[list[int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        shapes.append(list(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args, **kwargs)
    return result, shapes
