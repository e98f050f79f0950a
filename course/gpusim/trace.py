"""Record a program run on the simulated GPU as plain data, and replay it on fresh memory.

Why: a grader must not trust numbers measured where the graded code runs (that code can rewrite
any object of its process). So the worker only RECORDS what the kernels did, and the judge
REPLAYS the record on its own simulated GPU, with its own input data, and measures everything
itself (docs/gpusim_guide.md, "What the grader measures itself").

What is recorded (``with record() as rec: ...; program = rec.program()``):
- every GPU made, its buffers (name, shape, dtype, initial contents) and every launch (kernel
  name, grid, block, arguments: buffers by name, scalars by value);
- per thread-block batch, the kernel's instructions in order: shared declarations, where()
  pushes and pops, barriers, loads, stores and atomics (array, width, index, value, source line);
- the arithmetic on loaded values: a load returns a ``Traced`` array (an ndarray subclass, the
  numpy twin of a torch dispatch recorder); every numpy ufunc, array function and view method
  applied to one is recorded with references to its operands.

Anything else a kernel uses (index arrays from threadIdx, np.zeros registers, Python numbers) is
a CONSTANT, shipped by value. A value the recording does not trace (computed on the host, or
copied out of a Traced array with float()/.item()/plain index assignment) is therefore frozen
into the program as a constant: replayed on other input data it is wrong. That is what the judge
relies on; it never needs to trust the recording.

What the replay measures that a direct run cannot (the engine never sees register values: they are
plain numpy arrays of the kernel): ``live_words_per_thread``, the most words of per-thread values
(registers) live at one time in a thread block, counted in the replay's own values (``LiveState``).

What the replay refuses that a direct run lets through (lanes.py, ``Checker``): register arithmetic
that moves values between threads. A per-thread value's last axis is the thread, and plain numpy can
read across it (a reduction over it, a gather, a reshape or transpose, a matmul contracting it); on a
GPU that exchange needs shared memory. Operations are recorded with the kernel line they come from
(where it changes from the previous operation's), so the refusal names it.

The program is plain data (dicts, lists, ints, floats, strs, torch tensors) for the grader's wire
protocol. ``replay`` validates it against bounds before and while it runs (events, bytes, work),
so a hostile program cannot exhaust the judge, and refuses anything malformed with RecordingError.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from . import engine as _eng
from .counters import merge_stats
from . import lanes as _lanes
from .errors import GpuSimError

# Bounds, checked in the worker (the recorder refuses to grow past them) and again in the judge.
MAX_EVENTS = 200_000  # instructions + operations in one program
MAX_CONST_BYTES = 48 << 20  # constants (index arrays, masks, initial buffer contents)
MAX_BUFFER_ELEMENTS = 1 << 23  # one global buffer
MAX_TOTAL_ELEMENTS = 1 << 24  # all global buffers of the program together
MAX_BLOCKS = 1 << 14  # thread blocks of one launch
MAX_LAUNCHES = 64
MAX_LANES = 1 << 20  # threads of one batch (blocks_at_once: every block of the launch)
MAX_SHARED_WORDS = 1 << 21  # shared memory of one batch, all its blocks together
MAX_WORK = 500_000_000  # elements the replay touches (matmul: out x inner); N = 1024, d = 64 needs 1.7e8
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_LINE_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,64}:[0-9]{1,6}$")
_DTYPES = {"<f4": np.float32, "<f8": np.float64, "<i4": np.int32, "<i8": np.int64, "|b1": np.bool_}
# the dtypes of numpy scalars, and the strings (order=, casting= arguments), that an operand may be: the
# recorder refuses any other at the line that uses it, since the replay would refuse the program
_SCALAR_DTYPES = ("<f4", "<f8", "<i4", "<i8", "<f2", "<u8", "<u4", "|i1", "|u1", "<i2", "<u2")
_STR_OPERANDS = ("C", "F", "A", "K", "same_kind", "unsafe", "safe", "equiv", "no")


FORMAT = "gpusim-program-2"
MAX_BODY_CHARS = 16 << 20  # the JSON text of the GPUs and launches (N = 1024, d = 64: about 1 M)


class RecordingError(GpuSimError):
    """A kernel the recorder cannot record, or a program the judge refuses to replay."""


# ----------------------------------------------------------------------------------------------
# Allow-lists: what a recorded program may compute (the judge resolves names only through these)
# ----------------------------------------------------------------------------------------------
_UFUNC_METHODS = ("__call__", "reduce", "accumulate", "outer")
# numpy functions reached through __array_function__ (np.where(traced, ...), np.sum(traced), ...)
_FUNCTIONS = {
    name: getattr(np, name)
    for name in (
        "where", "sum", "prod", "max", "min", "amax", "amin", "mean", "cumsum", "all", "any", "argmax", "argmin",
        "concatenate", "stack", "hstack", "vstack", "dot", "matmul", "inner", "outer", "reshape", "transpose",
        "swapaxes", "moveaxis", "broadcast_to", "expand_dims", "squeeze", "ravel", "atleast_1d", "atleast_2d",
        "zeros_like", "ones_like", "full_like", "empty_like", "copy", "clip", "nan_to_num", "tile", "repeat",
        "take", "tril", "triu", "diagonal", "isclose", "round", "abs", "square", "sqrt", "exp", "log",
        "isneginf", "isposinf",  # guards of -inf rows (isinf, isnan, isfinite are ufuncs: allowed as all are)
    )
    if hasattr(np, name)
}
# ndarray methods that neither a ufunc nor an array function covers, recorded explicitly
_METHODS = ("reshape", "transpose", "swapaxes", "squeeze", "ravel", "flatten", "astype", "copy", "dot",
            "repeat", "take", "__getitem__")
_MATMUL_LIKE = {"matmul", "dot", "inner"}


def _ufunc(name: Any) -> np.ufunc:
    f = getattr(np, name, None) if type(name) is str else None
    if not isinstance(f, np.ufunc) or f.nout != 1 or f.__name__ != name:
        raise RecordingError(f"the program uses {str(name)[:40]!r}, which is not a numpy ufunc a kernel may use")
    return f


# ----------------------------------------------------------------------------------------------
# Recording (worker side)
# ----------------------------------------------------------------------------------------------
class Traced(np.ndarray):
    """A register value derived from loaded data: an ndarray whose numpy operations are recorded.

    It behaves exactly like an ndarray (the results are computed by numpy on the plain data); the
    recorder only notes each operation and its operands. Outside a recording it is a plain array."""

    _tid: int | None = None
    _scope: Any = None

    def __array_finalize__(self, obj) -> None:  # views made by unrecorded means are constants
        self._tid, self._scope = None, None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        rec = _active_recorder()
        out = kwargs.pop("out", None)
        if out is not None and len(out) != 1:
            raise RecordingError("a ufunc with several outputs cannot be recorded")
        traced = (rec is not None and method in _UFUNC_METHODS and ufunc.nout == 1
                  and getattr(np, ufunc.__name__, None) is ufunc)
        if traced:  # operands are referenced BEFORE the call: out= may overwrite one of them
            body = [ufunc.__name__, method, [rec.ref(x) for x in inputs], {k: rec.ref(v) for k, v in kwargs.items()},
                    None if out is None else rec.ref(out[0])]
        plain_kw = {k: _plain(v) for k, v in kwargs.items()}
        if out is not None:
            plain_kw["out"] = (_plain(out[0]),)
        result = getattr(ufunc, method)(*(_plain(x) for x in inputs), **plain_kw)
        if not traced:  # not recording, or e.g. ufunc.at: computed, untraced (a constant from here on)
            return result
        return rec.op("U", body, result, inplace=None if out is None else out[0])

    def __array_function__(self, func, types, args, kwargs):
        rec = _active_recorder()
        name = getattr(func, "__name__", "")
        known = rec is not None and _FUNCTIONS.get(name) is func
        if known:
            body = [name, rec.ref(list(args)), {k: rec.ref(v) for k, v in kwargs.items()}]
        result = func(*_plain_tree(args), **_plain_tree(kwargs))
        if rec is None or not isinstance(result, (np.ndarray, np.generic)):
            return result  # not recording, or not an array (np.shape, np.ndim, ...): nothing to trace
        if not known:
            raise RecordingError(
                f"{_eng._caller()[0]}: np.{name[:40]} is not supported in a graded kernel (the grader replays "
                f"the kernel's arithmetic and knows {len(_FUNCTIONS)} numpy functions, the ufuncs and indexing)")
        return rec.op("F", body, result)

    def _method(self, name: str, *args, **kwargs):
        rec = _active_recorder()
        if rec is not None:
            body = [name, rec.ref(self), rec.ref(list(args)), {k: rec.ref(v) for k, v in kwargs.items()}]
        result = getattr(np.ndarray, name)(self.view(np.ndarray), *_plain_tree(args), **_plain_tree(kwargs))
        if rec is None or not isinstance(result, (np.ndarray, np.generic)):
            return result
        return rec.op("M", body, result)

    def reshape(self, *a, **k): return self._method("reshape", *a, **k)  # noqa: E704
    def transpose(self, *a, **k): return self._method("transpose", *a, **k)  # noqa: E704
    def swapaxes(self, *a, **k): return self._method("swapaxes", *a, **k)  # noqa: E704
    def squeeze(self, *a, **k): return self._method("squeeze", *a, **k)  # noqa: E704
    def ravel(self, *a, **k): return self._method("ravel", *a, **k)  # noqa: E704
    def flatten(self, *a, **k): return self._method("flatten", *a, **k)  # noqa: E704
    def astype(self, *a, **k): return self._method("astype", *a, **k)  # noqa: E704
    def copy(self, *a, **k): return self._method("copy", *a, **k)  # noqa: E704
    def dot(self, *a, **k): return self._method("dot", *a, **k)  # noqa: E704
    def repeat(self, *a, **k): return self._method("repeat", *a, **k)  # noqa: E704
    def take(self, *a, **k): return self._method("take", *a, **k)  # noqa: E704
    def __getitem__(self, key): return self._method("__getitem__", key)  # noqa: E704

    @property
    def T(self):  # noqa: N802 - numpy's name
        return self._method("transpose")

    def __setitem__(self, key, value) -> None:
        rec = _active_recorder()
        if rec is not None:
            rec.inplace_setitem(self, key, value)
        np.ndarray.__setitem__(self.view(np.ndarray), _plain_tree(key), _plain(value))

    def __bool__(self) -> bool:
        b = bool(self.view(np.ndarray))
        rec = _active_recorder()
        if rec is not None:
            rec.guard(self, b)
        return b


def _plain(x):
    return x.view(np.ndarray) if isinstance(x, Traced) else x


def _plain_tree(x):
    if isinstance(x, Traced):
        return x.view(np.ndarray)
    if type(x) in (list, tuple):
        return type(x)(_plain_tree(v) for v in x)
    if type(x) is dict:
        return {k: _plain_tree(v) for k, v in x.items()}
    return x


_RECORDERS: list["Recorder"] = []
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


def _op_line() -> str:
    """'file.py:line' of the kernel statement that made an operation: the first frame outside the
    simulator and outside numpy (ndarray.max, np.sum, ... reach the recorder through numpy's own code)."""
    f = sys._getframe(2)
    files = _eng._ENGINE_FILES
    while f is not None and (f.f_code.co_filename in files or f.f_code.co_filename.startswith(_NUMPY_DIR)):
        f = f.f_back
    if f is None:
        return "kernel:0"
    at = (f.f_code.co_filename, f.f_lineno)
    key = _eng._KEYS.get(at)
    if key is None:
        key = _eng._KEYS[at] = (f"{os.path.basename(at[0])}:{at[1]}", at[1], at[0])
    return key[0] if _LINE_KEY.match(key[0]) else "kernel:0"


def _active_recorder() -> "Recorder | None":
    """The recorder, while a recorded kernel runs (host code between launches is not recorded)."""
    if not _RECORDERS or _eng._ACTIVE is None:
        return None
    return _RECORDERS[-1]


class Recorder:
    """Collects one program: the GPUs, their buffers and launches, and each batch's events.
    ``counting=False``: the engine moves the values but counts nothing (the stats of the recorded
    run are then zeros): the grader counts in its own replay, so the worker need not."""

    def __init__(self, counting: bool = True) -> None:
        self.counting = bool(counting)
        self.gpus: list[dict] = []
        self.launches: list[dict] = []
        self.arrays: list[np.ndarray] = []
        self._intern: dict[tuple, int] = {}
        self._const_bytes = 0
        self._events = 0
        self._next = 0
        self.batch: list | None = None  # the current batch's event list
        self._op_last: str | None = None  # the kernel line of the batch's last operation event
        self._scope = None  # identifies the current batch: Traced values of other batches are constants
        self._gpu_ids: dict[int, int] = {}

    # ---- budgets -------------------------------------------------------------------------
    def _count(self, n: int = 1) -> None:
        self._events += n
        if self._events > MAX_EVENTS:
            raise RecordingError(f"the kernels issue more than {MAX_EVENTS} recorded instructions and operations: "
                                 f"too large to grade (use the shapes of the tests)")

    def const(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        if a.dtype.str not in _DTYPES:
            if a.dtype.kind in "iu":
                a = a.astype(np.int64)
            elif a.dtype.kind == "f":
                a = a.astype(np.float64)
            else:
                raise RecordingError(f"{_eng._caller()[0]}: an array of dtype {a.dtype} cannot be used in a graded kernel")
        key = (a.dtype.str, a.shape, a.tobytes())
        k = self._intern.get(key)
        if k is None:
            self._const_bytes += a.nbytes
            if self._const_bytes > MAX_CONST_BYTES:
                raise RecordingError(f"the program's constants exceed {MAX_CONST_BYTES >> 20} MiB: too large to grade")
            k = self._intern[key] = len(self.arrays)
            self.arrays.append(a.copy())
        return k

    # ---- references ----------------------------------------------------------------------
    def ref(self, x: Any) -> list:
        """A plain-data reference to an operand: a traced value, a constant or a Python value."""
        if isinstance(x, Traced) and x._tid is not None and x._scope is self._scope:
            return ["t", x._tid]
        if isinstance(x, np.ndarray):
            return ["a", self.const(x.view(np.ndarray) if isinstance(x, Traced) else x)]
        if x is None:
            return ["n"]
        if isinstance(x, (bool, np.bool_)):
            return ["b", bool(x)]
        if isinstance(x, (int, np.integer)):
            if abs(int(x)) > 1 << 62:
                raise RecordingError(f"{_eng._caller()[0]}: the integer {int(x)} is too large for a graded kernel "
                                     f"(at most 2**62 in magnitude)")
            return ["i", int(x), self._scalar_dtype(x, int)]
        if isinstance(x, (float, np.floating)):
            return ["f", float(x), self._scalar_dtype(x, float)]
        if type(x) in (list, tuple):
            return ["L" if type(x) is list else "T", [self.ref(v) for v in x]]
        if type(x) is slice:
            return ["s", self.ref(x.start), self.ref(x.stop), self.ref(x.step)]
        if x is Ellipsis:
            return ["e"]
        if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
            dt = np.dtype(x)
            if dt.str not in _DTYPES:
                raise RecordingError(f"{_eng._caller()[0]}: the dtype {dt} cannot be used in a graded kernel (the "
                                     f"simulated GPU computes in float32; float64, int32, int64 and bool may be used)")
            return ["d", dt.str]
        if type(x) is str:
            if x not in _STR_OPERANDS:
                raise RecordingError(f"{_eng._caller()[0]}: the string {x[:20]!r} cannot be an operand in a graded "
                                     f"kernel (only numpy's order= and casting= values can)")
            return ["str", x]
        raise RecordingError(f"{_eng._caller()[0]}: a {type(x).__name__} cannot be an operand in a graded kernel")

    @staticmethod
    def _scalar_dtype(x: Any, plain: type) -> str:
        """"" for a Python int or float, else the numpy scalar's dtype, one the replay rebuilds."""
        if type(x) is plain:
            return ""
        dt = np.dtype(type(x)).str
        if dt not in _SCALAR_DTYPES:
            raise RecordingError(f"{_eng._caller()[0]}: a numpy {np.dtype(type(x))} scalar cannot be an operand in a "
                                 f"graded kernel")
        return dt

    def _new(self, result) -> Traced:
        if isinstance(result, np.generic) or not isinstance(result, np.ndarray):
            result = np.asarray(result)
        t = result.view(Traced)
        t._tid, t._scope = self._next, self._scope
        self._next += 1
        return t

    def op(self, tag: str, body: list, result, inplace=None) -> Traced:
        """Record an operation; returns the result as a Traced value (``inplace``: the out= target)."""
        self._count()
        line = self._line()
        if inplace is not None and isinstance(inplace, Traced) and inplace._tid is not None and inplace._scope is self._scope:
            self.batch.append([tag, *body, inplace._tid, list(inplace.shape), *line])  # in place: the target keeps its id
            return inplace
        t = self._new(inplace if inplace is not None else result)
        self.batch.append([tag, *body, t._tid, list(t.shape), *line])  # the shape: the judge bounds it before computing
        return t

    def _line(self) -> list:
        """[the kernel line of this operation], or [] when the batch's previous operation had the same
        line (an expression makes several): the judge's messages name it (lanes.py)."""
        line = _op_line()
        if line == self._op_last:
            return []
        self._op_last = line
        return [line]

    def inplace_setitem(self, target: Traced, key, value) -> None:
        tgt = self.ref(target)
        if tgt[0] != "t":  # an untraced array: a constant, whatever is written into it
            return
        self._count()
        self.batch.append(["I", tgt, self.ref(key), self.ref(value), *self._line()])

    def guard(self, x: Traced, value: bool) -> None:
        self._count()
        self.batch.append(["G", self.ref(x), bool(value)])

    def event(self, ev: list) -> None:
        self._count()
        self.batch.append(ev)

    def loaded(self, value: np.ndarray) -> Traced:
        return self._new(value)

    # ---- GPUs, buffers, launches ---------------------------------------------------------
    def gpu_index(self, gpu) -> int:
        i = self._gpu_ids.get(id(gpu))
        if i is None:
            i = self._gpu_ids[id(gpu)] = len(self.gpus)
            self.gpus.append({"shared_rule": gpu.shared_rule, "race_check": gpu.race_check,
                              "max_shared_bytes": int(gpu.max_shared_bytes), "buffers": [], "_obj": gpu})
        return i

    def buffer(self, gpu, buf) -> None:
        g = self.gpus[self.gpu_index(gpu)]
        g["buffers"].append({"name": buf.name, "shape": list(buf.shape), "dtype": buf.dtype.str,
                             "data": self.const(buf.data)})

    def begin_launch(self, gpu, name: str, grid, block, args, blocks_at_once: bool) -> None:
        if len(self.launches) >= MAX_LAUNCHES:
            raise RecordingError(f"more than {MAX_LAUNCHES} launches: too many to grade")
        refs = []
        for a in args:
            if isinstance(a, _eng.Buffer):
                if a.gpu is not gpu:
                    raise RecordingError(f"buffer {a.name!r} belongs to another GPU than the launch")
                refs.append(["buf", a.name])
            else:
                refs.append(self.ref(a))
        self.launches.append({"gpu": self.gpu_index(gpu), "kernel": str(name)[:32], "grid": list(grid),
                              "block": list(block), "blocks_at_once": bool(blocks_at_once), "args": refs,
                              "batches": []})

    def begin_batch(self) -> None:
        self.batch = []
        self._op_last = None
        self._scope = object()
        self.launches[-1]["batches"].append(self.batch)

    def end_launch(self) -> None:
        self.batch, self._scope = None, None

    def program(self) -> dict:
        """The whole recording as plain data: the GPUs and launches (events included) as ONE JSON
        string (a single node on the wire, parsed in C on the other side), the arrays as tensors."""
        import json

        import torch

        gpus = [{k: v for k, v in g.items() if k != "_obj"} for g in self.gpus]
        return {
            "format": FORMAT,
            "body": json.dumps({"gpus": gpus, "launches": self.launches}, separators=(",", ":")),
            "arrays": [torch.from_numpy(a.copy()) for a in self.arrays],
        }


@contextlib.contextmanager
def record(counting: bool = True) -> Iterator[Recorder]:
    """Record every GPU, buffer and launch made inside the ``with`` (see the module docstring)."""
    rec = Recorder(counting)
    _RECORDERS.append(rec)
    try:
        yield rec
    finally:
        _RECORDERS.remove(rec)


def recording() -> Recorder | None:
    """The innermost active recorder (the engine's hooks ask), or None."""
    return _RECORDERS[-1] if _RECORDERS else None


# ----------------------------------------------------------------------------------------------
# Digest: a fingerprint of a program (the judge derives its own input seed from it)
# ----------------------------------------------------------------------------------------------
def digest(program: dict) -> str:
    """sha256 over the program as sent: its JSON body, then every array's dtype, shape and bytes.
    Raises RecordingError if it is not a packed program."""
    if type(program) is not dict or type(program.get("body")) is not str or type(program.get("arrays")) is not list:
        raise RecordingError("the recording is not a program")
    h = hashlib.sha256(program["body"].encode("utf-8", "surrogatepass"))
    for a in program["arrays"]:
        if not (hasattr(a, "numpy") and hasattr(a, "dtype")):
            raise RecordingError("the recording holds an array that is not a tensor")
        h.update(f"T{a.dtype}{tuple(a.shape)}".encode())
        h.update(a.contiguous().numpy().tobytes())
    return h.hexdigest()


def pack(unpacked: dict) -> dict:
    """The inverse of ``unpack`` (tests edit an unpacked program, then pack it again)."""
    import json

    body = {"gpus": unpacked["gpus"], "launches": unpacked["launches"]}
    return {"format": FORMAT, "body": json.dumps(body, separators=(",", ":")), "arrays": unpacked["arrays"]}


def unpack(program: dict) -> dict:
    """The packed program (as Recorder.program returns it) -> {"format", "gpus", "launches",
    "arrays"}: plain lists and dicts. Raises RecordingError for anything else."""
    import json

    if type(program) is not dict or program.get("format") != FORMAT:
        raise _fail("not a gpusim program")
    body = program.get("body")
    if type(body) is not str or len(body) > MAX_BODY_CHARS:
        raise RecordingError(f"the recording is not a program or its text exceeds {MAX_BODY_CHARS >> 20} M characters")
    try:
        tree = json.loads(body)
    except (ValueError, RecursionError):
        raise _fail("its text is not JSON") from None
    if type(tree) is not dict:
        raise _fail("its text is not an object")
    return {"format": FORMAT, "gpus": tree.get("gpus"), "launches": tree.get("launches"), "arrays": program.get("arrays")}


# ----------------------------------------------------------------------------------------------
# Replay (judge side)
# ----------------------------------------------------------------------------------------------
@dataclass
class Replayed:
    """What the judge measured in its own replay: every launch's stats merged, and the final
    contents of every GPU's buffers (gpu index -> name -> flat array)."""

    stats: dict
    buffers: list[dict[str, np.ndarray]]
    shapes: list[dict[str, tuple[int, ...]]]


def _fail(msg: str) -> RecordingError:
    return RecordingError(f"the recorded program is malformed: {msg}")


def _int(x, lo: int = 0, hi: int = 1 << 40) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise _fail("a count or size out of range")
    return x


def _name(x) -> str:
    if type(x) is not str or not _NAME.match(x):
        raise _fail("a buffer, shared-array or kernel name that is not a short identifier")
    return x


def _event_refs(ev: list) -> list[int]:
    """The traced values (ids) an event reads (lanes.traced_ids of its operands)."""
    return _lanes.traced_ids(ev[1:])


def thread_words(value, lanes: int, ax=None) -> int:
    """Words of a per-thread value that ONE thread holds. Its thread axis is ``ax`` (negative) where the
    lanes.py rule followed it (a rows-first product (B_r, B_c, d) made from q.T: axis -3), else by the
    engine's convention (engine.py) the last axis when it has one entry per thread (``lanes``); any
    other array is the same in every thread (a broadcast read, e.g. a (B_c, d) K tile read from shared
    memory with a uniform index), so each thread holds all of it. Broadcast axes (stride 0,
    np.broadcast_to) hold no values of their own. A numpy scalar is one word."""
    if not isinstance(value, np.ndarray):
        return 1
    shape, strides = value.shape, value.strides
    p = len(shape) + ax if type(ax) is int and 0 < -ax <= len(shape) else len(shape) - 1
    n = 1
    for i, (s, st) in enumerate(zip(shape, strides)):
        if i == p and s == lanes:
            continue
        if st != 0:
            n *= s
    return n


def block_words(value, ax, threads: int, blocks: int, lanes: int) -> int:
    """Words of a value that ONE thread block holds: a value with a thread axis (``ax``, negative; the
    lanes.py rule's, or the engine's last axis of one entry per thread) is held once per thread, its
    words without that axis times the block's ``threads``; a value the same in every thread of a
    block (a free value: a tile read with a uniform index, a constant; a thread axis of stride 0;
    with several blocks in a batch, a value equal along the thread axis within every block) is held
    once. Broadcast axes (stride 0) hold no values of their own."""
    if not isinstance(value, np.ndarray):
        return 1
    shape, strides, nd = value.shape, value.strides, value.ndim
    if ax is None and lanes > 1 and nd and shape[-1] == lanes and strides[-1] != 0:
        ax = -1
    p = None if ax is None or ax == "mixed" or -ax > nd else nd + ax
    n = 1
    for i, (s, st) in enumerate(zip(shape, strides)):
        if i != p and st != 0:
            n *= s
    if p is None or strides[p] == 0 or shape[p] != lanes:  # no thread axis, or one broadcast: alike
        return n
    if blocks > 1:  # one batch of several blocks: a block's broadcast read is per-lane, alike in its block
        v = np.moveaxis(value, p, -1).reshape(shape[:p] + shape[p + 1:] + (blocks, threads))
        if (v == v[..., :1]).all():
            return n
    return n * threads


_REDUCE_METHODS = {"sum", "prod", "max", "min", "mean", "all", "any"}


def _reduces(ev) -> bool:
    """Is the event a reduction (a ufunc's reduce, np.sum & co, x.sum() & co)?"""
    tag = ev[0]
    if tag == "U":
        return len(ev) >= 3 and ev[2] == "reduce"
    if tag == "F":
        return len(ev) >= 2 and ev[1] in _lanes.REDUCTIONS
    if tag == "M":
        return len(ev) >= 2 and ev[1] in _REDUCE_METHODS
    return False


class LiveState:
    """The values live at each point of one thread-block batch: in words per thread, and in words
    per block.

    A value is live from the instruction that makes it to the last instruction that reads it
    (read from the batch's events before it runs: ``last_use``). Views (reshape, .T, slices) share
    their base's registers: the values with one base (followed through ``ndarray.base``) count once,
    as the largest of them (``thread_words``, ``block_words``). ``peak`` is the most words live at
    one time in a thread, ``block_peak`` in a block: a value held alike by every thread of the block
    (``lanes``: the lanes.py rule's free values) once, a per-thread value once per thread. For the
    block, an elementwise product read only by a reduction in the next operation (``(k_j[:, :, None]
    * q).sum(1)``: a multiply-add, whose terms a GPU never holds) counts as nothing: its sum counts."""

    def __init__(self, events: list, lanes: int, checker=None, threads: int = 1, blocks: int = 1) -> None:
        self.lanes, self.checker, self.threads, self.blocks = lanes, checker, threads, blocks
        self.last_use: dict[int, int] = {}
        uses: dict[int, int] = {}
        for i, ev in enumerate(events):
            if type(ev) is list and ev:
                for tid in _event_refs(ev):
                    self.last_use[tid] = i
                    uses[tid] = uses.get(tid, 0) + 1
        self.uses = uses
        self.events = events
        self.where: dict[int, int] = {}  # live id -> its base's key
        self.groups: dict[int, dict[int, tuple[int, int]]] = {}  # base key -> {live id: (thread words, block words)}
        self.size: dict[int, tuple[int, int]] = {}  # base key -> words (the largest view)
        self.total = 0
        self.btotal = 0
        self.peak = 0
        self.block_peak = 0
        self.ends: dict[int, list[int]] = {}  # event index -> ids whose last use it is

    @staticmethod
    def _base(value) -> int:
        b = value
        while isinstance(b, np.ndarray) and isinstance(b.base, np.ndarray):
            b = b.base
        return id(b)

    def _set(self, key: int) -> None:
        g = self.groups[key]
        old = self.size.get(key, (0, 0))
        if g:
            new = (max(x[0] for x in g.values()), max(x[1] for x in g.values()))
            self.size[key] = new
        else:
            new = (0, 0)
            del self.groups[key]
            self.size.pop(key, None)
        self.total += new[0] - old[0]
        self.btotal += new[1] - old[1]

    def _fused(self, i: int, tid: int) -> bool:
        """Event ``i`` is an elementwise ufunc call (no out=) whose result only the next event reads, a
        reduction. (A value kept that way is uncounted between two events only: what the reduction
        makes counts at the next, so a held value cannot hide in a chain of them.)"""
        ev, evs = self.events[i], self.events
        return (type(ev) is list and len(ev) >= 7 and ev[0] == "U" and ev[2] == "__call__" and ev[5] is None
                and self.uses.get(tid) == 1 and self.last_use.get(tid) == i + 1 and i + 1 < len(evs)
                and type(evs[i + 1]) is list and bool(evs[i + 1]) and _reduces(evs[i + 1]))

    def define(self, i: int, tid: int, value) -> None:
        """Event ``i`` made (or wrote in place) the value ``tid``."""
        if tid in self.where:  # written in place (out=, or the same id again): same registers
            self._drop(tid)
        key = self._base(value)
        self.where[tid] = key
        ck = self.checker
        ax = ck.ax.get(tid) if ck is not None and ck.on else None
        bw = 0 if self._fused(i, tid) else block_words(value, ax, self.threads, self.blocks, self.lanes)
        self.groups.setdefault(key, {})[tid] = (thread_words(value, self.lanes, ax), bw)
        self._set(key)
        self.ends.setdefault(max(i, self.last_use.get(tid, i)), []).append(tid)

    def _drop(self, tid: int) -> None:
        key = self.where.pop(tid, None)
        if key is not None:
            self.groups[key].pop(tid, None)
            self._set(key)

    def after(self, i: int) -> None:
        """Event ``i`` is done: note the peaks, then free the values it read for the last time."""
        if self.total > self.peak:
            self.peak = self.total
        if self.btotal > self.block_peak:
            self.block_peak = self.btotal
        for tid in self.ends.pop(i, ()):
            if self.last_use.get(tid, i) <= i:
                self._drop(tid)


class _Replayer:
    def __init__(self, program: dict, replace: dict[tuple[int, str], np.ndarray]):
        if type(program) is not dict or program.get("format") != FORMAT:
            raise _fail("not a gpusim program")
        if "body" in program:
            program = unpack(program)
        arrays = program.get("arrays")
        if type(arrays) is not list:
            raise _fail("no array list")
        total = 0
        self.arrays: list[np.ndarray] = []
        for a in arrays:
            if not (hasattr(a, "numpy") and hasattr(a, "dtype")):
                raise _fail("an array that is not a tensor")
            arr = a.numpy()
            if arr.dtype.str not in _DTYPES:
                raise _fail("an array of an unsupported dtype")
            total += arr.nbytes
            if total > MAX_CONST_BYTES:
                raise RecordingError(f"the recorded program's constants exceed {MAX_CONST_BYTES >> 20} MiB")
            self.arrays.append(arr)
        self.launches = program.get("launches")
        gpus = program.get("gpus")
        if type(self.launches) is not list or type(gpus) is not list or len(self.launches) > MAX_LAUNCHES or len(gpus) > MAX_LAUNCHES:
            raise _fail("bad GPU or launch list")
        n_events = sum(len(b) for ln in self.launches if type(ln) is dict for b in (ln.get("batches") or []) if type(b) is list)
        if n_events > MAX_EVENTS:
            raise RecordingError(f"the recorded program has {n_events} events, more than the {MAX_EVENTS} the grader replays")
        self.gpus = []
        total_elements = 0
        for gi, g in enumerate(gpus):
            if type(g) is not dict or type(g.get("buffers")) is not list:
                raise _fail("bad GPU")
            gpu = _eng.GPU(shared_rule=g.get("shared_rule"), race_check="record",
                           max_shared_bytes=min(_int(g.get("max_shared_bytes")), _eng.MAX_SHARED_BYTES))
            for b in g["buffers"]:
                if type(b) is not dict:
                    raise _fail("bad buffer")
                name, dt = _name(b.get("name")), b.get("dtype")
                shape = b.get("shape")
                if dt not in ("<f4", "<i4") or type(shape) is not list or len(shape) > 8:
                    raise _fail(f"buffer {name}: bad dtype or shape")
                size = math.prod(_int(s, 1, MAX_BUFFER_ELEMENTS) for s in shape)
                total_elements += size
                if size > MAX_BUFFER_ELEMENTS or total_elements > MAX_TOTAL_ELEMENTS:
                    raise RecordingError(f"the global buffers hold more than {MAX_TOTAL_ELEMENTS} elements "
                                         f"({MAX_BUFFER_ELEMENTS} per buffer): too large to replay")
                data = replace.get((gi, name))
                if data is None:
                    data = self._array(b.get("data"))
                if data.size != size:
                    raise _fail(f"buffer {name}: initial contents do not match its shape")
                gpu.array(name, np.asarray(data).reshape(shape), _DTYPES[dt])
            self.gpus.append(gpu)
        self.work = 0

    def _array(self, k) -> np.ndarray:
        if type(k) is not int or not 0 <= k < len(self.arrays):
            raise _fail("a bad constant reference")
        return self.arrays[k]

    # ---- operands ----------------------------------------------------------------------
    def resolve(self, r, env: dict):
        if type(r) is not list or not r or type(r[0]) is not str:
            raise _fail("a bad operand")
        tag = r[0]
        if tag == "t":
            v = env.get(r[1]) if len(r) == 2 and type(r[1]) is int else None
            if v is None:
                raise RecordingError("the recorded program uses a value that no earlier instruction of the same "
                                     "thread block produced (registers do not persist across blocks or launches)")
            return v
        if tag == "a" and len(r) == 2:
            return self._array(r[1])
        if tag == "n":
            return None
        if tag == "b" and len(r) == 2 and type(r[1]) is bool:
            return r[1]
        if tag in ("i", "f") and len(r) == 3 and type(r[2]) is str:
            v = r[1]
            if tag == "i" and (type(v) is not int or abs(v) > 1 << 62) or tag == "f" and type(v) is not float:
                raise _fail("a bad scalar")
            if r[2] == "":
                return v
            if r[2] not in _SCALAR_DTYPES:
                raise _fail("a bad scalar dtype")
            return np.dtype(r[2]).type(v)
        if tag in ("L", "T") and len(r) == 2 and type(r[1]) is list:
            if len(r[1]) > 1 << 16:
                raise _fail("an operand list that is too long")
            items = [self.resolve(v, env) for v in r[1]]
            return items if tag == "L" else tuple(items)
        if tag == "s" and len(r) == 4:
            parts = [self.resolve(v, env) for v in r[1:]]
            if any(p is not None and type(p) is not int and not isinstance(p, np.integer) for p in parts):
                raise _fail("a bad slice")
            return slice(*parts)
        if tag == "e":
            return Ellipsis
        if tag == "d" and len(r) == 2 and r[1] in _DTYPES:
            return np.dtype(r[1])
        if tag == "str" and len(r) == 2 and type(r[1]) is str and r[1] in _STR_OPERANDS:
            return r[1]
        raise _fail(f"an operand of an unknown kind {str(tag)[:8]!r}")

    def _kw(self, kw, env) -> dict:
        if type(kw) is not dict or any(type(k) is not str or not _NAME.match(k) for k in kw):
            raise _fail("bad keyword arguments")
        return {k: self.resolve(v, env) for k, v in kw.items()}

    def _charge(self, n: float) -> None:
        self.work += n
        if self.work > MAX_WORK:
            raise RecordingError(f"the recorded arithmetic touches more than {MAX_WORK} elements: too much to replay")

    def _charge_args(self, vals) -> None:
        n = 0
        for v in vals:
            if isinstance(v, np.ndarray):
                n += v.size
            elif type(v) in (list, tuple):
                n += sum(x.size for x in v if isinstance(x, np.ndarray))
        self._charge(n + 1)

    def _compute(self, ev: list, env: dict, lanes: "_lanes.Checker", line: str | None):
        """Compute one operation event -> (its id, its value); ``lanes`` checks that it keeps every
        thread's values to that thread (lanes.py) and notes whether the result is per-thread."""
        tag = ev[0]
        if tag == "U":
            if len(ev) != 7:
                raise _fail("a bad ufunc event")
            _, name, method, args, kw, out, tid = ev
            f = _ufunc(name)
            if method not in _UFUNC_METHODS or type(args) is not list or len(args) > 4:
                raise _fail("a bad ufunc call")
            # numpy hands a ufunc override its inputs positionally and everything else (out= too) by
            # keyword: an operand more is an out= in disguise, an "out" keyword one the replay did not see
            if len(args) != (f.nin if method == "__call__" else 1 if method in ("reduce", "accumulate") else 2) or (
                    type(kw) is dict and "out" in kw):
                raise _fail("a ufunc call with its operands out of place")
            a = [self.resolve(x, env) for x in args]
            k = self._kw(kw, env)
            self._charge_args(a)
            if name == "matmul" and len(a) == 2:
                self._charge(_matmul_cost(a[0], a[1]))
            if out is not None:
                tgt = self.resolve(out, env)
                if not isinstance(tgt, np.ndarray):
                    raise _fail("an out= that is not an array")
                if out[0] == "a":  # a constant as out=: the worker wrote into its own copy
                    tgt = tgt.copy()
                k["out"] = (tgt,)
            res = getattr(f, method)(*a, **k)
            if lanes.on and not (method == "__call__" and not kw and out is None and f.signature is None
                                 and not lanes.poisoned and lanes.elementwise(tid, args, res)):
                lanes.note(tid, ev, lambda: lanes.ufunc(f, method, args, a, kw, k, out, res, line),
                           _lanes.is_traced(out))
            return tid, res
        if tag == "F":
            if len(ev) != 5:
                raise _fail("a bad function event")
            _, name, args, kw, tid = ev
            f = _FUNCTIONS.get(name) if type(name) is str else None
            if f is None:
                raise RecordingError(f"the program calls {str(name)[:40]!r}, which is not a numpy function a kernel may use")
            a = self.resolve(args, env)
            if type(a) is not list or args[0] != "L":
                raise _fail("bad function arguments")
            k = self._kw(kw, env)
            oloc = _lanes.bind(_lanes._params(f), len(a), k).get("out")
            a, k = self._own_out(oloc, args[1], a, kw, k)
            self._charge_args(a)
            if name in _MATMUL_LIKE and len(a) == 2:
                self._charge(_matmul_cost(a[0], a[1]))
            if name == "empty_like":  # uninitialised memory: replayed as zeros
                f = np.zeros_like
            if name in ("tile", "repeat", "broadcast_to", "full_like", "ones_like", "zeros_like", "empty_like"):
                res = f(*a, **k)
                self._charge(np.size(res))
            else:
                res = f(*a, **k)
            if lanes.on:
                lanes.note(tid, ev, lambda: lanes.function(name, f, args[1], a, kw, k, res, line),
                           _lanes.is_traced(_lanes.fetch(oloc, args[1], kw)))
            return tid, res
        if tag == "M":
            if len(ev) != 6:
                raise _fail("a bad method event")
            _, name, obj, args, kw, tid = ev
            if name not in _METHODS:
                raise RecordingError(f"the program calls the method {str(name)[:40]!r}, which a kernel may not use")
            o = self.resolve(obj, env)
            if not isinstance(o, (np.ndarray, np.generic)):
                raise _fail("a method on something that is not an array")
            o = np.asarray(o) if isinstance(o, np.generic) else o
            a = self.resolve(args, env)
            if type(a) is not list or args[0] != "L":
                raise _fail("bad method arguments")
            k = self._kw(kw, env)
            oloc = _lanes.bind(_lanes._params(getattr(np.ndarray, name), True), len(a), k).get("out")
            a, k = self._own_out(oloc, args[1], a, kw, k)
            self._charge(o.size)
            if name == "dot" and a:
                self._charge(_matmul_cost(o, a[0]))
            res = getattr(np.ndarray, name)(o, *a, **k)
            if name == "repeat":
                self._charge(res.size)
            if lanes.on:
                lanes.note(tid, ev, lambda: lanes.method(name, obj, o, args[1], a, kw, k, res, line),
                           _lanes.is_traced(_lanes.fetch(oloc, args[1], kw)))
            return tid, res
        raise _fail(f"an unknown event {str(tag)[:8]!r}")

    @staticmethod
    def _own_out(at, refs: list, a: list, krefs: dict, k: dict):
        """A constant given as out= (positional or keyword) is written into a copy, as ufuncs' are: the
        program's constants never change during a replay."""
        if at is None:
            return a, k
        ref = refs[at[1]] if at[0] == "p" else krefs.get(at[1]) if at[0] == "k" else None
        if type(ref) is list and ref and ref[0] == "a":
            if at[0] == "p":
                a = list(a)
                a[at[1]] = np.array(a[at[1]])
            else:
                k = {**k, at[1]: np.array(k[at[1]])}
        return a, k

    # ---- one launch ----------------------------------------------------------------------
    def run(self) -> Replayed:
        for ln in self.launches:
            if type(ln) is not dict:
                raise _fail("bad launch")
            gi = _int(ln.get("gpu"), 0, len(self.gpus) - 1)
            gpu = self.gpus[gi]
            grid = _eng._dim3(ln.get("grid"), "grid")
            block = _eng._dim3(ln.get("block"), "block")
            nblocks = grid.x * grid.y * grid.z
            if nblocks > MAX_BLOCKS:
                raise RecordingError(f"a launch of {nblocks} thread blocks: more than the {MAX_BLOCKS} the grader replays")
            at_once = ln.get("blocks_at_once")
            batches = ln.get("batches")
            if type(at_once) is not bool or type(batches) is not list or len(batches) != (1 if at_once else nblocks):
                raise _fail("a launch whose recorded thread-block batches do not match its grid")
            self.batch_blocks = nblocks if at_once else 1
            if self.batch_blocks * block.x * block.y * block.z > MAX_LANES:
                raise RecordingError(f"a launch runs more than {MAX_LANES} threads at once: too large to replay")
            args = []
            for a in ln.get("args") if type(ln.get("args")) is list else []:
                if type(a) is list and len(a) == 2 and a[0] == "buf":
                    buf = gpu.buffers.get(a[1]) if type(a[1]) is str else None
                    if buf is None:
                        raise _fail("a launch argument names no buffer of its GPU")
                    args.append(buf)
                else:
                    args.append(self.resolve(a, {}))
            it = iter(batches)

            def kernel(ctx, *_args, _gpu=gpu, _it=it):
                self._batch(ctx, _gpu, next(_it))

            kernel.__name__ = _name(ln.get("kernel"))
            gpu.launch(kernel, grid, block, *args, blocks_at_once=at_once)
        launches = [s for g in self.gpus for s in g.launches]
        # merge in launch order (the order the program made them)
        order = []
        counters = [0] * len(self.gpus)
        for ln in self.launches:
            order.append(self.gpus[ln["gpu"]].launches[counters[ln["gpu"]]])
            counters[ln["gpu"]] += 1
        assert len(order) == len(launches)
        stats = merge_stats(order)
        return Replayed(stats=stats, buffers=[{n: b.data.copy() for n, b in g.buffers.items()} for g in self.gpus],
                        shapes=[{n: b.shape for n, b in g.buffers.items()} for g in self.gpus])

    def _batch(self, ctx, gpu, events) -> None:
        if type(events) is not list:
            raise _fail("bad batch")
        env: dict[int, Any] = {}
        shared_words = 0
        wheres: list = []
        unrolled = [1]  # per open where(): the unrolled instructions of its mask (leading axes)
        self._charge(len(events))
        lanes = _lanes.Checker(ctx._Lu, ctx._T, ctx._block_ids, self._charge)  # registers are per thread (lanes.py)
        live = LiveState(events, ctx._Lu, lanes, ctx._T, ctx._B)
        op_line = None  # the kernel line of the last operation event that named one
        try:
            for i, ev in enumerate(events):
                if i:
                    live.after(i - 1)
                if type(ev) is not list or not ev or type(ev[0]) is not str:
                    raise _fail("a bad event")
                tag = ev[0]
                if tag in ("U", "F", "M"):
                    if type(ev[-1]) is str:  # the kernel line, where it changes (for messages only)
                        op_line, ev = (ev[-1] if _LINE_KEY.match(ev[-1]) else None), ev[:-1]
                    line = op_line
                    shape = ev[-1]
                    if type(shape) is not list or len(shape) > 32 or any(type(x) is not int or x < 0 for x in shape):
                        raise _fail("a bad result shape")
                    self._charge(math.prod(shape))  # before computing: the result's size is bounded first
                    tid, res = self._compute(ev[:-1], env, lanes, line)
                    if type(tid) is not int or list(np.shape(res)) != shape:
                        raise RecordingError("the replay of an operation gives another shape than the recording says")
                    env[tid] = res
                    live.define(i, tid, res)
                    continue
                if tag == "I":
                    if len(ev) not in (4, 5):
                        raise _fail("a bad assignment")
                    tgt = self.resolve(ev[1], env)
                    if ev[1][0] != "t" or not isinstance(tgt, np.ndarray):
                        raise _fail("an assignment into something that is not a traced array")
                    val = self.resolve(ev[3], env)
                    self._charge(np.size(val) + 1)
                    key = self.resolve(ev[2], env)
                    tgt[key] = val
                    if len(ev) == 5:
                        op_line = ev[4] if type(ev[4]) is str and _LINE_KEY.match(ev[4]) else None
                    if lanes.on:
                        line = op_line
                        self._charge(tgt.size)
                        lanes.setitem(ev[1], tgt, ev[2], key, ev[3], val, line)
                    continue
                if tag == "G":
                    if len(ev) != 3 or type(ev[2]) is not bool:
                        raise _fail("a bad guard")
                    if bool(self.resolve(ev[1], env)) != ev[2]:
                        raise RecordingError("the kernel's control flow depends on the loaded data (a Python if/while on a "
                                             "register value) and goes another way on the grader's inputs")
                    continue
                if tag == "W":
                    if len(ev) != 3:
                        raise _fail("a bad where()")
                    self._line(ev[2])
                    cond = self.resolve(ev[1], env)
                    lanes.effect([ev[1]], _line_of(ev[2]))
                    self._charge(max(_unrolled(cond), unrolled[-1]) * ctx._L)  # the mask is (unrolled..., lanes)
                    cm = ctx.where(cond)
                    cm.__enter__()
                    wheres.append(cm)
                    unrolled.append(max(unrolled[-1], _unrolled(cond)))
                    continue
                if tag == "P":
                    if not wheres:
                        raise _fail("a where() closed that was never opened")
                    wheres.pop().__exit__(None, None, None)
                    unrolled.pop()
                    continue
                if tag == "S":
                    if len(ev) != 5 or ev[3] not in ("<f4", "<i4"):
                        raise _fail("a bad shared declaration")
                    self._line(ev[4])
                    shared_words += _int(ev[2], 1, _eng.MAX_SHARED_BYTES) * self.batch_blocks
                    if shared_words > MAX_SHARED_WORDS:
                        raise RecordingError(f"a batch of blocks declares more than {MAX_SHARED_WORDS} words of shared "
                                             f"memory: too large to replay")
                    ctx.shared(_name(ev[1]), ev[2], _DTYPES[ev[3]])
                    continue
                if tag == "B":
                    if len(ev) != 2:
                        raise _fail("a bad barrier")
                    self._line(ev[1])
                    ctx.syncthreads()
                    continue
                if tag in ("LD", "ST", "AT"):
                    if len(ev) != 7 or ev[1] not in ("global", "shared") or ev[3] not in (1, 2, 4):
                        raise _fail("a bad memory instruction")
                    _, space, name, w, idx, val, line = ev
                    arr = (gpu.buffers if space == "global" else ctx._shared).get(name) if type(name) is str else None
                    if arr is None:
                        raise _fail(f"an access to an unknown {space} array")
                    self._line(line)
                    index = self.resolve(idx, env)
                    lanes.effect([idx, val] if tag != "LD" else [idx], _line_of(line))  # each thread's own, thread last
                    # the engine broadcasts index and mask to (unrolled..., lanes): that is the work
                    self._charge(max(_unrolled(index), unrolled[-1]) * ctx._L * w)
                    if tag == "LD":
                        if type(val) is not int:
                            raise _fail("a bad load result id")
                        env[val] = ctx.load(arr, index, w)
                        lanes.loaded(val, env[val])
                        live.define(i, val, env[val])
                    elif tag == "ST":
                        value = self.resolve(val, env)
                        self._charge(int(np.size(value)))
                        ctx.store(arr, index, w, value)
                    else:
                        self._charge(int(np.size(self.resolve(val, env))))
                        if space != "global" or w != 1:
                            raise _fail("a bad atomic")
                        ctx.atomic_add(arr, index, self.resolve(val, env))
                    continue
                raise _fail(f"an unknown event {tag[:8]!r}")
            if wheres:
                raise _fail("a where() left open")
            live.after(len(events) - 1)
            ctx._ctr.live_words_per_thread = max(ctx._ctr.live_words_per_thread, live.peak)
            ctx._ctr.live_words_per_block = max(ctx._ctr.live_words_per_block, live.block_peak)
        except (RecordingError, GpuSimError):
            raise
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError, MemoryError,
                ZeroDivisionError, np.exceptions.AxisError) as e:
            raise RecordingError(f"the recorded program fails on replay ({type(e).__name__})") from None
        finally:
            _eng._LINE = None

    def _line(self, line) -> None:
        if type(line) is not str or not _LINE_KEY.match(line):
            line = "kernel:0"
        _eng._LINE = (line, int(line.rsplit(":", 1)[1]), "")


def _line_of(line) -> str | None:
    """A recorded kernel line, for a message (None if it is not one)."""
    return line if type(line) is str and _LINE_KEY.match(line) else None


def _unrolled(x) -> int:
    """Unrolled instructions of a per-thread index or mask: the product of its leading axes."""
    shape = np.shape(x)
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


def _matmul_cost(a, b) -> int:
    a, b = np.asarray(a) if not isinstance(a, np.ndarray) else a, np.asarray(b) if not isinstance(b, np.ndarray) else b
    inner = a.shape[-1] if a.ndim else 1
    other = (b.shape[-1] if b.ndim >= 2 else 1)
    lead = max(a.size // max(inner, 1), 1)
    return lead * inner * other * max(1, b.size // max(inner * other, 1) if b.ndim > 2 else 1)


def replay(program: dict, replace: dict[tuple[int, str], np.ndarray] | None = None) -> Replayed:
    """Replay a recorded program (packed, or unpacked by ``unpack``) on fresh simulated GPUs; ``replace`` gives the initial contents of
    chosen buffers ((gpu index, buffer name) -> flat array), e.g. the judge's own inputs.

    Every counter comes from this replay's own engine; the buffers' final contents are returned.
    Raises RecordingError for a malformed program or one above the bounds."""
    with np.errstate(all="ignore"):
        return _Replayer(program, dict(replace or {})).run()
