"""The recorder (runs in the worker, around the student's calls): what the code DID, as plain data.

    rec = Recorder()
    rec.inputs(q, k, v)                      # refs 0, 1, 2, in this order
    with rec:
        result = student_fn(q, k, v, causal=True)
    return rec.record(result)                # plain data for the judge

Nothing here measures anything that decides a point. The record is a program of aten ops that the
judge (autograder/engine/replay.py) checks against its allow-list, bounds on meta tensors, then
replays on ITS OWN copy of the inputs; every count and every output value the judge grades comes
from that replay. Student code in this process may edit the recorder, the record or the tensors:
that changes only the program the judge replays, never what the judge measures from it.

The record (lists, ints, floats, strs, tensors only):

    {"inputs": n,                       refs 0..n-1 are the inputs, in the order given to inputs()
     "ops": UTF-8 JSON text of [[name, args, kwargs, out], ...], as a uint8 tensor (its bytes
                                        travel raw, not escaped inside the message's JSON)
                                        name "aten::bmm.default" (op and overload); args/kwargs/out
                                        encode a tensor as ["$t", ref], a device, layout or memory
                                        format as ["$dev" | "$lay" | "$mf", name]; `out` numbers the
                                        tensors an op returned (an in-place op returns its self) as
                                        ["$t", ref], and for an op that returns a view of its inputs
                                        (VIEW_OPS, or a schema whose returns alias) as
                                        ["$t", ref, shape, strides, dtype]
     "constants": [[ref, tensor], ...]  tensors that entered from outside the recorded ops (their
                                        bytes ship; the judge bounds their count and size)
     "named": [[ref, name], ...]        tensors the judge owns too (e.g. "param:blocks.0.attn.wq.weight"
                                        of the course model): the judge substitutes its own copy
     "marks": {name: [op index, ...]}   positions in the program (e.g. where a backward starts)
     "result": the returned value with tensors as ["$t", ref]}

`trusted(name, fn)` wraps a course function that the judge computes itself (part 4's correct
forward, part 5's model pieces): its call is recorded as ONE op "judge::name" and its own ops are not
recorded; the judge checks and bounds the op and runs its own function (replay.TrustedOp).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

MAX_RECORDED_OPS = 200_000  # the judge's own bound is lower; this only stops runaway recording early

# Ops whose outputs are views (no new memory). The record states their output's shape, strides and
# dtype: the judge bounds them from that claim before replaying and checks it right after.
VIEW_OPS = frozenset("""alias as_strided detach diagonal expand narrow permute select slice squeeze t transpose
unbind unfold unsqueeze view view_as _reshape_alias split split_with_sizes tensor_split chunk unsafe_split
unsafe_split_with_sizes""".split())

_PLAIN = (type(None), bool, int, float, str)
_DTYPE_NAMES = {getattr(torch, n): n for n in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16",
                                                "int8", "uint8", "bool", "complex64", "complex128")}
_OP_NAMES: dict[Any, tuple[str, bool]] = {}  # op overload -> (record name, does its output state its shape)


def _op_name(func: Any) -> tuple[str, bool]:
    info = _OP_NAMES.get(func)
    if info is None:
        aliased = any(r.alias_info is not None for r in func._schema.returns)
        info = _OP_NAMES[func] = (f"{func._schema.name}.{func._overloadname}",
                                  aliased or func._schema.name.split("::")[-1] in VIEW_OPS)
    return info


_DECOMPOSES: dict[Any, bool] = {}
_DISPATCH: dict[Any, tuple[bool, str, bool, str | None]] = {}  # Recorder.__torch_dispatch__'s per-overload facts
_OUT_OF_PLACE: dict[Any, str | None] = {}
INPLACE_VIEWS = frozenset({"squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "as_strided_"})


def out_of_place_view(func: Any) -> str | None:
    """The record name of the out-of-place overload that makes the same view as this in-place view op
    (squeeze_ -> squeeze.dim; x @ M with a vector x lowers to unsqueeze, mm, squeeze_), or None. The
    Recorder records it so, under a new ref for the tensor: the judge never replays a tensor whose
    shape changed under its ref."""
    if func in _OUT_OF_PLACE:
        return _OUT_OF_PLACE[func]
    found = None
    base = func._schema.name.split("::")[-1]
    if base in INPLACE_VIEWS:
        names = [a.name for a in func._schema.arguments]
        packet = getattr(torch.ops.aten, base[:-1], None)
        for overload in packet.overloads() if packet is not None else ():
            plain = getattr(packet, overload)
            if [a.name for a in plain._schema.arguments] == names and not any(
                    r.alias_info is not None and r.alias_info.is_write for r in plain._schema.returns):
                found = f"{plain._schema.name}.{overload}"
                break
    _OUT_OF_PLACE[func] = found
    return found


def decomposed_before_dispatch(func: Any) -> bool:
    """Whether torch runs this overload as its decomposition (a CompositeImplicitAutograd kernel and no
    kernel of its own): then a TorchDispatchMode sees only the ops it decomposes into (einsum as
    permute/view/bmm, item as _local_scalar_dense), never the overload itself, except under
    torch.inference_mode, which skips that step; the Recorder then decomposes it itself. So no
    recording contains such an op, and the judge refuses a record that names one (replay.py)."""
    hit = _DECOMPOSES.get(func)
    if hit is None:
        schema = func._schema
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        hit = _DECOMPOSES[func] = has(name, "CompositeImplicitAutograd") and not has(name, "CPU")
    return hit


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside the block. A record is tens of thousands of small lists,
    none of them cyclic; every collection that their allocation triggers walks all of torch's objects
    too (measured: 3 of 15 s of a full grade in the judge)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class RecordTooLarge(Exception):
    """The call dispatched more ops than any record may hold."""


class Recorder(TorchDispatchMode):
    """A TorchDispatchMode that appends every aten op to a plain-data program."""

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, int] = {}  # id(tensor) -> ref
        self._alive: list[Any] = []  # every tensor seen stays alive, so that no id is reused
        self.ops: list[list[Any]] = []
        self.constants: list[list[Any]] = []
        self.named: list[list[Any]] = []
        self.marks: dict[str, list[int]] = {}
        self.n_inputs = 0
        self._in_trusted = False  # inside a trusted function's call (see trusted)

    def __enter__(self) -> "Recorder":
        self._gc = paused_gc()
        self._gc.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self._gc.__exit__(None, None, None)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch's documented switch: do not wrap __torch_dispatch__ in torch._dynamo.disable, whose
        # first use imports torch._dynamo (~1.5 s of CPU in every fresh worker, measured).
        return False

    # -- references -------------------------------------------------------------------------------

    def _new_ref(self, t: torch.Tensor) -> int:
        ref = len(self._alive)
        self._refs[id(t)] = ref
        self._alive.append(t)
        return ref

    def inputs(self, *tensors: torch.Tensor) -> None:
        """Number the call's input tensors (refs 0, 1, ...). Call before recording starts."""
        for t in tensors:
            self._new_ref(t)
        self.n_inputs = len(self._alive)

    def name(self, t: torch.Tensor, name: str) -> None:
        """A tensor the judge owns too (e.g. a parameter of the course model)."""
        if id(t) not in self._refs:
            self.named.append([self._new_ref(t), name])

    def mark(self, name: str) -> None:
        """Remember the current position in the program under `name`."""
        self.marks.setdefault(name, []).append(len(self.ops))

    def _ref(self, t: torch.Tensor) -> int:
        ref = self._refs.get(id(t))
        if ref is None:  # entered from outside the recorded ops: a constant that ships its bytes
            ref = self._new_ref(t)
            with _disable_current_modes():
                value = t.detach().clone() if t.layout == torch.strided and t.device.type == "cpu" else None
            self.constants.append([ref, value])
        return ref

    def _enc(self, x: Any) -> Any:
        t = type(x)
        if t in _PLAIN:
            return x
        if t is torch.Tensor:
            ref = self._refs.get(id(x))
            return ["$t", ref if ref is not None else self._ref(x)]
        if isinstance(x, torch.Tensor):
            return ["$t", self._ref(x)]
        if isinstance(x, (list, tuple)):
            return [self._enc(i) for i in x]
        if isinstance(x, torch.device):
            return ["$dev", str(x)]
        if isinstance(x, torch.layout):
            return ["$lay", str(x).removeprefix("torch.")]
        if isinstance(x, torch.memory_format):
            return ["$mf", str(x).removeprefix("torch.")]
        if isinstance(x, torch.dtype):
            return ["$dt", str(x).removeprefix("torch.")]
        if x is None or type(x) in (bool, int, float, str):
            return x
        if isinstance(x, bool):  # scalar subclasses (numpy's, or ones with a forged __eq__): the plain value
            return bool(x)
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return float(x)
        return ["$unknown", type(x).__name__]  # the judge refuses the record

    def _enc_out(self, x: Any, claims: bool = True) -> Any:
        if isinstance(x, torch.Tensor):
            ref = self._refs.get(id(x))
            if ref is None:
                ref = self._new_ref(x)
            if not claims:
                return ["$t", ref]
            # shape, strides and dtype: the judge bounds views from these before replaying, then checks them
            return ["$t", ref, list(x.shape), list(x.stride()),
                    _DTYPE_NAMES.get(x.dtype) or str(x.dtype).removeprefix("torch.")]
        if isinstance(x, (list, tuple)):
            return [self._enc_out(i, claims) for i in x]
        if type(x) is dict:
            return {str(k): self._enc_out(v, claims) for k, v in x.items()}
        return self._enc(x)

    # -- recording ----------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        known = _DISPATCH.get(func)  # (decomposes, record name, claims, out-of-place view), once per overload
        if known is None:
            name, claims = _op_name(func)
            known = _DISPATCH[func] = (decomposed_before_dispatch(func), name, claims,
                                       out_of_place_view(func) if claims else None)
        if known[0]:  # only under inference_mode: record what it decomposes into
            TorchDispatchMode.__enter__(self)  # this mode again, for the decomposition's ops
            try:
                out = func.decompose(*args, **(kwargs or {}))
            finally:
                TorchDispatchMode.__exit__(self, None, None, None)
            if out is not NotImplemented:
                return out
        refs, enc, Tensor = self._refs, self._enc, torch.Tensor
        enc_args = []
        for a in args:  # _enc, with its two common cases inline (this runs for every op)
            t = type(a)
            if t is Tensor:
                ref = refs.get(id(a))
                enc_args.append(["$t", ref if ref is not None else self._ref(a)])
            elif t in _PLAIN:
                enc_args.append(a)
            else:
                enc_args.append(enc(a))
        enc_kwargs = {k: enc(v) for k, v in kwargs.items()} if kwargs else {}
        out = func._op(*args, **(kwargs or {}))  # func(...) without the Python frame of OpOverload.__call__
        if len(self.ops) >= MAX_RECORDED_OPS:
            raise RecordTooLarge(f"the call dispatched more than {MAX_RECORDED_OPS:,} torch ops")
        _, name, claims, plain = known
        if plain is not None:  # the same view out of place, the tensor under a new ref from here on
            self.ops.append([plain, enc_args, enc_kwargs, ["$t", self._new_ref(out), list(out.shape),
                                                           list(out.stride()), _DTYPE_NAMES.get(out.dtype) or
                                                           str(out.dtype).removeprefix("torch.")]])
            return out
        if type(out) is Tensor and not claims:
            ref = refs.get(id(out))
            enc_out = ["$t", ref if ref is not None else self._new_ref(out)]
        else:
            enc_out = self._enc_out(out, claims)
        self.ops.append([name, enc_args, enc_kwargs, enc_out])
        return out

    def trusted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn as ONE recorded op "judge::name" (the judge computes it itself): positional tensor args.
        A trusted function called inside another one is part of that op: not recorded again."""
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._in_trusted:
                return fn(*args, **kwargs)
            enc_args, enc_kwargs = self._enc(list(args)), {k: self._enc(v) for k, v in kwargs.items()}
            self._in_trusted = True
            try:
                with _disable_current_modes():
                    out = fn(*args, **kwargs)
            finally:
                self._in_trusted = False
            self.ops.append([f"judge::{name}", enc_args, enc_kwargs, self._enc_out(out)])
            return out
        return wrapper

    def record(self, result: Any) -> dict[str, Any]:
        """The plain-data record (see the module docstring). The op list travels as ONE JSON text in a
        uint8 tensor (a dtype as ["$dt", name]): tens of thousands of small lists would cost more to
        tag one by one, and a str would be escaped inside the message's own JSON."""
        import json

        with paused_gc():
            text = json.dumps(self.ops, separators=(",", ":")).encode()
        with _disable_current_modes():
            ops = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        return {"inputs": self.n_inputs, "ops": ops,
                "constants": self.constants, "named": self.named,
                "marks": self.marks, "result": self._enc_out(result) if result is not None else None}


def record_call(fn: Callable[..., Any], inputs: list[torch.Tensor], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run fn(*args, **kwargs) under a Recorder whose inputs are `inputs` (in this order)."""
    rec = Recorder()
    rec.inputs(*inputs)
    with rec:
        result = fn(*args, **kwargs)
    return rec.record(result)


def tensors_of(*values: Any) -> list[torch.Tensor]:
    """The tensors in values, in the order the judge flattens them too (torch's pytree order)."""
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(list(values))[0] if isinstance(t, torch.Tensor)]


def call(student, fn: str, args: list, kwargs: dict) -> dict[str, Any]:
    """Scenario: record the student's `fn` ("module.function")(*args, **kwargs); the judge replays it."""
    return record_call(student.function(fn), tensors_of(args, kwargs), *args, **kwargs)
