"""Judge side of trace-and-replay: check a recorded program, bound it on meta tensors, replay it here.

The worker records what the student's code did as a program of aten ops (autograder/scenarios/
tracing.py). Nothing it measured is trusted. This module, in the judge:

1. validates the record's shape (plain data only; refs point to earlier tensors);
2. checks every op against an allow-list (no fused attention op under any name, no random, no
   I/O, no storage tricks) and the record against budgets: ops (and the op list's bytes and JSON
   values, counted before it is parsed), elements of constants, distinct data-carrying numbers;
3. bounds every op BEFORE it runs (`_preflight`): output size and FLOPs from the real shapes of its
   inputs (or on meta tensors for unusual ops), views from the record's stated shape, checked right
   after; a program above the bounds is refused, so a hostile record cannot exhaust the judge;
4. replays it on the judge's own input tensors and measures, in that replay: matmul FLOPs
   (torch.utils.flop_counter's formulas), the largest new storage, broadcast products (matmuls
   hidden as multiply + sum), the op counts; and returns the OUTPUT of the replay.

Graded values always come from step 4, so the value check and the structure check of a test judge
the same computation. The judge also replays the program a second time on inputs of its own
(same shapes and special values, finite values moved by up to 5 %: `perturbed`) and checks that this
"twin" computes the reference of THOSE inputs (loosely, check_twin): a program whose answer was
computed outside the recorded ops and came in through constants or scalars matches only the inputs
it was computed for.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, shape_wrapper

from autograder.engine import memory
from autograder.engine.protocol import json_values
from autograder.scenarios.tracing import INPLACE_VIEWS as _INPLACE_VIEWS

aten = torch.ops.aten

# ---------------------------------------------------------------------------------------------------
# what a graded program may contain

FUSED_ATTENTION = re.compile(r"attention|_safe_softmax|_fused_sdp|_transformer_encoder|_native_multi_head|sdp",
                             re.IGNORECASE)

# Elementwise, reductions, matmuls, views, creation and copies: what the solutions use plus what legal
# variants decompose into (einsum -> bmm/mm/permute, matmul -> mm/bmm/_unsafe_view, torch.where,
# masked_fill, casts, tensor_split, stack/cat...). No random, no I/O, no set_/resize_, no fused attention.
ALLOWED = frozenset("""
abs add addmm addbmm addcdiv addcmul addmv alias all amax amin any arange argmax argmin as_strided baddbmm
bitwise_and bitwise_not bitwise_or bitwise_xor bmm cat ceil clamp clamp_max clamp_min clone copy cos cumsum
detach div dot einsum empty empty_like empty_strided eq exp exp2 expand expand_copy expm1 fill fill_ floor
full full_like ge gt index index_put index_select isfinite isinf isnan isneginf isposinf le lift_fresh
lift_fresh_copy linspace log log1p log2 logical_and logical_not logical_or logical_xor lt masked_fill
masked_fill_ max maximum mean min minimum mm mul mv nan_to_num narrow ne neg new_empty new_empty_strided
new_full new_ones new_zeros ones ones_like permute pow prod reciprocal relu repeat reshape rsqrt
scalar_tensor select select_copy sigmoid sign silu sin slice slice_copy sqrt square squeeze stack sub sum
t transpose tril triu trunc unbind unsqueeze unsafe_split unsafe_split_with_sizes split split_with_sizes
tensor_split unfold view view_as _unsafe_view _to_copy _reshape_alias to where zero zeros zeros_like
_local_scalar_dense is_nonzero equal item embedding _softmax _log_softmax logsumexp std var rsub
sum_to_size vdot zero_ index_add index_copy scatter gather sort topk chunk flatten movedim
logaddexp logaddexp2 fmax fmin remainder floor_divide
""".split())
# Per part: ops a part may not use even though they are harmless elsewhere (a dense softmax in the
# tiled parts would be the very thing the part is about).
REFUSED_IN = {
    1: frozenset({"_softmax", "_log_softmax", "logsumexp"}),
    2: frozenset({"_softmax", "_log_softmax", "logsumexp"}),
    4: frozenset({"_softmax", "_log_softmax", "logsumexp"}),
}
EMPTY_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
# In-place view ops (the recorder writes the views as their out-of-place ops, tracing.INPLACE_VIEWS)
# and the storage swaps: never in a record.
INPLACE_VIEW_OPS = _INPLACE_VIEWS | {"resize_", "set_"}
SCALAR_OUT_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "item"})


@dataclass(frozen=True)
class Budget:
    """Bounds a record must meet before the judge replays it (all checked on the record or on meta)."""

    max_ops: int = 250_000  # a legal per-key online update (§4.3) at N = 512 runs ~130k ops
    max_constants: int = 60_000  # e.g. torch.tensor(-inf) in every tile: each a number (max_scalars)
    max_constant_elements: int = 64  # in constants of more than one element: never an answer
    max_scalars: int = 64  # distinct data-carrying scalar values (Scalar-typed args)
    max_tensor_bytes: int = 512 << 20  # one tensor
    max_total_bytes: int = 4 << 30  # all new tensors together (meta)
    max_flops: int = 20 * 10**9
    # Work the replay does that the bounds above do not see: elements read (a one-number op such as
    # equal, or a view-sized op, over a huge expanded view) and written by all ops together (the
    # solutions' largest call touches ~1e8: 5 %). A wall-clock bound per pass backs it for ops whose
    # cost is not linear in their elements (the solutions' longest main pass: under 0.5 s).
    max_elements_touched: int = 2 * 10**9
    max_replay_s: float = 60.0


DEFAULT_BUDGET = Budget()


class ReplayRefused(Exception):
    """The record breaks a rule (an op not allowed, a budget, a malformed record): one clear line."""

    def __init__(self, message: str, kind: str = "refused") -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------------------------------
# trusted ops: course functions that contain no student code, computed by the judge itself


@dataclass(frozen=True)
class TrustedOp:
    """The judge's own function for the record's "judge::name" ops (scenarios/tracing.Recorder.trusted).

    The worker only says WHICH course function ran on WHICH tensors of the program; the judge runs its
    own `fn` on its own copies of those tensors, so the op computes the course's function of its
    arguments and nothing else: a deterministic function of tensors that are bounded like every other
    (inputs, named weights, constants, earlier outputs), with no scalar or other argument that could
    carry data in. `cost(args)` is called BEFORE the op runs: it checks the arguments against the
    function's signature (exact count, dtypes, dims, matching sizes; raises ReplayRefused) and returns
    (the bytes of the op's outputs and temporaries, one entry per tensor, and its matmul FLOPs), from
    shapes alone. Those FLOPs count in the replay like a recorded matmul's: a program that recomputes
    through trusted ops pays for it."""

    fn: Callable[..., Any]
    cost: Callable[[list], tuple[list[int], int]]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def trusted_tensors(name: str, args: list, n: int) -> list[torch.Tensor]:
    """A trusted op's arguments when they are exactly n tensors (for a TrustedOp's cost), else ReplayRefused."""
    if len(args) != n or any(type(a) is not torch.Tensor for a in args):
        raise ReplayRefused(f"the record's judge::{name} does not take its {n} tensor arguments", "malformed")
    return list(args)


# ---------------------------------------------------------------------------------------------------
# FLOP formulas: FlopCounterMode's own registry, plus mv/dot/addmv/addbmm that it does not count


def _mv_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1]


def _addmv_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1]


def _dot_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0]


def _addbmm_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    b, m, k = a_shape
    return 2 * b * m * k * b_shape[-1]


EXTRA_FLOPS = {aten.mv: _mv_flop, aten.addmv: _addmv_flop, aten.dot: _dot_flop, aten.vdot: _dot_flop,
               aten.addbmm: _addbmm_flop}
FLOP_FORMULAS = {**flop_registry, **{op: shape_wrapper(f) for op, f in EXTRA_FLOPS.items()}}


# ---------------------------------------------------------------------------------------------------
# the replay's measurements


@dataclass
class Replayed:
    """What the judge measured in its own replay, and the replay's result."""

    result: Any
    ops: int
    op_counts: dict[str, int]
    matmul_flops: int
    flops_by_op: dict[str, int]
    flops_at: list[int]  # cumulative matmul FLOPs before each op (for marks)
    max_new_storage_bytes: int
    max_new_storage: dict[str, Any]
    broadcast_product_elems: int
    broadcast_product_ops: int
    constants: int
    constant_elements: int
    upcasts: int  # ops that turned float32 data into float64 (a float64 copy: e.g. a float64 reference)
    elements_touched: int | None = None  # tensor elements the ops read and wrote (bounded: Budget)
    marks: dict[str, list[int]] = field(default_factory=dict)
    inputs: list[torch.Tensor] = field(default_factory=list, repr=False)  # the replay's own input tensors
    twin: "Twin | None" = field(default=None, repr=False)  # the same program on judge-drawn inputs
    twin_args: tuple = field(default=((), {}), repr=False)  # those inputs (args, kwargs)
    env: dict[int, Any] = field(default_factory=dict, repr=False)
    producer: dict[int, int] = field(default_factory=dict, repr=False)  # ref -> op index that made it
    readers: dict[int, list[int]] = field(default_factory=dict, repr=False)  # ref -> op indices reading it
    new_storage_of: dict[int, int] = field(default_factory=dict, repr=False)  # ref -> bytes of its new storage
    prepared: list = field(default_factory=list, repr=False)  # the checked ops (for the twin)
    shapes: list = field(default_factory=list, repr=False)  # per op: its output's shape(s), for the twin
    # cumulative, before each op (like flops_at): the elementwise work no matmul count sees: 2 per output
    # element of the floating elementwise ops (OUTER_OPS) with two or more operands of several values each
    # (not counted as matmul FLOPs), and 2 per input element of the floating reductions
    pairwise_at: list[int] = field(default_factory=list, repr=False)
    # what the judge's analyses work out once from this replay's final tensors and share between them (e.g.
    # cases_part2.side_flow); kept per Replayed, never shared between records
    analyses: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def flops_between(self, start: int, end: int | None = None) -> int:
        """Matmul FLOPs of ops [start, end)."""
        end = len(self.flops_at) - 1 if end is None else end
        return self.flops_at[end] - self.flops_at[start]

    def pairwise_between(self, start: int, end: int | None = None) -> int:
        """The elementwise work of ops [start, end) (`pairwise_at`: elementwise ops that combine two tensors
        of data, reductions, indexed accumulations): work no matmul count sees (a matmul written as a
        multiply and a sum, column by column, as a stack reduced by prod, or as scatter and index_add,
        pays here)."""
        if not self.pairwise_at:
            return 0
        end = len(self.pairwise_at) - 1 if end is None else end
        return self.pairwise_at[end] - self.pairwise_at[start]

    def new_storage_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the tensors that first showed each new storage (inputs' storages excluded)."""
        return [tuple(self.env[ref].shape) for ref in self.new_storage_of if isinstance(self.env.get(ref), torch.Tensor)]

    def kept_for_backward(self, mark: str = "backward") -> list[torch.Tensor]:
        """Tensors made before the first op at `mark` (not the inputs) that an op after it reads:
        what a forward kept for its backward (saved tensors, ctx attributes, closures alike)."""
        at = self.marks.get(mark, [None])[0]
        if at is None:
            return []
        n_in = len(self.inputs)
        return [self.env[ref] for ref, readers in self.readers.items()
                if ref >= n_in and self.producer.get(ref, at) < at and any(i >= at for i in readers)
                and isinstance(self.env.get(ref), torch.Tensor)]

    def as_trace(self) -> dict[str, Any]:
        """The measurements in the dict shape the checks of parts 2, 4 and 6 read."""
        return {"op_counts": dict(self.op_counts), "fused_attention_ops": [], "matmul_flops": self.matmul_flops,
                "flops_by_op": dict(self.flops_by_op), "max_new_storage_bytes": self.max_new_storage_bytes,
                "max_new_storage": dict(self.max_new_storage),
                "broadcast_product_elems": self.broadcast_product_elems,
                "broadcast_product_ops": self.broadcast_product_ops}


@dataclass
class Twin:
    """The twin replay: the same program on judge-drawn inputs; only its result is used (check_twin)."""

    result: Any


# ---------------------------------------------------------------------------------------------------
# decoding the record


_RESOLVED: dict[tuple[str, int | None], Any] = {}


def _resolve(name: str, part: int | None) -> Any:
    key = (name, part)
    if type(name) is str and key in _RESOLVED:
        return _RESOLVED[key]
    func = _resolve_uncached(name, part)
    _RESOLVED[key] = func
    return func


def _resolve_uncached(name: str, part: int | None) -> Any:
    if type(name) is not str or not re.fullmatch(r"aten::[A-Za-z0-9_]+\.[A-Za-z0-9_]+", name):
        raise ReplayRefused(f"the record names an op {str(name)[:60]!r} that is not an aten op", "malformed")
    base, overload = name[len("aten::"):].split(".")
    if FUSED_ATTENTION.search(base):
        raise ReplayRefused(f"the call used the fused attention op aten::{base}: compute the tiles yourself with "
                            "torch matmuls", "fused")
    if base in INPLACE_VIEW_OPS:
        raise ReplayRefused(f"the call used aten::{base} (an in-place view op): use the out-of-place {base[:-1]}",
                            "op")
    plain = base[:-1] if base.endswith("_") and not base.endswith("__") else base  # in-place variants too
    refused = REFUSED_IN.get(part or 0, frozenset())
    if plain not in ALLOWED or plain in refused:
        why = " (this part asks you to write it yourself)" if plain in refused else ""
        raise ReplayRefused(f"the call used aten::{base}, which graded code may not use{why}", "op")
    try:
        func = getattr(getattr(aten, base), overload)
    except AttributeError:
        raise ReplayRefused(f"the record names an unknown op {name!r}", "malformed") from None
    if decomposed_before_dispatch(func):
        raise ReplayRefused(f"the record names aten::{base}.{overload}, which torch decomposes into other ops before "
                            "any op is recorded: the record was not made by the recorder", "malformed")
    return func



def _is_ref(x: Any) -> bool:
    return type(x) is list and len(x) in (2, 5) and x[0] == "$t"


# Ops whose outputs are views (no new memory): the meta pass takes their shapes from the record's
# claim (bounded like any tensor), and the real pass checks the claim before anything reads them.
# The recorder states that claim for exactly these ops (and any whose schema returns an alias).
from autograder.scenarios.tracing import _PLAIN, VIEW_OPS, decomposed_before_dispatch, paused_gc  # noqa: E402 -- one definition of the record format


def _claims(out: Any) -> list[tuple[list[int], list[int], str] | None]:
    """The recorded (shape, strides, dtype) of each tensor leaf of an op's output (None if absent)."""
    if _is_ref(out):
        if len(out) == 5 and type(out[2]) is list and type(out[3]) is list and out[4] in _DTYPES \
                and len(out[2]) == len(out[3]) <= 16 and all(type(i) is int for i in out[2] + out[3]):
            return [(out[2], out[3], out[4])]
        return [None]
    if type(out) in (list, tuple):
        return [c for i in out for c in _claims(i)]
    return []


def _view_claims(out: Any) -> list[tuple[tuple[int, ...], tuple[int, ...], str, int, bool] | None]:
    """A view op's claims (_claims) as the passes use them, worked out once per op: (shape, strides, dtype,
    the shape's product, whether a size is negative), or None where the record states none."""
    return [None if c is None else (tuple(c[0]), tuple(c[1]), c[2], math.prod(c[0]), any(x < 0 for x in c[0]))
            for c in _claims(out)]


_DTYPES = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}
_DTYPE_NAME = {getattr(torch, n): n for n in _DTYPES}  # the names the record claims dtypes by


