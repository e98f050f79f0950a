"""Registers are per thread: the replay refuses arithmetic that moves values between threads.

The engine's value model (engine.py): a per-thread value is a numpy array with one axis over the
threads of the batch, entry j of that axis being thread j's register(s); the engine takes the LAST
axis as the thread wherever a value meets memory (an index, a stored value, a where() mask). Plain
numpy lets one array operation read across the thread axis (``x.max()``, ``x[::-1]``, ``x[5]``,
``w @ x`` with the threads contracted, a reshape or concatenation of the thread axis): on a GPU
that is an exchange of data between threads, which needs shared memory and a barrier (or warp
shuffles, which the simulator does not model and the lecture's split-Q kernel does not need: §6.4,
its threads exchange nothing). So the judge's replay (trace.py) follows every value of a
thread-block batch:

- a per-thread value: a load with one index per thread (its last axis is the thread), and the
  result of an operation with a per-thread operand, with the axis its thread axis went to (``x.T``
  of a (d, L) value is (L, d), the thread on axis -2: transposed layouts are fine);
- a free value: constants (index arrays from threadIdx, masks, np.zeros registers, Python numbers;
  they carry no loaded data) and values read with a uniform index (the same in every thread, e.g. a
  (B_c, d) K tile read from shared memory as a broadcast): any thread holds all of it.

An operation with a per-thread operand must keep each thread's entries to that thread:
- elementwise ufuncs and functions (np.where, np.clip, ...): every per-thread operand has its thread
  axis at the same place counted from the end, where broadcasting lines them up;
- reductions (sum, max, ..., ufunc.reduce/accumulate) over any axis but the thread axis;
- matmul/dot/inner/outer that contract no thread axis, with one per-thread operand (``k_j @ q``:
  each thread multiplies the shared tile by its own vector; ``q.T @ k_j.T`` alike);
- data movement (reshape, transpose, indexing, take, repeat, concatenate, ...) and index assignment,
  checked on a "shadow": the same operation applied to arrays that hold each entry's thread, so the
  result must have an axis along which every entry comes from its own thread (or a free value);
- a per-thread value is never an index, a shape or a count of an operation (registers are not
  addressed by data), never written into a free value (out=, x[i] = v), and has the thread as its
  last axis where it meets memory.
A value made otherwise is "poisoned": harmless while it only feeds other operations (numpy's
printing of an array reads across it), refused with one line that names two threads, the operation
and its kernel line where it takes effect (memory, a where() mask, an assignment). Memory
instructions are the legitimate exchange.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import numpy as np

from .errors import GpuSimError

RULE = ("per-thread values are registers: a thread reads only its own entries of a per-thread value; threads "
        "exchange values through shared memory and t.syncthreads() (§6.4; gpusim guide, \"Registers are per thread\")")

# What each allowed numpy function does with its operands (trace._FUNCTIONS).
ELEMENTWISE = {"where", "clip", "isclose", "round", "abs", "square", "sqrt", "exp", "log", "isneginf", "isposinf",
               "nan_to_num", "copy"}
REDUCTIONS = {"sum", "prod", "max", "min", "amax", "amin", "mean", "all", "any", "argmax", "argmin"}
FLAT_IF_NONE = {"cumsum", "argmax", "argmin"}  # axis=None: the flattened array (a reduction: every axis)
ACCUMULATIONS = {"cumsum"}  # keep the shape
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


def is_traced(ref) -> bool:
    """Is the operand reference a traced value (not a constant)?"""
    return type(ref) is list and len(ref) == 2 and ref[0] == "t"


def traced_ids(ref) -> list[int]:
    """The traced value ids inside an operand reference: every ``["t", id]``, at any depth (operand lists,
    keyword dicts, slices, in-place targets). Iterative: a hostile nesting cannot exhaust the stack; its
    size is bounded by the program text (trace.MAX_BODY_CHARS)."""
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


_CONTAINERS = ("L", "T", "s")  # operand references that may hold traced values (lists, tuples, slices)


def _last(x) -> int | None:
    """The size of the last axis of an array (None for a scalar or a non-array)."""
    if isinstance(x, np.ndarray):
        return x.shape[-1] if x.ndim else None
    return None


class LaneError(GpuSimError):
    """A register operation that moves values between threads (or indexes registers with data)."""


class LaneWriteError(LaneError):
    """Per-thread values written where they would reach other threads (refused at once)."""


class _Poison:
    __slots__ = ("error", "seq")

    def __init__(self, error: LaneError, seq: int) -> None:
        self.error, self.seq = error, seq


class Lanes:
    """The values of one thread-block batch: which are per-thread, on which axis (counted from the
    end: -1 is the last), and which were made by mixing threads (module docstring). ``lanes``:
    threads of the batch; ``threads``: per block, and ``blocks``: the batch's block ids, for the
    messages. With one thread there is nothing to mix: every check passes."""

    def __init__(self, lanes: int, threads: int, blocks: list, charge: Callable[[float], None] | None = None) -> None:
        self.L, self.T, self.blocks = int(lanes), int(threads), blocks
        self.charge = charge or (lambda n: None)  # the replay's work bound (the shadows are work too)
        self.on = self.L > 1
        self.ax: dict[int, int] = {}  # per-thread value id -> its thread axis (negative)
        self.poisoned: dict[int, _Poison] = {}  # values made by mixing threads: refused where they take effect
        self._inplace = False  # the operation being checked writes into a traced value (out=)
        self._made = 0  # poisons made so far (their order: a message names the first)
        self._ids: np.ndarray | None = None

    # ---- bookkeeping -------------------------------------------------------------------
    def axis(self, ref) -> int | None:
        """The thread axis of an operand (None: free). An operand list (np.concatenate's, or a list
        numpy turns into an array) has the axis its per-thread items share, counted from the end;
        items that disagree give "mixed"."""
        if type(ref) is list and ref:
            tag = ref[0]
            if tag == "t":
                return self.ax.get(ref[1]) if len(ref) == 2 and type(ref[1]) is int else None
            if type(tag) is str and tag not in _CONTAINERS:  # a constant or a Python value
                return None
        elif type(ref) is not dict:
            return None
        if not self.ax:
            return None
        found = {self.ax[i] for i in traced_ids(ref) if i in self.ax}
        if not found:
            return None
        return found.pop() if len(found) == 1 else "mixed"  # type: ignore[return-value]

    def set(self, tid: int, ax: int | None) -> None:
        if self.poisoned:
            self.poisoned.pop(tid, None)
        if ax is None:
            self.ax.pop(tid, None)
        else:
            self.ax[tid] = ax

    def tainted(self, ev: list) -> "_Poison | None":
        """The poison of a value made by mixing threads that the event uses (None: it uses none); of
        several, the one the kernel made first."""
        if not self.poisoned:
            return None
        found = [self.poisoned[i] for i in traced_ids(ev[1:]) if i in self.poisoned]
        return min(found, key=lambda p: p.seq) if found else None

    def effect(self, refs: list, line: str | None) -> None:
        """A memory instruction or a where() mask (its operand references: index, value, mask): it
        uses no value made by mixing threads, and its per-thread operands have the thread as their
        last axis (the engine's lanes)."""
        p = self.tainted([None, *refs])
        if p is not None:
            raise p.error
        if self.ax:
            for r in refs:
                a = self.axis(r)
                if a is not None and a != -1:
                    raise self.mixing(line, f"a per-thread value with the thread on axis {a}, not the last, used in "
                                            f"a memory instruction or where() (the engine takes the last axis as the "
                                            f"thread: move it there, e.g. x.T)")

    def note(self, tid: int, ev: list, check: Callable[[], int | None], inplace: bool) -> None:
        """After an operation event ran: note its result's thread axis (``check``), or poison the
        result if it mixes threads or uses a poisoned value. A poisoned value is harmless while it
        only feeds other operations (numpy's printing of an array reads across it; float() of one
        entry is a constant anyway) and refused where it takes effect (``effect``, ``setitem``). An
        operation that wrote into an existing value (``inplace``: out=) is refused at once: that
        value's other views hold the mixed data too."""
        p = self.tainted(ev)
        if p is None:
            self._inplace = False
            try:
                self.set(tid, check())
                return
            except LaneError as err:
                if self._inplace or isinstance(err, LaneWriteError):
                    raise
                p = _Poison(err, self._made)
                self._made += 1
        if inplace:
            raise p.error
        self.ax.pop(tid, None)
        self.poisoned[tid] = p

    def loaded(self, tid: int, value) -> None:
        """A load: per-thread (its last axis) when it has one entry per thread (an index per thread),
        free when its last axis is 1 (a uniform index: every thread read the same words)."""
        self.set(tid, -1 if self.on and _last(value) == self.L else None)

    def ids(self, ax: int = -1) -> np.ndarray:
        """1 + the thread of each lane, along axis ``ax`` (0 is kept for the zeros tril/triu write)."""
        if self._ids is None:
            self._ids = np.arange(1, self.L + 1, dtype=np.int32)
        return self._ids if ax == -1 else self._ids.reshape((self.L,) + (1,) * (-ax - 1))

    def shadow(self, x, ax: int | None):
        """An array of x's shape holding 1 + the thread of each entry (per-thread) or -1 (free)."""
        if ax == "mixed":
            raise LaneError("per-thread values whose thread axes do not line up")
        if ax is None:
            return np.broadcast_to(np.int32(-1), np.shape(x))
        return np.broadcast_to(self.ids(ax), np.shape(x))

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
        return LaneWriteError(f"{at}{what} writes per-thread values into a value that is the same in every thread; "
                              f"{RULE}")

    # ---- the rules ---------------------------------------------------------------------
    def fits(self, res, ax: int | None, line, how: str) -> int | None:
        """A per-thread result has one entry per thread along its thread axis."""
        if ax is not None and not (isinstance(res, np.ndarray) and res.ndim >= -ax and res.shape[ax] == self.L):
            raise self.mixing(line, f"{how} leaves no thread axis (a result of shape {tuple(np.shape(res))} from "
                                    f"per-thread values, which every thread would hold)")
        return ax

    def same(self, axes, line, how: str) -> int | None:
        """Elementwise: the per-thread operands' thread axes (counted from the end) must coincide."""
        found = {a for a in axes if a is not None}
        if not found:
            return None
        if len(found) > 1 or "mixed" in found:
            raise self.mixing(line, f"{how} combines per-thread values whose thread axes do not line up "
                                    f"(axes {sorted(a for a in found if a != 'mixed')})")
        return found.pop()

    def reduced(self, x, ax: int, axis, keepdims, line, how: str, keep_shape: bool = False) -> int:
        """A reduction over ``axis`` (None: every axis) of x, whose thread axis is ``ax``: the thread
        axis it leaves. keep_shape: an accumulation (cumsum, ufunc.accumulate)."""
        nd = np.ndim(x)
        if axis is None or nd == 0:
            raise self.mixing(line, f"{how} over every axis, the thread axis included")
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        red = {operator.index(a) % nd for a in axes}
        lane = nd + ax
        if lane in red:
            raise self.mixing(line, f"{how} over the thread axis (axis {ax})")
        if keep_shape or keepdims:
            return ax
        return ax + sum(1 for r in red if r > lane)

    def contracted(self, kind: str, a_ax, b_ax, a, b, res, line, how: str) -> int | None:
        """matmul/dot/inner/outer/ufunc.outer of a and b, with thread axes a_ax, b_ax (None: free):
        the result's thread axis, or LaneError when a thread axis is contracted or flattened."""
        na, nb, nr = np.ndim(a), np.ndim(b), np.ndim(res)
        if kind in ("dot", "inner") and (na == 0 or nb == 0):
            return self.same((a_ax, b_ax), line, how)  # a product with a scalar: elementwise
        if "mixed" in (a_ax, b_ax):
            raise self.mixing(line, f"{how} of per-thread values whose thread axes do not line up")
        sums = f"{how} sums over the thread axis of a per-thread operand"
        out: list[int] = []
        if a_ax is not None:
            p = na + a_ax  # position in a
            if kind == "ufunc_outer":
                out.append(p - nr)
            elif kind == "outer":
                if na != 1:
                    raise self.mixing(line, f"{how} flattens a per-thread operand")
                out.append(-2)
            elif kind == "matmul":
                if na == 1 or a_ax == -1:
                    raise self.mixing(line, sums)
                out.append(a_ax if nb >= 2 else a_ax + 1)
            else:  # dot, inner: a's last axis is contracted, the others come first in the result
                if a_ax == -1:
                    raise self.mixing(line, sums)
                out.append(p - nr)
        if b_ax is not None:
            q = nb + b_ax
            if kind == "ufunc_outer":
                out.append(na + q - nr)
            elif kind == "outer":
                if nb != 1:
                    raise self.mixing(line, f"{how} flattens a per-thread operand")
                out.append(-1)
            elif kind == "matmul":
                if nb == 1 or b_ax == -2:
                    raise self.mixing(line, sums)
                out.append(b_ax if (b_ax == -1 or na >= 2) else b_ax + 1)
            elif kind == "dot":
                if nb == 1 or b_ax == -2:
                    raise self.mixing(line, sums)
                out.append(-1 if b_ax == -1 else (na - 1) + q - nr)
            else:  # inner: b's last axis is contracted, the others follow a's
                if b_ax == -1:
                    raise self.mixing(line, sums)
                out.append((na - 1) + q - nr)
        if len(out) == 2 and out[0] != out[1]:
            raise self.mixing(line, f"{how} of two per-thread operands pairs every thread with every other")
        return out[0] if out else None

    def moved(self, sh, res, line, how: str) -> int | None:
        """Data movement: the result's thread axis, from its shadow (the thread of every entry), or
        LaneError when entries moved across threads. An axis of size L along which every entry that
        came from a thread lies at that thread's place."""
        sh = np.asarray(sh) if isinstance(sh, np.generic) else sh
        if not isinstance(sh, np.ndarray) or sh.shape != np.shape(res):
            raise self.mixing(line, f"{how} on per-thread values")
        lane = sh > 0
        if not lane.any():
            return None  # no entry of a thread reached the result
        cands = [a for a in range(-1, -sh.ndim - 1, -1) if sh.shape[a] == self.L]
        self.charge(sh.size * (1 + len(cands)))
        for a in cands:
            if ((~lane) | (sh == self.ids(a))).all():
                return a
        if not cands:
            s = int(sh[lane].reshape(-1)[0]) - 1
            raise self.mixing(line, f"{how} leaves no thread axis (shape {sh.shape}: the threads' values are no "
                                    f"longer one per thread)", reader=1 if s == 0 else 0, source=s)
        a = cands[0]
        bad = lane & (sh != self.ids(a))
        at = np.unravel_index(int(np.flatnonzero(bad)[0]), sh.shape)
        raise self.mixing(line, f"{how} moves values across the thread axis", reader=at[a], source=int(sh[at]) - 1)

    def out_target(self, out_ref, ax: int | None, line, how: str) -> int | None:
        """out= into a traced value: a per-thread result goes only into a per-thread value with the
        same thread axis (its views are per-thread too); the target stays per-thread whatever is
        written into it."""
        if not is_traced(out_ref):
            return ax
        t_ax = self.axis(out_ref)
        if t_ax is None:
            if ax is not None:
                raise self.into_free(line, f"{how} with out=")
            return None
        if ax is not None and ax != t_ax:
            raise self.mixing(line, f"{how} with out= a per-thread value whose thread axis is another")
        return t_ax


class Checker(Lanes):
    """The rule applied to the replay's operation events (trace._Replayer): each method gets the
    operands' references (which say what is per-thread) and resolved values, and the result, and
    returns the result's thread axis (None: free), or raises LaneError."""

    def elementwise(self, tid: int, arefs: list, res) -> bool:
        """The common case, checked with no more work than it needs: a plain elementwise ufunc call
        (no keywords, no out=) while nothing is poisoned. True: noted; False: not decided here (an
        operand list, axes that disagree, a result without the axis): ``note`` decides."""
        ax = None
        axmap = self.ax
        for r in arefs:
            if type(r) is not list or not r:
                return False
            tag = r[0]
            if tag == "t":
                a = axmap.get(r[1]) if len(r) == 2 and type(r[1]) is int else None
            elif type(tag) is str and tag not in _CONTAINERS:
                continue
            else:
                return False
            if a is not None:
                if ax is None:
                    ax = a
                elif a != ax:
                    return False
        if ax is None:
            axmap.pop(tid, None)
            return True
        if not (isinstance(res, np.ndarray) and res.ndim >= -ax and res.shape[ax] == self.L):
            return False
        axmap[tid] = ax
        return True

    def ufunc(self, f: np.ufunc, method: str, arefs: list, a: list, krefs: dict, k: dict, out_ref, res, line):
        self._inplace = is_traced(out_ref)
        if method == "__call__" and not krefs and out_ref is None and f.signature is None:  # the common case
            ax = self.same([self.axis(r) for r in arefs], line, f"np.{f.__name__}")
            return self.fits(res, ax, line, f"np.{f.__name__}")
        name = f.__name__
        how = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
        axes = [self.axis(r) for r in arefs]
        for key, r in krefs.items():
            if key != "where" and self.axis(r) is not None:
                raise self.indexed(line, f"the {key}= of {how}")
        w_ax = self.axis(krefs.get("where"))
        ax = None
        if any(x is not None for x in axes) or w_ax is not None:
            if method == "__call__":
                if f.signature is not None:  # a generalized ufunc: matmul, vecdot, matvec, vecmat
                    if name != "matmul" or "axes" in k or "axis" in k or w_ax is not None:
                        raise self.mixing(line, f"{how} contracts the thread axis")
                    ax = self.contracted("matmul", axes[0], axes[1], a[0], a[1], res, line, how)
                else:
                    ax = self.same(axes + [w_ax], line, how)
            elif method in ("reduce", "accumulate"):
                x_ax = self.same([axes[0], w_ax], line, how)
                ax = self.reduced(a[0], x_ax, k.get("axis", 0), k.get("keepdims", False), line, how,
                                  keep_shape=method == "accumulate")
            else:
                ax = self.contracted("ufunc_outer", axes[0], axes[1], a[0], a[1], res, line, how)
        ax = self.out_target(out_ref, ax, line, how)
        return self.fits(res, ax, line, how)

    def function(self, name: str, f: Callable, refs: list, a: list, krefs: dict, k: dict, res, line):
        if not self._any(refs, krefs):  # free operands only (the K/V tiles' reshapes): a free result
            self._inplace = False
            return None
        how = f"np.{name}"
        loc = bind(_params(f), len(refs), krefs)
        self._inplace = is_traced(fetch(loc.get("out"), refs, krefs))
        if name in MOVES:
            data: tuple = (MOVES[name],)
        elif name in ELEMENTWISE:
            data = _ELEMENTWISE_DATA[name]
        elif name in REDUCTIONS or name in ACCUMULATIONS:
            data = ("a", "where")
        elif name in LIKE:
            data = ("a", "prototype", "fill_value")
        elif name == "matmul":
            data = ("x1", "x2")
        elif name in MATMUL:
            data = ("a", "b")
        else:  # pragma: no cover - every allowed function has a kind (tests/test_gpusim_lanes.py)
            data = ()
        axes: dict[str, Any] = {}
        for p, at in loc.items():
            x = self.axis(fetch(at, refs, krefs))
            if p in data:
                axes[p] = x
            elif x is not None and p != "out":
                raise self.indexed(line, f"the {p} of {how}")
        ax = None
        if any(x is not None for x in axes.values()):
            if name in ELEMENTWISE:
                ax = self.same(axes.values(), line, how)
            elif name in REDUCTIONS or name in ACCUMULATIONS:
                x_ax = self.same(axes.values(), line, how)
                axis = fetch(loc.get("axis"), a, k)
                x = fetch(loc.get("a"), a, k)
                if axis is None and name in FLAT_IF_NONE:
                    raise self.mixing(line, f"{how} over the flattened value, the thread axis included")
                ax = self.reduced(x, x_ax, axis, fetch(loc.get("keepdims"), a, k, False), line, how,
                                  keep_shape=name in ACCUMULATIONS)
            elif name in LIKE:
                proto = axes.get("a", axes.get("prototype"))
                fill = axes.get("fill_value")
                p_shape = np.shape(fetch(loc.get("a", loc.get("prototype")), a, k))
                # a *_like value holds no data of its prototype: per-thread (its axis) if it has its shape
                ax = self.same([proto if np.shape(res) == p_shape else None, fill], line, how)
            elif name in MATMUL:
                x, y = data
                if name == "matmul" and ("axes" in loc or "axis" in loc):
                    raise self.mixing(line, f"{how} contracts the thread axis")
                ax = self.contracted(name, axes.get(x), axes.get(y), fetch(loc.get(x), a, k), fetch(loc.get(y), a, k),
                                     res, line, how)
            else:
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
                ax = self.moved(f(*pos, **kw), res, line, how)
        ax = self.out_target(fetch(loc.get("out"), refs, krefs), ax, line, how)
        return self.fits(res, ax, line, how)

    def method(self, name: str, oref, o, refs: list, a: list, krefs: dict, k: dict, res, line):
        if self.axis(oref) is None and not self._any(refs, krefs):  # free operands only: a free result
            self._inplace = False
            return None
        how = "indexing x[...]" if name == "__getitem__" else f"x.{name}()"
        loc = bind(_params(getattr(np.ndarray, name), method=True), len(refs), krefs)
        self._inplace = is_traced(fetch(loc.get("out"), refs, krefs))
        o_ax = self.axis(oref)
        other = None
        for p, at in loc.items():
            x = self.axis(fetch(at, refs, krefs))
            if name == "dot" and p == "other":
                other = x
            elif x is not None and p != "out":
                raise self.indexed(line, "an index (of a register array)" if name == "__getitem__" else f"the {p} of {how}")
        ax = None
        if o_ax is not None or other is not None:
            if name == "dot":
                ax = self.contracted("dot", o_ax, other, o, fetch(loc.get("other"), a, k), res, line, how)
            elif name in METHOD_MOVES:
                if o_ax is not None:
                    pos, kw = list(a), {kk: vv for kk, vv in k.items() if kk not in _SHADOW_DROP}
                    at = loc.get("out")
                    if at is not None and at[0] == "p":
                        pos[at[1]] = None
                    ax = self.moved(getattr(np.ndarray, name)(self.shadow(o, o_ax), *pos, **kw), res, line, how)
            else:  # astype, copy: the same shape, entry for entry
                ax = o_ax
        ax = self.out_target(fetch(loc.get("out"), refs, krefs), ax, line, how)
        return self.fits(res, ax, line, how)

    def setitem(self, tref, tgt, kref, key, vref, val, line) -> None:
        """x[key] = v: a free index; per-thread values go only into a per-thread value, each entry to
        its own thread's place."""
        how = "an assignment x[i] = v"
        p = self.tainted([None, tref, kref, vref])
        if p is not None:
            raise p.error
        if self.axis(kref) is not None:
            raise self.indexed(line, f"the index of {how}")
        v_ax = self.axis(vref)
        if v_ax is None:
            return  # free values into a register: every thread holds them
        t_ax = self.axis(tref)
        if t_ax is None:
            raise self.into_free(line, how)
        if v_ax == "mixed":
            raise self.mixing(line, f"{how} of per-thread values whose thread axes do not line up")
        sh = np.array(self.shadow(tgt, t_ax))
        sh[key] = self.shadow(val, v_ax)
        bad = (sh > 0) & (sh != self.ids(t_ax))
        if bad.any():
            at = np.unravel_index(int(np.flatnonzero(bad)[0]), sh.shape)
            raise LaneWriteError(str(self.mixing(line, f"{how} moves values across the thread axis",
                                                 reader=at[t_ax], source=int(sh[at]) - 1)))

    def _any(self, refs: list, krefs: dict) -> bool:
        """Does any operand (out= included) hold a per-thread or a traced out= value?"""
        return any(self.axis(r) is not None for r in refs) or any(
            self.axis(r) is not None or (key == "out" and is_traced(r)) for key, r in krefs.items())

    def _shadow_tree(self, ref, val):
        """The shadow of an operand that may be a list or tuple of operands (np.concatenate's)."""
        if type(val) in (list, tuple) and type(ref) is list and ref and ref[0] in ("L", "T") and len(ref) == 2:
            return type(val)(self._shadow_tree(r, x) for r, x in zip(ref[1], val))
        return self.shadow(val, self.axis(ref))
