"""Registers are per thread: the replay refuses arithmetic that moves values between threads.

The engine's value model (engine.py): a per-thread value is a numpy array whose LAST axis is the
thread, entry [..., j] being thread j's register(s). Plain numpy lets one array operation read
across that axis (``x.max(-1)``, ``x[..., ::-1]``, ``w @ x`` with the threads contracted,
``x.T``, fancy indexing, reshapes): on a GPU that is a data exchange between threads, which needs
shared memory and a barrier (or warp shuffles, which the simulator does not model, and which the
lecture's split-Q kernel does not need: §6.4, its threads exchange nothing). So the judge's replay
(trace.py) follows, for every value of a thread-block batch, whether it is per-thread:

- per-thread ("lane") values: a load with one index per thread, and every result of an operation
  with a per-thread operand. Its last axis has one entry per thread of the batch.
- the rest is "free": constants (index arrays from threadIdx, masks, np.zeros registers, Python
  numbers; they carry no loaded data) and values read with a uniform index (the same in every
  thread, e.g. a (B_c, d) K tile read from shared memory as a broadcast): any thread holds all of it.

An operation with a per-thread operand must keep each thread's entries to that thread:
- elementwise ufuncs and functions (np.where, np.clip, ...): broadcasting aligns every operand's
  last axis, so lane j of the result reads lane j of each per-thread operand;
- reductions (sum, max, ..., ufunc.reduce/accumulate) over any axis but the thread axis;
- matmul/dot with a free first operand and a per-thread second operand of >= 2 axes (``k_j @ q``:
  each thread multiplies the shared tile by its own vector); np.outer / ufunc.outer with the
  per-thread operand second;
- data movement (reshape, transpose, indexing, take, repeat, concatenate, ...) and in-place index
  assignment, checked on a "shadow": the same operation applied to arrays that hold each entry's
  thread number, so every entry of the result must come from its own thread (or from a free value);
- a per-thread value is never an index, a shape or a count (registers are not addressable by data),
  and never written into a free value (out=, x[i] = v).
Anything else is refused with one line that names a pair of threads, the operation and its kernel
line. Memory instructions are the legitimate exchange: an index, mask or stored value per thread
is what the engine executes per thread, and a value loaded with a uniform index is free.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import numpy as np

from .errors import GpuSimError

RULE = ("per-thread values are registers: a thread reads only its own (the last axis of a per-thread value is "
        "the thread); threads exchange values through shared memory and t.syncthreads() (§6.4; gpusim guide, "
        "\"Registers are per thread\")")

# What each allowed numpy function does with its operands (trace._FUNCTIONS).
ELEMENTWISE = {"where", "clip", "isclose", "round", "abs", "square", "sqrt", "exp", "log", "isneginf", "isposinf",
               "nan_to_num", "copy"}
REDUCTIONS = {"sum", "prod", "max", "min", "amax", "amin", "mean", "all", "any"}  # axis=None: every axis
REDUCTIONS_1 = {"cumsum", "argmax", "argmin"}  # axis=None: the flattened array
LIKE = {"zeros_like", "ones_like", "empty_like", "full_like"}
MATMUL = {"dot", "matmul", "inner", "outer"}
# data movement: function -> its data parameter (every other parameter is an axis, shape, count or index)
MOVES = {"reshape": "a", "transpose": "a", "swapaxes": "a", "moveaxis": "a", "broadcast_to": "array",
         "expand_dims": "a", "squeeze": "a", "ravel": "a", "atleast_1d": "arys", "atleast_2d": "arys", "tile": "A",
         "repeat": "a", "take": "a", "tril": "m", "triu": "m", "diagonal": "a", "concatenate": "arrays",
         "stack": "arrays", "hstack": "tup", "vstack": "tup"}
# which operands of an elementwise function may be per-thread (the others are parameters)
_ELEMENTWISE_DATA = {"where": ("condition", "x", "y"), "clip": ("a", "a_min", "a_max", "min", "max"),
                     "isclose": ("a", "b", "rtol", "atol"), "round": ("a",), "isneginf": ("x",), "isposinf": ("x",),
                     "nan_to_num": ("x",), "copy": ("a",), "abs": ("x", "where"), "square": ("x", "where"),
                     "sqrt": ("x", "where"), "exp": ("x", "where"), "log": ("x", "where")}
METHOD_MOVES = {"reshape", "transpose", "swapaxes", "squeeze", "ravel", "flatten", "repeat", "take", "__getitem__"}
_SHADOW_DROP = ("out", "dtype", "casting")  # keywords that do not move data (out: checked apart)

_SIGS: dict[Any, list[tuple[str, Any]]] = {}


def _params(f: Callable, method: bool = False) -> list[tuple[str, Any]]:
    """(name, kind) of f's parameters (a method: without self), cached."""
    key = (f, method)
    p = _SIGS.get(key)
    if p is None:
        p = [(q.name, q.kind) for q in inspect.signature(f).parameters.values()]
        _SIGS[key] = p = p[1:] if method else p
    return p