def _dec(x: Any, env: dict[int, Any]) -> Any:
    if type(x) is list:
        if (len(x) == 2 or (len(x) == 5 and x[0] == "$t")) and type(x[0]) is str and x[0].startswith("$"):
            tag, body = x[0], x[1]
            if tag == "$t":
                if type(body) is not int or body not in env:
                    raise ReplayRefused("the record uses a tensor before any op produced it", "malformed")
                return env[body]
            if tag == "$dev":
                if body != "cpu":
                    raise ReplayRefused(f"the record uses the device {str(body)[:20]!r}; graded code runs on the CPU",
                                        "malformed")
                return torch.device("cpu")
            if tag == "$lay" and body == "strided":
                return torch.strided
            if tag == "$mf" and body in ("contiguous_format", "preserve_format", "channels_last"):
                return getattr(torch, body)
            if tag == "$dt" and body in _DTYPES:
                return getattr(torch, body)
            if tag == "$dt" and type(body) is str:  # a dtype the judge has no tensors of: say which
                raise ReplayRefused(f"the call used the dtype {body[:20]}; graded code computes with floating, integer "
                                    f"and bool tensors only", "malformed")
            if tag == "$unknown" and type(body) is str:  # what the recorder could not encode: say what it was
                raise ReplayRefused(f"the call passed or returned a {body[:40]}, which is not a tensor, a number, a "
                                    f"string, None or a list, tuple or dict of them", "malformed")
            raise ReplayRefused(f"the record holds a value the judge cannot rebuild ({str(tag)[:20]})", "malformed")
        return [_dec(i, env) for i in x]
    if type(x) is tuple:
        return tuple(_dec(i, env) for i in x)
    if type(x) is dict:
        return {k: _dec(v, env) for k, v in x.items()}
    if x is None or type(x) in (bool, int, float, str) or isinstance(x, torch.dtype):
        return x
    raise ReplayRefused(f"the record holds a value of type {type(x).__name__}", "malformed")


def _out_refs(x: Any) -> list[Any]:
    """Flatten a recorded output into its leaves: ref ints for tensors, plain values otherwise."""
    if _is_ref(x):
        if type(x[1]) is not int or x[1] < 0:
            raise ReplayRefused("the record numbers a tensor wrongly", "malformed")
        return [x[1]]
    if type(x) in (list, tuple):
        return [leaf for i in x for leaf in _out_refs(i)]
    return [("scalar", x)]


def _scalar_args(info: "_Info", args: list, kwargs: dict) -> list[Any]:
    """Values of the op's Scalar-typed arguments (the ones that can carry data into a tensor)."""
    out = []
    for i, name in info.scalar_positions:
        value = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(value)
    return out


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return s.data_ptr(), s.nbytes()


def _effective_numel(t: torch.Tensor) -> int:
    """How many distinct elements t holds: its extent over the dims it does not broadcast (stride 0:
    an expand), at most what its storage has room for."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    n = min(n, t.numel())
    try:  # (what _storage_key reads, without its data pointer: this runs for most operands of most ops)
        nbytes = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return n
    size = t.element_size()
    return min(n, nbytes // size) if size else n


# Ops whose output holds no more distinct values than one source operand (the first tensor argument;
# copy_'s second): a materialised expand is still the few values it was expanded from.
SAME_VALUES = frozenset("clone contiguous _to_copy to copy expand_copy repeat index_select index gather lift_fresh "
                        "lift_fresh_copy detach alias unfold select_copy slice_copy _unsafe_view reshape flatten "
                        "narrow".split())


def _carried(t: torch.Tensor, ref: int, carries: dict[int, tuple[int, int]]) -> int:
    """How many distinct values t holds at most: its own extent (_effective_numel), or less when the
    replay followed it back to fewer (`carries`: ref -> (bound, t._version when it was set); an
    in-place write since, through any view, bumps the version and voids the bound)."""
    e = _effective_numel(t)
    c = carries.get(ref)
    if c is not None and c[0] < e and c[1] == t._version:
        return c[0]
    return e


def _carries_bound(info: "_Info", a: list, slots: list, carries: dict) -> int | None:
    """A bound on the distinct values of a one-tensor result, from its operands', or None (no bound
    beyond its size): SAME_VALUES ops and views keep their source's; elementwise ops hold at most
    the product of (distinct values + 1) of their tensor operands (the +1: a scalar they mix in)."""
    if not slots:
        return None
    carry = info.carry
    if carry == "view":  # a view's own strides say what it holds (an expand: stride 0); carry a bound on
        i, ref = slots[0]
        return _carried(a[i], ref, carries) if ref in carries else None
    if carry == "copy":  # a copy's strides say nothing of where its values came from
        i, ref = slots[1] if info.short.startswith("copy") and len(slots) > 1 else slots[0]
        return _carried(a[i], ref, carries)
    if carry == "elementwise" and any(ref in carries for _, ref in slots):  # else: no bound below its size
        bound = 1
        for i, ref in slots:
            bound *= _carried(a[i], ref, carries) + 1
        return bound
    return None


# Elementwise arithmetic that can form an outer product of two operands: each output element
# combines one element of each (a matmul written as one of these + a sum; a / (1 / b) is a * b).
OUTER_OPS = frozenset("mul div add sub rsub addcmul addcdiv pow maximum minimum atan2 hypot logaddexp logaddexp2 fmax "
                      "fmin remainder floor_divide".split())


# ---------------------------------------------------------------------------------------------------
# the replay


def _op_text(ops: Any, budget: Budget) -> list:
    """The record's op list: JSON text in a uint8 tensor (scenarios/tracing.Recorder.record), a str, or a list."""
    if type(ops) is torch.Tensor and ops.dtype == torch.uint8 and ops.dim() == 1:
        if ops.numel() > 64 * budget.max_ops + 1000:
            raise ReplayRefused(f"the record is too long ({ops.numel():,} bytes)", "budget")
        ops = ops.numpy().tobytes()
    elif type(ops) is str and len(ops) > 64 * budget.max_ops + 1000:
        raise ReplayRefused(f"the record is too long ({len(ops):,} characters)", "budget")
    if type(ops) in (str, bytes):
        # json.loads makes up to ~50 bytes of objects per byte of nested brackets: the values are
        # bounded too (a recorded op is ~20 of them, at most ~35), before anything is parsed
        raw = ops.encode() if type(ops) is str else ops
        if json_values(raw) > 32 * budget.max_ops + 1000:
            raise ReplayRefused(f"the record's op list holds more than {32 * budget.max_ops + 1000:,} values", "budget")
        try:
            ops = json.loads(ops)
        except (ValueError, RecursionError):
            raise ReplayRefused("the record's op list is not valid JSON", "malformed") from None
    if type(ops) is not list:
        raise ReplayRefused("the record's op list is malformed", "malformed")
    return ops


def check_record(record: Any, n_inputs: int, part: int | None, budget: Budget) -> list["_Op"]:
    """Validate the record, resolve its ops and prepare them for the passes; raises ReplayRefused."""
    if type(record) is not dict or not {"inputs", "ops", "constants", "result"} <= set(record):
        raise ReplayRefused("the call returned no record of its ops", "malformed")
    if record["inputs"] != n_inputs:
        raise ReplayRefused("the record does not number the inputs the judge sent", "malformed")
    ops = _op_text(record["ops"], budget)
    if len(ops) > budget.max_ops:
        raise ReplayRefused(f"the call ran {len(ops):,} torch ops; the bound is {budget.max_ops:,}", "budget")
    consts = record["constants"]
    if type(consts) is not list or len(consts) > budget.max_constants:
        raise ReplayRefused(f"{len(consts) if type(consts) is list else '?'} tensors entered the call from outside "
                            f"its inputs and its own ops (at most {budget.max_constants:,})", "constants")
    elems = 0
    scalars: set[float] = set()
    for c in consts:
        if type(c) is not list or len(c) != 2 or type(c[0]) is not int or type(c[1]) is not torch.Tensor:
            raise ReplayRefused("a constant of the record is not a plain tensor", "constants")
        if c[1].dtype not in _DTYPE_NAME:
            _refuse_dtype(c[1].dtype)
        if c[1].numel() <= 1:  # torch.tensor(-inf) and friends: a number, counted with the numbers below
            scalars.update(float(x) for x in c[1].double().reshape(-1).tolist())
        else:
            elems += c[1].numel()
    if elems > budget.max_constant_elements:
        raise ReplayRefused(f"tensors that did not come from the inputs hold {elems:,} elements (at most "
                            f"{budget.max_constant_elements}): compute from the inputs with torch ops, do not bring "
                            "values in from outside the call", "constants")
    prepared = []
    infos: dict[str, _Info] = {}  # the ops this record names so far, resolved (for this part)
    for entry in ops:
        if type(entry) is not list or len(entry) != 4 or type(entry[2]) is not dict:
            raise ReplayRefused("an op of the record is malformed", "malformed")
        name, args, kwargs, out = entry
        info = infos.get(name) if type(name) is str else None
        if info is None:
            if type(name) is str and name.startswith("judge::"):
                prepared.append(_Op(_judge_info(name), args, kwargs, out))
                continue
            info = _info(_resolve(name, part))
            if type(name) is str:
                infos[name] = info
        # The dispatcher hands an op its arguments as its schema orders them: the positional ones in
        # args, only keyword-only ones in kwargs. A record that moves an operand into kwargs was not
        # made by the recorder (and every rule that reads operands reads them where a recording has them).
        if type(args) is not list or len(args) > info.n_positional or not kwargs.keys() <= info.kwarg_only:
            raise ReplayRefused(f"the record passes {info.name}'s arguments in a way no recording does", "malformed")
        op = _Op(info, args, kwargs, out)
        prepared.append(op)
        if info.scalar_positions and type(args) is list:
            scalars.update(float(x) for x in _scalar_args(info, args, kwargs))
    if len(scalars) > budget.max_scalars:
        raise ReplayRefused(f"the call passes {len(scalars)} different numbers into tensors (at most "
                            f"{budget.max_scalars}): compute values from the inputs with torch ops", "scalars")
    return prepared


def replay(record: Any, inputs: list[torch.Tensor], *, part: int | None = None, budget: Budget = DEFAULT_BUDGET,
           named: dict[str, torch.Tensor] | None = None,
           trusted: dict[str, Callable[..., Any]] | None = None) -> Replayed:
    """Check, bound (on meta) and replay `record` on the judge's `inputs`; see the module docstring.

    named: tensors the judge owns (record's "named" refs); trusted: "judge::name" -> the judge's function."""
    ops = check_record(record, len(inputs), part, budget)
    return _real_pass(ops, _base(record, inputs, named or {}), record, {ref for ref, _ in record["constants"]},
                      trusted or {}, budget=budget)


def _base(record: dict, inputs: list[torch.Tensor], named: dict[str, torch.Tensor]) -> dict[int, Any]:
    """ref -> tensor before the first op: the inputs, the judge's named tensors, the constants."""
    base: dict[int, Any] = {i: t for i, t in enumerate(inputs)}
    for entry in record.get("named") or []:
        if type(entry) is not list or len(entry) != 2 or entry[1] not in named or type(entry[0]) is not int:
            raise ReplayRefused("the record names a tensor the judge does not know", "malformed")
        base[entry[0]] = named[entry[1]]
    base.update({ref: t for ref, t in record["constants"]})
    return base


# Cheap bounds of an op's output, from the real shapes of its (already bounded) inputs, checked BEFORE
# the op runs in the replay. Ops not classified here are run on meta tensors first (cached).
ELEMENTWISE = frozenset("""abs add addcdiv addcmul bitwise_and bitwise_not bitwise_or bitwise_xor ceil clamp clamp_max
logaddexp logaddexp2 fmax fmin remainder floor_divide
clamp_min clone copy cos div eq exp exp2 expm1 fill floor ge gt isfinite isinf isnan isneginf isposinf le log log1p
log2 logical_and logical_not logical_or logical_xor lt masked_fill maximum minimum mul nan_to_num ne neg pow
reciprocal relu rsqrt rsub sigmoid sign silu sin sqrt square sub trunc where zero _to_copy lift_fresh
lift_fresh_copy to tril triu detach""".split())
REDUCTIONS = frozenset("all amax amin any argmax argmin logsumexp max mean min prod std sum var cumsum _softmax "
                       "_log_softmax".split())