def bind(params: list[tuple[str, Any]], npos: int, kwnames) -> dict[str, tuple]:
    """Where each argument of a call went: name -> ("p", i) (positional i), ("v", i) (the positional
    arguments from i on, a *args parameter) or ("k", name) (a keyword). Raises TypeError for more
    positional arguments than the function takes."""
    loc: dict[str, tuple] = {}
    i = 0
    for name, kind in params:
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            if i < npos:
                loc[name] = ("p", i)
                i += 1
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            loc[name] = ("v", i)
            i = npos
    if i < npos:
        raise TypeError("too many positional arguments")
    for k in kwnames:
        loc[k] = ("k", k)
    return loc


def fetch(loc: tuple | None, pos: list, kw: dict, default=None):
    """The argument at a location of ``bind`` (a list for a *args parameter), or ``default``."""
    if loc is None:
        return default
    if loc[0] == "p":
        return pos[loc[1]]
    if loc[0] == "v":
        return list(pos[loc[1]:])
    return kw[loc[1]]


def _traced_ids(ref) -> list[int]:
    """The traced value ids inside an operand reference (any depth)."""
    out, stack = [], [ref]
    while stack:
        x = stack.pop()
        if type(x) is list:
            if len(x) == 2 and x[0] == "t" and type(x[1]) is int:
                out.append(x[1])
            else:
                stack.extend(x)
        elif type(x) is dict:
            stack.extend(x.values())
    return out


class LaneError(GpuSimError):
    """A register operation that moves values between threads (or indexes registers with data)."""


class LaneWriteError(LaneError):
    """Per-thread values written into a value that is the same in every thread (refused at once)."""