LIKE = frozenset("empty_like full_like ones_like zeros_like".split())
SIZED = frozenset("empty full new_empty new_full new_ones new_zeros ones zeros empty_strided new_empty_strided".split())


_SHAPE_ONLY = frozenset({"like", "sized", "arange"})  # _KINDS whose values come from numbers, not from tensors


def _refuse_dtype(dtype: torch.dtype) -> None:
    raise ReplayRefused(f"the call makes a {str(dtype).replace('torch.', '')} tensor; graded code computes in the "
                        f"floating, integer and bool dtypes ({', '.join(sorted(_DTYPES))})", "dtype")


def _tensor_numel(args: list, kwargs: dict) -> int:
    """Elements of the tensors among an op's arguments (a list argument's too: cat, stack, index)."""
    n = 0
    for x in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(x, torch.Tensor):
            n += x.numel()
        elif type(x) in (list, tuple):
            n += sum(t.numel() for t in x if isinstance(t, torch.Tensor))
    return n


def _broadcast_numel(shapes: list) -> int:
    """Elements of the broadcast of these shapes (an upper bound if they do not broadcast: the op fails)."""
    if not shapes:
        return 1
    if len(shapes) == 1:
        return math.prod(shapes[0])
    rank = max(map(len, shapes))
    n = 1
    # the largest size of every dim, counted from the right (a shape without that dim adds a 0: sizes are >= 0)
    for sizes in zip(*[(0,) * (rank - len(s)) + tuple(s) for s in shapes]):
        n *= max(sizes)
    return n


def _bound_out(info: "_Info", a: list, kw: dict) -> tuple[int, int] | None:
    """(elements of the op's output, matmul FLOPs) computed from its real inputs' shapes, or None when
    this op is not one of the cheap kinds (then the meta pass decides)."""
    kind = info.kind
    tensors = [x for x in a if isinstance(x, torch.Tensor)]
    if kw:
        tensors += [x for x in kw.values() if isinstance(x, torch.Tensor)]
    if kind == "elementwise":
        if len(tensors) == 1 or all(t.shape == tensors[0].shape for t in tensors[1:]):
            return (tensors[0].numel() if tensors else 1), 0
        return _broadcast_numel([t.shape for t in tensors]), 0
    if kind in ("reduction", "reshape") and tensors:
        return tensors[0].numel(), 0
    if kind == "cat" and a and type(a[0]) in (list, tuple):
        return sum(t.numel() for t in a[0] if isinstance(t, torch.Tensor)), 0
    if kind == "embedding" and len(tensors) >= 2:
        return tensors[1].numel() * tensors[0].shape[-1], 0
    short = info.short[:-1] if info.short.endswith("_") else info.short
    if kind == "arange":
        nums = [x for x in a if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if 1 <= len(nums) <= 3 and all(math.isfinite(x) for x in nums):
            start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) == 3 else 1)
            return (max(0, math.ceil((end - start) / step)) if step else 0), 0
    if kind == "like" and tensors:
        return tensors[0].numel(), 0
    if kind == "sized":
        size = kw.get("size", a[1] if short.startswith("new_") and len(a) > 1 else a[0] if a else None)
        if type(size) in (list, tuple) and all(type(i) is int and i >= 0 for i in size):
            return math.prod(size), 0
        return None
    if kind == "matmul":
        mats = tensors[-2:]
        if len(mats) == 2 and all(t.dim() in (1, 2, 3) for t in mats):
            x, y = mats
            if short in ("dot", "vdot"):
                return 1, 2 * x.numel()
            lead = x.shape[0] if x.dim() == 3 else 1
            rows = x.shape[-2] if x.dim() >= 2 else 1
            inner = x.shape[-1]
            cols = y.shape[-1] if y.dim() >= 2 else 1
            return lead * rows * cols, 2 * lead * rows * cols * inner
    return None


def _meta_key(func: Any, a: list, kw: dict) -> Any:
    """What decides an op's output shapes: the op, its tensors' shapes/strides/dtypes, its other args."""
    def k(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.stride(), x.dtype, x._is_view())
        if type(x) in (list, tuple):
            return tuple(k(i) for i in x)
        return x if not isinstance(x, float) or not math.isnan(x) else "nan"
    return func, k(a), tuple(sorted((n, k(v)) for n, v in kw.items()))


@dataclass(frozen=True)
class _Info:
    """What the passes need to know about one op overload, worked out once per overload."""

    func: Any
    name: str  # schema name, e.g. "aten::mul": the key of op_counts and flops_by_op
    short: str  # "mul", "mul_"
    kind: str | None  # how _bound_out bounds it from its inputs' shapes; None: on meta tensors
    view: bool
    formula: Any  # FLOP formula (torch.utils.flop_counter), or None
    scalar_positions: tuple[tuple[int, str], ...]  # the Scalar-typed arguments
    has_device: bool
    empty: bool  # uninitialised output (zeroed in the replay)
    scalar_out: bool  # returns a Python number (.item() and friends)
    trusted: str | None = None  # "judge::name" ops: the judge's own function `name`
    call: Any = None  # what runs the op: the overload's C++ callable (its __call__ without the Python frame)
    outer: bool = False  # elementwise arithmetic that can form an outer product (OUTER_OPS)
    carry: str | None = None  # how a bound on its result's distinct values follows (_carries_bound)
    n_positional: int = 0  # arguments the dispatcher passes positionally (a recorder sees them in args)
    kwarg_only: frozenset = frozenset()  # the keyword-only ones (the only ones it sees in kwargs)


_KINDS = {**{n: "elementwise" for n in ELEMENTWISE}, **{n: "reduction" for n in REDUCTIONS},
          **{n: "reshape" for n in ("_unsafe_view", "reshape", "flatten", "contiguous")},
          "cat": "cat", "stack": "cat", "embedding": "embedding", "arange": "arange",
          **{n: "like" for n in LIKE}, **{n: "sized" for n in SIZED},
          **{n: "matmul" for n in ("mm", "bmm", "addmm", "baddbmm", "mv", "dot", "vdot", "addmv", "addbmm")}}
_INFOS: dict[Any, _Info] = {}


def _info(func: Any) -> _Info:
    info = _INFOS.get(func)
    if info is None:
        name = func._schema.name
        short = name.split("::")[1]
        plain = short[:-1] if short.endswith("_") else short
        positions = tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)  # Scalar, float, float?
                          if any(w in str(arg.type) for w in ("number", "Scalar", "float")))
        info = _INFOS[func] = _Info(
            func, name, short, _KINDS.get(plain), short in VIEW_OPS, _flop_formula(func, plain), positions,
            any(arg.name == "device" for arg in func._schema.arguments), short in EMPTY_OPS, short in SCALAR_OUT_OPS,
            call=getattr(func, "_op", func), outer=plain in OUTER_OPS,
            carry="view" if short in VIEW_OPS else "copy" if plain in SAME_VALUES else
                  "elementwise" if _KINDS.get(plain) == "elementwise" else None,
            n_positional=sum(not arg.kwarg_only for arg in func._schema.arguments),
            kwarg_only=frozenset(arg.name for arg in func._schema.arguments if arg.kwarg_only))
    return info


def _flop_formula(func: Any, plain: str) -> Any:
    """FLOP formula of an overload; an in-place matmul (baddbmm_, addmm_) counts as its out-of-place one."""
    formula = FLOP_FORMULAS.get(func.overloadpacket)
    if formula is None and plain != func._schema.name.split("::")[1]:
        formula = FLOP_FORMULAS.get(getattr(aten, plain, None))
    return formula


_JUDGE_INFOS: dict[str, _Info] = {}


def _judge_info(name: str) -> _Info:
    info = _JUDGE_INFOS.get(name)
    if info is None:
        info = _JUDGE_INFOS[name] = _Info(name, name, name, None, False, None, (), False, False, False,
                                          trusted=name[len("judge::"):])
    return info


class _Op:
    """One checked op of a record, with what the passes need precomputed once."""

    __slots__ = ("info", "args", "kwargs", "out", "leaves", "reads", "fast", "claims")

    def __init__(self, info: _Info, args: Any, kwargs: dict, out: Any) -> None:
        self.info, self.args, self.kwargs, self.out = info, args, kwargs, out
        self.claims = _view_claims(out) if info.view else None  # a view's recorded (shape, strides, dtype)s
        if type(out) is list and len(out) in (2, 5) and out[0] == "$t" and type(out[1]) is int and out[1] >= 0:
            self.leaves = [out[1]]  # one tensor (a view's with its claim): the common case of _out_refs
        else:
            self.leaves = _out_refs(out)
        # (args template, [(position, ref)], kwargs template, [(name, ref)]) when no tensor sits in a list
        if not kwargs and type(args) is list:
            flat = _flat(args)
            self.fast = None if flat is None else (flat[0], flat[1], {}, [])
        else:
            self.fast = _compile_args(args, kwargs)
        if self.fast is not None:
            self.reads = [ref for _, ref in self.fast[1]] + [ref for _, ref in self.fast[3]]
        else:
            self.reads = _arg_refs(args) + _arg_refs(list(kwargs.values()))


_NO_TENSORS: dict[int, Any] = {}


def _flat(items: list) -> tuple[list, list] | None:
    """(template, [(position, ref)]) of a list of arguments, or None when a list in it nests a tensor."""
    template, slots = [], []
    for i, x in enumerate(items):
        t = type(x)
        if t in _PLAIN:
            template.append(x)
        elif t is list and len(x) in (2, 5) and x[0] == "$t":
            if type(x[1]) is not int:
                raise ReplayRefused("the record numbers a tensor wrongly", "malformed")
            template.append(None)
            slots.append((i, x[1]))
        elif t is list and any(type(y) is list for y in x):
            return None
        else:
            template.append(_dec(x, _NO_TENSORS))
    return template, slots


def _compile_args(args: Any, kwargs: dict) -> Any:
    """A template of the op's arguments with the tensor slots listed, when no tensor is nested inside
    a list (then filling the slots is all a replay has to do per op); else None."""
    if type(args) is not list:
        return None
    fa = _flat(args)
    if fa is None:
        return None
    if not kwargs:
        return fa[0], fa[1], {}, []
    keys = list(kwargs)
    fk = _flat(list(kwargs.values()))
    if fk is None:
        return None
    return fa[0], fa[1], dict(zip(keys, fk[0])), [(keys[i], ref) for i, ref in fk[1]]


def _args_of(op: _Op, env: dict[int, Any]) -> tuple[list, dict]:
    if op.fast is None:
        return _dec(op.args, env), ({k: _dec(v, env) for k, v in op.kwargs.items()} if op.kwargs else {})
    template, slots, kw_template, kw_slots = op.fast
    a = list(template)
    try:
        for i, ref in slots:
            a[i] = env[ref]
        if not kw_slots:
            return a, (dict(kw_template) if kw_template else {})
        kw = dict(kw_template)
        for name, ref in kw_slots:
            kw[name] = env[ref]
    except KeyError:
        raise ReplayRefused("the record uses a tensor before any op produced it", "malformed") from None
    return a, kw


def prepare(ops: list) -> list[_Op]:
    """The ops ready for the passes (check_record already returns them so)."""
    return [op if isinstance(op, _Op) else _Op(_judge_info(op[0]) if isinstance(op[0], str) else _info(op[0]),
                                               op[1], op[2], op[3]) for op in ops]


def _bind(env: dict[int, Any], leaves: list[Any], got: list[Any]) -> None:
    if len(got) != len(leaves):
        raise ReplayRefused("a recorded op returned a different number of values in the replay", "malformed")
    for leaf, value in zip(leaves, got):
        if type(leaf) is int:
            if not isinstance(value, torch.Tensor):
                raise ReplayRefused("a recorded tensor output is not a tensor in the replay", "malformed")
            env[leaf] = value


def _trusted_cost(op: _Op, a: list, kw: dict, trusted: dict) -> tuple[list[int], int] | None:
    """A judge:: op's (bytes per tensor, matmul FLOPs) from its TrustedOp (which checks the arguments), or
    None for a plain trusted function (bounded on meta tensors, no FLOPs: part 4's forward). Refuses a
    name this test gave the judge no function for."""
    fn = trusted.get(op.info.trusted)
    if fn is None:
        raise ReplayRefused(f"the record names an op {op.info.name[:60]!r} that this test does not compute "
                            "for it", "malformed")
    if not isinstance(fn, TrustedOp):
        return None
    if kw:
        raise ReplayRefused(f"the record's {op.info.name[:60]} passes keyword arguments", "malformed")
    return fn.cost(a)