class Lanes:
    """Which values of one thread-block batch are per-thread, and the rule that keeps them so (module
    docstring). ``lanes``: threads of the batch (the last axis of a per-thread value); ``threads``:
    threads per block and ``blocks``: the batch's block ids, for the messages. With one thread there is
    nothing to mix: every check passes."""

    def __init__(self, lanes: int, threads: int, blocks: list) -> None:
        self.L, self.T, self.blocks = int(lanes), int(threads), blocks
        self.on = self.L > 1
        self.var: set[int] = set()  # ids of the per-thread values
        self.poisoned: dict[int, LaneError] = {}  # values made by mixing threads: refused where they take effect
        self._inplace = False  # the operation being checked writes into a traced value (out=)
        self._ids: np.ndarray | None = None

    # ---- bookkeeping -------------------------------------------------------------------
    def is_var(self, ref) -> bool:
        """Does the operand reference hold a per-thread value (anywhere inside it)?"""
        if type(ref) is list and len(ref) == 2 and ref[0] == "t":
            return ref[1] in self.var
        return bool(self.var) and any(i in self.var for i in _traced_ids(ref))

    def set(self, tid: int, per_thread: bool) -> None:
        if self.poisoned:
            self.poisoned.pop(tid, None)
        if per_thread:
            self.var.add(tid)
        else:
            self.var.discard(tid)

    def tainted(self, ev: list) -> LaneError | None:
        """The error of a value made by mixing threads that the event uses (None: it uses none)."""
        if not self.poisoned:
            return None
        for i in _traced_ids(ev[1:]):
            e = self.poisoned.get(i)
            if e is not None:
                return e
        return None

    def effect(self, ev: list) -> None:
        """A memory instruction, a where() mask or an assignment uses no value made by mixing threads."""
        e = self.tainted(ev)
        if e is not None:
            raise e

    def note(self, tid: int, ev: list, check: Callable[[], bool], inplace: bool) -> None:
        """After an operation event ran: note whether its result is per-thread (``check``), or poison
        it if it mixes threads or uses a poisoned value. A poisoned value is harmless while it only
        feeds other operations (numpy's printing of an array reads across it; float() of one entry is
        a constant anyway) and refused where it reaches memory, a where() mask or an assignment
        (``effect``). An operation that wrote into an existing value (``inplace``: out=) is refused at
        once: that value's other views hold the mixed data too."""
        e = self.tainted(ev)
        if e is None:
            self._inplace = False
            try:
                self.set(tid, check())
                return
            except LaneError as err:
                if self._inplace or isinstance(err, LaneWriteError):
                    raise
                e = err
        if inplace:
            raise e
        self.var.discard(tid)
        self.poisoned[tid] = e

    def loaded(self, tid: int, value) -> None:
        """A load: per-thread when it has one entry per thread (an index per thread), free when its
        last axis is 1 (a uniform index: every thread read the same words)."""
        self.set(tid, self.on and _last(value) == self.L)

    def ids(self) -> np.ndarray:
        """1 + the thread number of each lane (0 is kept for the zeros tril/triu write)."""
        if self._ids is None:
            self._ids = np.arange(1, self.L + 1, dtype=np.int32)
        return self._ids

    def shadow(self, x, per_thread: bool):
        """An array of x's shape holding 1 + the thread of each entry (per-thread) or -1 (free)."""
        if per_thread:
            return np.broadcast_to(self.ids(), np.shape(x))
        return np.broadcast_to(np.int32(-1), np.shape(x))

    # ---- messages ----------------------------------------------------------------------
    def _thread(self, lane: int) -> str:
        lane = int(lane)
        if len(self.blocks) <= 1:
            return str(lane)
        return f"{lane % self.T} of block {tuple(self.blocks[lane // self.T])}"

    def mixing(self, line: str | None, how: str, reader: int = 0, source: int = 1) -> LaneError:
        at = f"{line}: " if line else ""
        return LaneError(f"{at}{how}: thread {self._thread(reader)} would read a value of thread "
                         f"{self._thread(source)} without shared memory; {RULE}")

    def indexed(self, line: str | None, what: str) -> LaneError:
        at = f"{line}: " if line else ""
        return LaneError(f"{at}a per-thread value used as {what}: registers are not addressed (or shaped) by data, "
                         f"index shared memory with it instead; {RULE}")

    def into_free(self, line: str | None, what: str) -> LaneError:
        at = f"{line}: " if line else ""
        return LaneWriteError(f"{at}{what} writes per-thread values into a value that is the same in every thread; {RULE}")

    # ---- the checks --------------------------------------------------------------------
    def result(self, res, per_thread: bool, line, how: str) -> bool:
        """A per-thread result must keep the thread as its last axis (one entry per thread)."""
        if per_thread and _last(res) != self.L:
            raise self.mixing(line, f"{how} leaves no thread axis (a result of shape {tuple(np.shape(res))} from "
                                    f"per-thread values, which every thread would hold)")
        return per_thread

    def check_shadow(self, sh, res, line, how: str) -> None:
        """Every entry of a per-thread result comes from its own thread (or a free value, or is a 0 fill)."""
        sh = np.asarray(sh) if isinstance(sh, np.generic) else sh
        if not isinstance(sh, np.ndarray) or sh.shape != np.shape(res):
            raise self.mixing(line, f"{how} on per-thread values")
        if _last(sh) != self.L:
            src = sh[sh > 0]
            s = int(src.reshape(-1)[0]) - 1 if src.size else 1
            raise self.mixing(line, f"{how} leaves no thread axis (shape {sh.shape}: the threads' values are no "
                                    f"longer one per thread)", reader=1 if s == 0 else 0, source=s)
        bad = (sh > 0) & (sh != self.ids())
        if bad.any():
            at = np.unravel_index(int(np.flatnonzero(bad)[0]), sh.shape)
            raise self.mixing(line, f"{how} moves values across the thread axis", reader=at[-1],
                              source=int(sh[at]) - 1)

    def out_target(self, out_ref, per_thread: bool, line, how: str) -> bool:
        """out= into a traced value: a per-thread result may go only into a per-thread value (its views
        are per-thread too); the target stays per-thread whatever is written into it."""
        if not is_traced(out_ref):
            return per_thread
        if self.is_var(out_ref):
            return True
        if per_thread:
            raise self.into_free(line, f"{how} with out=")
        return False

    def reduction(self, x, axis, line, how: str, flat_if_none: bool = False) -> None:
        nd = np.ndim(x)
        if axis is None or nd == 0:
            raise self.mixing(line, f"{how} over every axis, the thread axis included" if not flat_if_none else
                              f"{how} over the flattened value, the thread axis included")
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        if any(operator.index(a) % nd == nd - 1 for a in axes):
            raise self.mixing(line, f"{how} over the thread axis (the last)")

    def matmul(self, va: bool, vb: bool, a, b, line, how: str, kind: str = "matmul") -> None:
        """kind: matmul/dot (a's last axis and b's second-to-last are contracted), inner (both last),
        outer (np.outer: both flattened), ufunc_outer (shape a.shape + b.shape)."""
        na, nb = np.ndim(a), np.ndim(b)
        if kind == "ufunc_outer":
            if va and nb > 0:
                raise self.mixing(line, f"{how} with the per-thread operand first (its thread axis is not the last)")
            return
        if kind == "outer":
            if va or (vb and nb != 1):
                raise self.mixing(line, f"{how} flattens a per-thread operand")
            return
        if na == 0 or nb == 0:  # a product with a scalar: elementwise
            return
        if va or (kind == "inner" and vb):
            raise self.mixing(line, f"{how} sums over the thread axis of a per-thread operand (use it as the "
                                    f"second operand: tile @ x, with x of shape (k, threads))")
        if vb and nb < 2:
            raise self.mixing(line, f"{how} sums over the thread axis of a per-thread vector")