def _preflight(op: _Op, a: list, kw: dict, budget: Budget, state: dict, trusted: dict,
               cost: tuple[list[int], int] | None = None) -> None:
    """Bound the op BEFORE it runs: its output and FLOPs from the real shapes of its inputs (cheap kinds),
    else from the op run on meta tensors (cached per signature); views from the record's claim; a
    TrustedOp's from its `cost` (computed by the caller: the FLOPs count in the replay too)."""
    info = op.info
    if not info.view:  # a view reads nothing; every other op reads its inputs (and writes below)
        fast = op.fast
        if fast is not None and not fast[3]:  # the tensors sit at the template's slots
            n = 0
            for i, _ in fast[1]:
                n += a[i].numel()
            state["touched"] += n
        else:
            state["touched"] += _tensor_numel(a, kw)
    if info.view:
        for c in op.claims:
            if c is None:
                raise ReplayRefused("a recorded view op does not state its output's shape", "malformed")
            if c[3] > budget.max_tensor_bytes // 8 or c[4]:  # (_view_claims: the shape's product, a negative size)
                raise ReplayRefused(f"the call makes a view of {c[3]:,} elements", "budget")
        return
    if info.scalar_out:
        _check_touched(state, budget)
        return
    bound = _bound_out(info, a, kw) if info.kind is not None else None
    if bound is not None:
        elems, flops = bound
        sizes = [elems * 8]
    elif cost is not None:
        sizes, flops = cost
    else:
        ma = _to_meta(a)
        mkw = {k: _to_meta(v) for k, v in kw.items()}
        if info.trusted is not None:
            try:
                result = trusted[info.trusted](*ma, **mkw)
            except Exception as exc:  # noqa: BLE001 -- arguments the judge's function does not take
                raise ReplayRefused(f"the recorded op {info.name[:60]} does not run on the recorded arguments "
                                    f"({type(exc).__name__})", "malformed") from None
            flops = 0
            sizes = [t.numel() * t.element_size() for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        else:
            if info.has_device:
                mkw["device"] = torch.device("meta")
            key = _meta_key(info.func, ma, mkw)
            hit = state["cache"].get(key)
            if hit is None:
                try:
                    result = info.func(*ma, **mkw)
                except Exception as exc:  # noqa: BLE001 -- a record whose ops do not fit together
                    raise ReplayRefused(f"the recorded op {info.name} does not run on the recorded shapes "
                                        f"({type(exc).__name__})", "malformed") from None
                flops = int(info.formula(*ma, **mkw, out_val=result)) if info.formula is not None else 0
                hit = state["cache"][key] = ([t.numel() * t.element_size() for t in tree_flatten(result)[0]
                                              if isinstance(t, torch.Tensor)], flops)
            sizes, flops = hit
    for size in sizes:
        if size > budget.max_tensor_bytes:
            raise ReplayRefused(f"the call makes a tensor of {size:,} bytes (bound {budget.max_tensor_bytes:,})",
                                "budget")
    state["bytes"] += sum(sizes)
    state["flops"] += flops
    state["touched"] += sum(sizes) // 8
    if state["bytes"] > budget.max_total_bytes or state["flops"] > budget.max_flops:
        raise ReplayRefused(f"the call is above the judge's bounds ({state['bytes']:,} bytes allocated, "
                            f"{state['flops']:,} matmul FLOPs)", "budget")
    _check_touched(state, budget)


def _check_touched(state: dict, budget: Budget) -> None:
    if state["touched"] > budget.max_elements_touched:
        raise ReplayRefused(f"the call's ops read and write more than {budget.max_elements_touched:,} tensor elements "
                            "in all (the judge's bound)", "budget")


def _checkpoint(deadline: float | None) -> None:
    """Checked every 256 ops of a pass: the replay's own wall-clock bound (Budget.max_replay_s) and
    the judge's memory bound (memory.py; the ops' sizes are bounded one by one, not what they keep)."""
    if deadline is not None and time.perf_counter() > deadline:
        raise ReplayRefused("replaying the call took the judge longer than its bound: the recorded ops do far more "
                            "work than the call needs", "budget")
    used = memory.over_bound()
    if used is not None:
        raise ReplayRefused(f"replaying the call took {memory.describe(used)}: the recorded ops keep far more "
                            "data than the call needs", "budget")


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if type(x) in (list, tuple):
        return type(x)(_to_meta(i) for i in x)
    return x


def _check_branch(op: _Op, result: Any) -> None:
    """A .item()/bool() must give the value the worker saw: the program may not branch on values."""
    recorded = [leaf[1] for leaf in op.leaves if type(leaf) is tuple]
    if recorded and recorded[0] != result and not (_nan(recorded[0]) and _nan(result)):
        raise ReplayRefused("the program branches on tensor values (.item() / bool() of a tensor gave another "
                            "value on the judge's inputs): graded code must not decide its steps from the values "
                            "of its inputs", "data_dependent")


def _run(op: _Op, a: list, kw: dict, trusted: dict) -> Any:
    """Run one op in the replay (with the checks every pass makes)."""
    info = op.info
    # An op that raises on the judge's values (an index computed from data that is out of range on the
    # twin's inputs, say) is the record's failure, never the judge's: the meta check saw only shapes.
    try:
        if info.trusted is not None:
            return trusted[info.trusted](*a, **kw)
        result = info.call(*a, **kw)
    except ReplayRefused:  # a trusted op's own refusal (arguments it does not take) says why itself
        raise
    except Exception as exc:  # noqa: BLE001 -- whatever a recorded op raises, the submission fails
        raise ReplayRefused(f"the recorded op {info.name[:60]} raised on the judge's inputs ({type(exc).__name__}): "
                            "graded code must not compute indices or shapes from the values of its inputs",
                            "data_dependent") from None
    if info.empty and type(result) is torch.Tensor:
        fill_unwritten(result)  # uninitialised memory would make the replay nondeterministic
    if info.scalar_out:
        _check_branch(op, result)
    return result


# What torch.empty holds in the replay: a NaN with a payload of its own in floating tensors (code that
# reads memory it never wrote fails, whatever the machine's memory held, and a check can say so:
# `unwritten`), the largest value in integer ones and True in bool ones, as torch's own
# fill_uninitialized_memory in the worker (worker.main), so that a branch on such memory goes the same
# way in both. The floating value as an integer of the same width.
_UNWRITTEN_BITS = {torch.float64: (torch.int64, 0x7FF80000DEADBEEF), torch.float32: (torch.int32, 0x7FC0DEAD),
                   torch.float16: (torch.int16, 0x7E5B), torch.bfloat16: (torch.int16, 0x7FDB)}


def fill_unwritten(t: torch.Tensor) -> None:
    """Fill a tensor fresh from an empty op with the replay's 'never written' value."""
    bits = _UNWRITTEN_BITS.get(t.dtype)
    if bits is not None:
        t.view(bits[0]).fill_(bits[1])
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif not t.is_floating_point() and not t.is_complex():
        t.fill_(torch.iinfo(t.dtype).max)
    else:
        t.fill_(math.nan)


def unwritten(t: torch.Tensor) -> torch.Tensor:
    """Where t holds the replay's 'never written' value (bool, t's shape): memory from torch.empty that the
    code never wrote, copied or viewed as it was."""
    bits = _UNWRITTEN_BITS.get(t.dtype)
    if bits is None or t.is_complex():
        return torch.zeros(t.shape, dtype=torch.bool)
    return t.detach().view(bits[0]) == bits[1]


def _real_pass(ops: list, base: dict[int, Any], record: dict, const_refs: set[int], trusted: dict,
               budget: Budget | None = None) -> Replayed:
    """Replay the ops on real tensors and measure. With `budget`, every op is bounded (_preflight)
    before it runs."""
    prepared = prepare(ops)
    state = {"cache": {}, "bytes": 0, "flops": 0, "touched": 0}
    deadline = time.perf_counter() + budget.max_replay_s if budget is not None else None
    env: dict[int, Any] = {ref: (t.clone() if isinstance(t, torch.Tensor) else t) for ref, t in base.items()}
    # refs whose values derive from data (inputs, named tensors, constants), not from shapes alone
    # (an arange, a mask built from aranges): an integer product of two of them can carry a matmul
    from_data: set[int] = set(base)
    carries: dict[int, tuple[int, int]] = {}  # ref -> (bound on its distinct values, its version then)
    excluded = {key[0] for t in env.values() if isinstance(t, torch.Tensor)
                for key in [_storage_key(t)] if key is not None and key[1] > 0}
    seen: set[tuple[int, int]] = set()
    counts: dict[str, int] = {}
    flops: Counter[str] = Counter()
    flops_at = [0]
    pairwise_at, pairwise = [0], 0
    largest = {"bytes": 0, "op": "", "shape": [], "dtype": ""}
    bcast_elems = bcast_ops = 0
    producer: dict[int, int] = {}
    new_storage_of: dict[int, int] = {}
    shapes: list = []
    total = upcasts = 0
    f64, f32, Tensor = torch.float64, torch.float32, torch.Tensor
    with torch.no_grad():
        for index, op in enumerate(prepared):
            if not index & 255:
                _checkpoint(deadline)
            info = op.info
            a, kw = _args_of(op, env)
            name = info.name
            cost = _trusted_cost(op, a, kw, trusted) if info.trusted is not None else None
            if budget is not None:
                _preflight(op, a, kw, budget, state, trusted, cost)
            result = _run(op, a, kw, trusted)
            if info.formula is not None:
                f = int(info.formula(*a, **kw, out_val=result))
                flops[name] += f
                total += f
            elif cost is not None:  # a trusted op's matmuls count like recorded ones
                flops[name] += cost[1]
                total += cost[1]
            counts[name] = counts.get(name, 0) + 1
            flops_at.append(total)
            pairwise_at.append(pairwise)
            got = [result] if type(result) is Tensor else tree_flatten(result)[0]
            if type(result) is Tensor:
                if result.dtype not in _DTYPE_NAME:
                    _refuse_dtype(result.dtype)
            else:
                for t in got:
                    if isinstance(t, Tensor) and t.dtype not in _DTYPE_NAME:
                        _refuse_dtype(t.dtype)
            shapes.append(result.shape if type(result) is Tensor else _shapes(got))
            # (a *_like / new_* / arange op takes only the shape and dtype of what it reads)
            derived = info.kind not in _SHAPE_ONLY and not from_data.isdisjoint(op.reads)
            if derived:
                leaves = op.leaves
                if len(leaves) == 1 and type(leaves[0]) is int:
                    from_data.add(leaves[0])
                else:
                    from_data.update(leaf for leaf in leaves if type(leaf) is int)
            if info.view:
                claims = op.claims
                if type(result) is Tensor and len(claims) == 1:  # one view: the common case
                    c = claims[0]
                    wrong = c is None or result.shape != c[0] or result.stride() != c[1] \
                        or _DTYPE_NAME.get(result.dtype) != c[2]
                else:
                    tensors = [t for t in got if isinstance(t, Tensor)]
                    wrong = len(claims) != len(tensors) or any(
                        c is None or t.shape != c[0] or t.stride() != c[1] or _DTYPE_NAME.get(t.dtype) != c[2]
                        for t, c in zip(tensors, claims))
                if wrong:
                    raise ReplayRefused(f"the record's {name} does not match its replay", "malformed")
            leaves = op.leaves
            if len(leaves) == 1 and len(got) == 1 and type(leaves[0]) is int and type(result) is Tensor:
                env[leaves[0]] = result  # the common case of _bind
                if info.carry is not None and op.fast is not None and not op.fast[3] and (
                        carries or info.carry == "copy"):
                    bound = _carries_bound(info, a, op.fast[1], carries)
                    if bound is not None and bound < result.numel():
                        carries[leaves[0]] = (bound, result._version)
            else:
                _bind(env, leaves, got)
            if info.view:  # a view: no new storage, no product, no cast
                for leaf in leaves:
                    if type(leaf) is int and leaf not in producer:
                        producer[leaf] = index
                continue
            out64 = False
            for leaf, t in zip(leaves, got):
                if type(leaf) is int and isinstance(t, Tensor):
                    if leaf not in producer:
                        producer[leaf] = index
                    out64 = out64 or t.dtype == f64
                    try:
                        st = t.untyped_storage()
                        key = (st.data_ptr(), st.nbytes())
                    except (RuntimeError, NotImplementedError):
                        continue
                    if key[0] in excluded:
                        continue
                    if key not in seen:
                        seen.add(key)
                        new_storage_of[leaf] = key[1]
                        if key[1] > largest["bytes"]:
                            largest = {"bytes": int(key[1]), "op": name, "shape": list(t.shape),
                                       "dtype": str(t.dtype).replace("torch.", "")}
            operands_all = None if not (out64 or info.outer) else (
                (a if op.fast is not None else tree_flatten(a)[0]) + (list(kw.values()) if kw else []))
            if out64 and any(isinstance(x, Tensor) and x.dtype == f32 for x in operands_all):
                upcasts += 1
            # Floating products always; integer ones between operands that both derive from data (a
            # float scaled to fixed point would carry a matmul through them), not index arithmetic
            # such as token ids plus an arange.
            if info.outer and got and isinstance(got[0], Tensor) and (
                    got[0].is_floating_point() or (derived and got[0].dtype != torch.bool)):
                n_out = got[0].numel()
                counted = total
                # the operands that carry data (a one-element tensor is a number), each with how many
                # distinct values it holds (followed back through copies: a contiguous() expand
                # still holds what was expanded); integer products count operands of data only
                if op.fast is not None:
                    pairs = [(a[i], r) for i, r in op.fast[1]] + [(kw[k], r) for k, r in op.fast[3]]
                    if not got[0].is_floating_point():
                        pairs = [(x, r) for x, r in pairs if r in from_data]
                else:
                    pairs = [(x, None) for x in operands_all]
                operands: list | None = []
                held: list[int] = []
                own: list[int] = []  # _effective_numel of the tensor operands looked at (pairwise_at below)
                looked = 0  # the pairs looked at before a break
                for x, r in pairs:
                    if isinstance(x, Tensor):
                        c = carries.get(r) if carries else None
                        if c is None and x.is_contiguous() and x.numel() == n_out:
                            # it holds n_out distinct values (_effective_numel of a contiguous tensor is
                            # its numel): the output has no more, so this op multiplies out nothing
                            operands = None
                            break
                        e = _effective_numel(x)
                        own.append(e)
                        if c is not None and c[0] < e and c[1] == x._version:
                            e = c[0]  # followed back through a copy (_carried)
                        if e > 1:
                            operands.append(x)
                            held.append(e)
                    looked += 1
                if operands is not None and len(operands) >= 2 and max(held) < n_out:
                    shape = list(got[0].shape)
                    aligned = [[1] * (len(shape) - x.dim()) + list(x.shape) for x in operands]
                    if info.short in ("mul", "mul_") and len(operands) == 2 and \
                            any(n == 1 and all(s[i] == 1 for s in aligned) for i, n in enumerate(shape)):
                        # An outer product over a dim of extent 1 in both operands is a matmul whose
                        # contraction has length 1 (einsum / matmul lower it to mul for a tile with one
                        # key or one row): 2·m·1·n FLOPs, counted like any matmul.
                        flops[name] += 2 * n_out
                        total += 2 * n_out
                        flops_at[-1] = total
                    else:
                        # A broadcast product is a matmul hidden in an elementwise op (the sum that
                        # finishes it is cheap): measured for the rules that refuse it (parts 2, 4, 6),
                        # and its 2·n_out FLOPs count, so that no FLOP bound can be passed this way.
                        bcast_elems += n_out
                        bcast_ops += 1
                        flops[name] += 2 * n_out
                        total += 2 * n_out
                        flops_at[-1] = total
                # (operands of several values each: those looked at above, then the rest)
                if total == counted and got[0].is_floating_point() and sum(1 for e in own if e > 1) + sum(
                        1 for x, _ in pairs[looked:] if isinstance(x, Tensor) and _effective_numel(x) > 1) >= 2:
                    pairwise += 2 * n_out
                    pairwise_at[-1] = pairwise
            elif info.kind == "reduction" and op.fast is not None and op.fast[1] and got and \
                    isinstance(got[0], Tensor) and got[0].is_floating_point():
                # a reduction combines its input's elements: 2 per element read (a product of a stack
                # of two tensors by prod, or the sum of a multiply, is a matmul's work)
                src = a[op.fast[1][0][0]]
                pairwise += 2 * _effective_numel(src)
                pairwise_at[-1] = pairwise
            elif info.short in _ACCUMULATING and got and isinstance(got[0], Tensor) and (
                    got[0].is_floating_point() or (derived and got[0].dtype != torch.bool)):
                # an indexed accumulation (index_add, index_put with accumulate, scatter with a reduce)
                # combines each element it brings in with one already there: 2 per element, as a reduction
                pairwise += 2 * _accumulated(info.short, a, kw)
                pairwise_at[-1] = pairwise
    result = _dec(record["result"], env) if record["result"] is not None else None
    consts = [t for r, t in base.items() if r in const_refs]
    readers: dict[int, list[int]] = {}
    for index, op in enumerate(prepared):
        for ref in op.reads:
            readers.setdefault(ref, []).append(index)
    return Replayed(result=result, ops=len(prepared), op_counts=counts, matmul_flops=total,
                    elements_touched=state["touched"] if budget is not None else None,
                    flops_by_op=dict(flops), flops_at=flops_at, max_new_storage_bytes=int(largest["bytes"]),
                    max_new_storage=largest, broadcast_product_elems=bcast_elems, broadcast_product_ops=bcast_ops,
                    constants=len(consts), constant_elements=sum(t.numel() for t in consts), upcasts=upcasts,
                    marks=_marks(record.get("marks"), len(prepared)), env=env,
                    inputs=[env[i] for i in range(int(record["inputs"]))], producer=producer, readers=readers,
                    new_storage_of=new_storage_of, prepared=prepared, shapes=shapes, pairwise_at=pairwise_at)


_ACCUMULATING = frozenset({"index_add", "index_add_", "index_put", "index_put_", "scatter", "scatter_"})


def _accumulated(short: str, a: list, kw: dict) -> int:
    """The elements an indexed op combines with what is already there (0 where it only moves data: an
    index_put without accumulate, a scatter without a reduce). Arguments as the schemas order them:
    index_add(self, dim, index, source, *, alpha), index_put(self, indices, values, accumulate),
    scatter(self, dim, index, src | value, *, reduce)."""
    def numel(x: Any) -> int:
        return x.numel() if isinstance(x, torch.Tensor) else 0

    plain = short.removesuffix("_")
    if plain == "index_add":
        return numel(a[3] if len(a) > 3 else kw.get("source"))
    if plain == "index_put":
        if not (a[3] if len(a) > 3 else kw.get("accumulate", False)):
            return 0
        indices = a[1] if len(a) > 1 else kw.get("indices") or []
        return max([numel(a[2] if len(a) > 2 else kw.get("values"))] + [numel(i) for i in indices or []])
    if kw.get("reduce") is None and not (len(a) > 4 and isinstance(a[4], str)):
        return 0
    return numel(a[2] if len(a) > 2 else kw.get("index"))


def _shapes(got: list) -> tuple:
    return tuple(tuple(t.shape) for t in got if isinstance(t, torch.Tensor))


def _twin_pass(main: Replayed, base: dict[int, Any], record: dict, trusted: dict,
               budget: Budget = DEFAULT_BUDGET) -> "Twin":
    """The same checked program on the twin's inputs (same shapes), measuring nothing: only its result.
    The main pass bounded every op for the shapes it saw; every op must give the same shapes here
    (an op whose output shape depends on values, e.g. boolean indexing, could otherwise grow
    without bound), or the record is refused."""
    env: dict[int, Any] = {ref: (t.clone() if isinstance(t, torch.Tensor) else t) for ref, t in base.items()}
    Tensor = torch.Tensor
    shapes = main.shapes
    deadline = time.perf_counter() + budget.max_replay_s
    with torch.no_grad():
        for index, op in enumerate(main.prepared):
            if not index & 255:
                _checkpoint(deadline)
            a, kw = _args_of(op, env)
            result = _run(op, a, kw, trusted)
            leaves = op.leaves
            if type(result) is Tensor:
                if result.shape != shapes[index]:
                    _shape_changed()
                if len(leaves) == 1 and type(leaves[0]) is int:
                    env[leaves[0]] = result  # the common case
                    continue
                got = [result]
            else:
                got = tree_flatten(result)[0]
                if _shapes(got) != shapes[index]:
                    _shape_changed()
            _bind(env, leaves, got)
    return Twin(_dec(record["result"], env) if record["result"] is not None else None)


def _shape_changed() -> None:
    raise ReplayRefused("the program's tensor shapes depend on its input values (an op gave another shape on the "
                        "judge's inputs, e.g. boolean indexing): use fixed shapes, e.g. torch.where", "data_dependent")


def _nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _arg_refs(x: Any) -> list[int]:
    if _is_ref(x):
        return [x[1]]
    if type(x) in (list, tuple):
        return [r for i in x for r in _arg_refs(i)]
    return []


def _marks(marks: Any, n_ops: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if type(marks) is dict:
        for k, v in marks.items():
            if type(k) is str and type(v) is list and all(type(i) is int and 0 <= i <= n_ops for i in v):
                out[k] = list(v)
    return out


# ---------------------------------------------------------------------------------------------------
# the judge's own inputs


# The twin's inputs must be unpredictable to the submission: a program that could compute them
# (from the test's seed, say, which its inputs give away) could bring in the twin's answer too. Every
# twin draw therefore mixes a secret the judge process draws at start (never sent to a worker) into
# its seed. Correct code passes the twin check on any inputs, so grades do not depend on the secret.
_TWIN_SECRET = secrets.randbits(62)


def twin_seed(seed: int) -> int:
    """`seed` mixed with this judge process's secret: the seed of a twin draw (inputs, weights, prompts)."""
    digest = hashlib.blake2b(f"{seed}".encode(), key=_TWIN_SECRET.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def perturbed(t: torch.Tensor, seed: int, rel: float = 5e-2) -> torch.Tensor:
    """t with every finite nonzero float value moved by a random relative step of rel/2 to `rel`, all in
    one direction (same shape, dtype, signs, zeros and infinities). A program whose answer was computed outside the
    recorded ops (and brought in as constants or scalars) cannot match the reference on these.
    The step is drawn from twin_seed(seed): unpredictable outside the judge."""
    if not t.is_floating_point():
        return _canonical(t)
    g = torch.Generator().manual_seed(twin_seed(seed))
    # every value moves by rel/2 to rel, all the same way: random signs would average out over a long
    # row (a sum of 1000 terms moved ±5 % each moves by ~0.1 %, inside the twin's tolerance)
    sign = 1.0 if bool(torch.rand((), generator=g) < 0.5) else -1.0
    u = sign * (0.5 + 0.5 * torch.rand(t.shape, generator=g, dtype=torch.float64))
    out = t.double() * (1 + rel * u)
    out = torch.where(torch.isfinite(t), out, t.double())
    return _canonical(out.to(t.dtype))


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """A copy of t with the standard (row-major) strides: what the worker receives for it (the protocol
    sends contiguous data). An empty slice keeps its odd strides through .contiguous(), and a view that
    the code makes of it would then state other strides in the worker than in the replay."""
    out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t.detach())
    return out.requires_grad_(True) if t.requires_grad else out


def record_and_replay(fn: Callable[..., Any], *args: Any, part: int | None = None, **kwargs: Any) -> Replayed:
    """Record fn(*args, **kwargs) in THIS process and replay it (tests of the tracer; never for grading)."""
    from autograder.scenarios.tracing import record_call, tensors_of

    inputs = tensors_of(args, kwargs)
    record = record_call(fn, inputs, *args, **kwargs)
    return replay(record, inputs, part=part)


# ---------------------------------------------------------------------------------------------------
# the judge's entry point for a test


def _leaves_perturbed(value: Any, seed: int) -> Any:
    counter = [0]

    def go(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            counter[0] += 1
            return perturbed(x, seed * 1000 + counter[0])
        if type(x) in (list, tuple):
            return type(x)(go(i) for i in x)
        if type(x) is dict:
            return {k: go(v) for k, v in x.items()}
        return x

    return go(value)


def judge_inputs(args: tuple, kwargs: dict, seed: int | None) -> tuple[tuple, dict]:
    """The judge's own copy of a call's inputs: perturbed (see `perturbed`) unless seed is None."""
    if seed is None:
        return tuple(_clone(a) for a in args), {k: _clone(v) for k, v in kwargs.items()}
    return _leaves_perturbed(tuple(args), seed), _leaves_perturbed(dict(kwargs), seed + 7)


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return _canonical(x)
    if type(x) in (list, tuple):
        return type(x)(_clone(i) for i in x)
    if type(x) is dict:
        return {k: _clone(v) for k, v in x.items()}
    return x


TWIN_REL = 1e-3  # the twin's output may be off its reference by 1e-3·(max|ref| + 1): rounding is ~1e-6 of that


def twin_error(actual: Any, expected: Any) -> str | None:
    """None when the twin replay's output matches the judge's reference on the twin inputs loosely
    (TWIN_REL); else a short reason. Leaves are compared in order (tensors, or nested tuples/lists);
    for a dict `expected`, only its keys."""
    if type(expected) is dict:
        if type(actual) is not dict or not set(expected) <= set(actual):
            return "its result is not the expected dict"
        actual = [actual[k] for k in expected]
        expected = list(expected.values())
    got, want = tree_flatten(actual)[0], tree_flatten(expected)[0]
    if len(got) != len(want):
        return f"it returned {len(got)} values, expected {len(want)}"
    for a, e in zip(got, want):
        if not isinstance(e, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape:
            return "its result has another type or shape"
        a64, e64 = a.double(), e.double()
        finite = torch.isfinite(e64)
        if not torch.equal(torch.isfinite(a64), finite) or not torch.equal(a64[~finite], e64[~finite]):
            return "its infinities or NaNs are elsewhere"
        if finite.any():
            err = (a64[finite] - e64[finite]).abs().max().item()
            bound = TWIN_REL * (e64[finite].abs().max().item() + 1)
            if not err <= bound:
                return f"its result is off by {err:.3g} (allowed {bound:.3g})"
    return None


def check_twin(rp: Replayed, reference: Callable[..., Any], *, fn: str) -> None:
    """The twin replay (same program, judge-drawn inputs) must compute the reference of ITS inputs.

    A program whose answer was computed outside the recorded ops and brought in through constants or
    scalars gives the answer for the recorded inputs only, and fails here."""
    from .checks import CheckFailure

    if rp.twin is None:
        return
    args, kwargs = rp.twin_args
    why = twin_error(rp.twin.result, reference(*args, **kwargs))
    if why is not None:
        raise CheckFailure(f"{fn} computes its result from its inputs (the judge replays the recorded ops on inputs "
                           "of its own)", detail=f"on the judge's inputs {why}", kind="replay",
                           hint="compute the result from the inputs with torch ops inside the call; values computed "
                                "elsewhere and brought in as constants or numbers match only the inputs they were "
                                "computed for")


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and values, NaN equal to NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    same = a == b
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return bool(same.all())


_ORDINAL = {1: "1st", 2: "2nd", 3: "3rd"}


def check_inputs_kept(rp: Replayed, inputs: list[torch.Tensor], fn: str) -> None:
    """A graded function leaves its inputs as they were: the caller still holds them (q scaled in place
    through a view, `q.reshape(...).mul_(scale)`, is a bug the output alone does not show). Measured
    in the replay: each input is the judge's copy (rp.inputs), and an in-place op on it or on any
    view of it bumps its version counter; the values then decide."""
    from .checks import CheckFailure

    for i, (mine, given) in enumerate(zip(rp.inputs, inputs)):
        if mine._version and not _same_values(mine.detach(), given.detach()):
            nth = _ORDINAL.get(i + 1, f"{i + 1}th")
            raise CheckFailure(
                f"{fn} leaves its inputs unchanged", kind="mutation",
                detail=f"its {nth} tensor argument, of shape {tuple(given.shape)}, holds other values after the "
                       f"call: an in-place op wrote into it",
                hint="an in-place op (mul_, add_, copy_, masked_fill_, index assignment x[...] = ...) on an input, "
                     "or on a view of one (reshape, view, transpose and slicing return views), changes the "
                     "caller's tensor: compute into new tensors (x = x * scale, not x.mul_(scale))")


def _flat_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [t for t in tree_flatten([list(args), kwargs])[0] if isinstance(t, torch.Tensor)]


def call(student: Any, target: str, args: tuple, kwargs: dict | None = None, *, seed: int | None = 1,
         budget: Budget = DEFAULT_BUDGET, reference: Callable[..., Any] | None = None,
         twin_inputs: tuple[tuple, dict] | None = None, **replay_kw: Any) -> tuple[Replayed, tuple, dict]:
    """Record student `target`(*args, **kwargs) in the worker and replay it here, twice: on the judge's
    own copy of these inputs (rp: grade its result and measurements), and, when `seed` is given, on
    judge-drawn inputs (rp.twin, checked against `reference` of those inputs by check_twin).

    Returns (rp, the judge's args, the judge's kwargs). A refused record fails the test with one
    clear line; so does a twin that does not compute `reference` (when given)."""
    kwargs = dict(kwargs or {})
    record = student.scenario("tracing.call", fn=target, args=list(args), kwargs=kwargs)
    return replay_record(student, record, target.rsplit(".", 1)[-1], args, kwargs, seed=seed, budget=budget,
                         reference=reference, twin_inputs=twin_inputs, **replay_kw)


def replay_record(student: Any, record: Any, fn: str, args: tuple, kwargs: dict, **kw: Any) -> tuple[Replayed, tuple, dict]:
    """`call` for a record a scenario made; see _replay_record."""
    with paused_gc():
        return _replay_record(student, record, fn, args, kwargs, **kw)


def _replay_record(student: Any, record: Any, fn: str, args: tuple, kwargs: dict, *, seed: int | None = 1,
                  budget: Budget = DEFAULT_BUDGET, reference: Callable[..., Any] | None = None,
                  twin_inputs: tuple[tuple, dict] | None = None, twin_named: dict[str, torch.Tensor] | None = None,
                  main_reference: Callable[..., Any] | None = None, **replay_kw: Any) -> tuple[Replayed, tuple, dict]:
    """`call` for a record a scenario made; its inputs are the tensors of (args, kwargs) in pytree order.
    twin_named: the judge's own named tensors for the twin (e.g. perturbed model weights);
    main_reference: the reference on the main replay's inputs and named tensors (default `reference`).
    twin_inputs: the twin's (args, kwargs) when they must be consistent with each other (e.g. o and lse
    of the twin's q, k, v); default: `perturbed` copies of args and kwargs (seed)."""
    from .checks import CheckFailure

    j_args, j_kwargs = judge_inputs(tuple(args), kwargs, None)
    hint = ("the grader replays the torch ops your code ran, on its own inputs: use torch ops on the inputs, no fused "
            "attention, no values computed outside the call")
    main_inputs = _flat_tensors(j_args, j_kwargs)
    try:
        rp = replay(record, main_inputs, part=getattr(student, "part", None), budget=budget, **replay_kw)
    except ReplayRefused as exc:
        raise CheckFailure(f"{fn} replays in the judge", detail=str(exc), kind="replay", hint=hint) from None
    check_inputs_kept(rp, main_inputs, fn)
    # The twin only where the replay on the recorded inputs is (loosely) right: a plainly wrong result
    # fails the test's own value checks, with their diagnosis of the bug.
    if reference is None or (seed is None and twin_inputs is None):
        return rp, j_args, j_kwargs
    if twin_error(rp.result, (main_reference or reference)(*j_args, **j_kwargs)) is not None:
        return rp, j_args, j_kwargs
    t_args, t_kwargs = twin_inputs if twin_inputs is not None else judge_inputs(tuple(args), kwargs, seed)
    t_inputs = _flat_tensors(t_args, t_kwargs)
    named = twin_named if twin_named is not None else replay_kw.get("named") or {}
    try:
        base = _base(record, t_inputs, named)
        main_base = _base(record, main_inputs, replay_kw.get("named") or {})
        same = set(base) == set(main_base) and all(
            not isinstance(t, torch.Tensor) or (isinstance(main_base[r], torch.Tensor) and t.shape == main_base[r].shape
                                                and t.dtype == main_base[r].dtype) for r, t in base.items())
        if same:  # the main pass bounded every op for these shapes
            rp.twin = _twin_pass(rp, base, record, replay_kw.get("trusted") or {}, budget)
        else:
            twin = _real_pass(rp.prepared, base, record, set(), replay_kw.get("trusted") or {}, budget=budget)
            rp.twin = Twin(twin.result)
    except ReplayRefused as exc:
        raise CheckFailure(f"{fn} replays in the judge", detail=str(exc), kind="replay", hint=hint) from None
    rp.twin_args = (t_args, t_kwargs)
    check_twin(rp, reference, fn=fn)
    return rp, j_args, j_kwargs