def _last(x) -> int | None:
    """The size of the last axis of an array (None for a scalar or a non-array)."""
    if isinstance(x, np.ndarray):
        return x.shape[-1] if x.ndim else None
    return None


class Checker(Lanes):
    """The rule applied to the replay's operation events (trace._Replayer): each method gets the
    operands' references (which say what is per-thread) and resolved values, and the result, and
    returns whether the result is per-thread, or raises LaneError."""

    def ufunc(self, f: np.ufunc, method: str, arefs: list, a: list, krefs: dict, k: dict, out_ref, res, line) -> bool:
        self._inplace = is_traced(out_ref)
        if method == "__call__" and not krefs and out_ref is None and f.signature is None:  # the common case
            if any(self.is_var(r) for r in arefs):
                return self.result(res, True, line, f"np.{f.__name__}")
            return False
        name = f.__name__
        how = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
        vin = [self.is_var(r) for r in arefs]
        for key, r in krefs.items():
            if key != "where" and self.is_var(r):
                raise self.indexed(line, f"the {key}= of {how}")
        v = any(vin) or self.is_var(krefs.get("where"))
        if v:
            if method == "__call__":
                if f.signature is not None:  # a generalized ufunc: matmul, vecdot, matvec, vecmat
                    if name != "matmul" or "axes" in k or "axis" in k:
                        raise self.mixing(line, f"{how} contracts the thread axis")
                    self.matmul(vin[0], vin[1], a[0], a[1], line, how)
            elif method in ("reduce", "accumulate"):
                self.reduction(a[0], k.get("axis", 0), line, how)
            else:
                self.matmul(vin[0], vin[1], a[0], a[1], line, how, "ufunc_outer")
        v = self.out_target(out_ref, v, line, how)
        return self.result(res, v, line, how)

    def function(self, name: str, f: Callable, refs: list, a: list, krefs: dict, k: dict, res, line) -> bool:
        how = f"np.{name}"
        loc = bind(_params(f), len(refs), krefs)
        self._inplace = is_traced(fetch(loc.get("out"), refs, krefs))
        if name in MOVES:
            data: tuple = (MOVES[name],)
        elif name in ELEMENTWISE:
            data = _ELEMENTWISE_DATA[name]
        elif name in REDUCTIONS or name in REDUCTIONS_1:
            data = ("a", "where")
        elif name in LIKE:
            data = ("a", "prototype", "fill_value")
        elif name == "matmul":
            data = ("x1", "x2")
        elif name in MATMUL:
            data = ("a", "b")
        else:  # pragma: no cover - every allowed function has a kind (tests/test_gpusim_lanes.py)
            data = ()
        vd = {}
        for p, at in loc.items():
            per = self.is_var(fetch(at, refs, krefs))
            if p in data:
                vd[p] = per
            elif per and p != "out":
                raise self.indexed(line, f"the {p} of {how}")
        v = any(vd.values())
        if v:
            if name in REDUCTIONS or name in REDUCTIONS_1:
                self.reduction(fetch(loc.get("a"), a, k), fetch(loc.get("axis"), a, k), line, how,
                               flat_if_none=name in REDUCTIONS_1)
            elif name in LIKE and not vd.get("fill_value"):  # data-independent: per-thread if it has the axis
                v = _last(res) == self.L
            elif name in MATMUL:
                x, y = data
                kind = {"dot": "matmul", "matmul": "matmul", "inner": "inner", "outer": "outer"}[name]
                if name == "matmul" and ("axes" in loc or "axis" in loc):
                    raise self.mixing(line, f"{how} contracts the thread axis")
                self.matmul(vd.get(x, False), vd.get(y, False), fetch(loc.get(x), a, k), fetch(loc.get(y), a, k),
                            line, how, kind)
            elif name in MOVES:
                pos, kw = list(a), {kk: vv for kk, vv in k.items() if kk not in _SHADOW_DROP}
                for p in _SHADOW_DROP:  # positional out= (take, stack, concatenate): not part of the movement
                    at = loc.get(p)
                    if at is not None and at[0] == "p":
                        pos[at[1]] = None
                at = loc[MOVES[name]]
                if at[0] == "p":
                    pos[at[1]] = self._shadow_tree(refs[at[1]], a[at[1]])
                elif at[0] == "v":
                    for i in range(at[1], len(pos)):
                        pos[i] = self._shadow_tree(refs[i], a[i])
                else:
                    kw[at[1]] = self._shadow_tree(krefs[at[1]], k[at[1]])
                sh = f(*pos, **kw)
                self.check_shadow(sh, res, line, how)
        v = self.out_target(fetch(loc.get("out"), refs, krefs), v, line, how)
        return self.result(res, v, line, how)

    def method(self, name: str, oref, o, refs: list, a: list, krefs: dict, k: dict, res, line) -> bool:
        how = "indexing x[...]" if name == "__getitem__" else f"x.{name}()"
        loc = bind(_params(getattr(np.ndarray, name), method=True), len(refs), krefs)
        self._inplace = is_traced(fetch(loc.get("out"), refs, krefs))
        vo = self.is_var(oref)
        vother = False
        for p, at in loc.items():
            per = self.is_var(fetch(at, refs, krefs))
            if name == "dot" and p == "other":
                vother = per
            elif per and p != "out":
                raise self.indexed(line, "an index (of a register array)" if name == "__getitem__" else f"the {p} of {how}")
        v = vo or vother
        if v:
            if name == "dot":
                self.matmul(vo, vother, o, fetch(loc.get("other"), a, k), line, how)
            elif name in METHOD_MOVES:
                pos, kw = list(a), {kk: vv for kk, vv in k.items() if kk not in _SHADOW_DROP}
                at = loc.get("out")
                if at is not None and at[0] == "p":
                    pos[at[1]] = None
                sh = getattr(np.ndarray, name)(self.shadow(o, True), *pos, **kw)
                self.check_shadow(sh, res, line, how)
        v = self.out_target(fetch(loc.get("out"), refs, krefs), v, line, how)
        return self.result(res, v, line, how)

    def setitem(self, tref, tgt, kref, key, vref, val, line) -> None:
        how = "an assignment x[i] = v"
        if self.is_var(kref):
            raise self.indexed(line, f"the index of {how}")
        if not self.is_var(vref):
            return  # free values into a register: every thread holds them
        if not self.is_var(tref):
            raise self.into_free(line, how)
        sh = np.array(self.shadow(tgt, True))
        sh[key] = self.shadow(val, True)
        self.check_shadow(sh, tgt, line, how)

    def _shadow_tree(self, ref, val):
        """The shadow of an operand that may be a list or tuple of operands (np.concatenate's)."""
        if type(val) in (list, tuple) and type(ref) is list and ref and ref[0] in ("L", "T") and len(ref) == 2:
            return type(val)(self._shadow_tree(r, x) for r, x in zip(ref[1], val))
        return self.shadow(val, self.is_var(ref))


def is_traced(ref) -> bool:
    """Is the operand reference a traced value (not a constant)?"""
    return type(ref) is list and len(ref) == 2 and ref[0] == "t"
