"""The simulated GPU: CUDA semantics, executed in lockstep with numpy, counting every access.

A kernel is a Python function ``kernel(t, *args)``. ``t`` is the thread context of one thread
block (or of every block of the launch at once, see ``blocks_at_once``). Every per-thread value
is a numpy array whose LAST axis is the thread ("lane"); one Python statement is one warp-wide
instruction for every warp, never a loop over threads (Triton-interpreter style):

    tx = t.threadIdx.x                   # (L,) one entry per thread of the block
    x = A[row * n + tx]                  # a global load: one request per warp
    tile[tx] = x                         # a shared store
    t.syncthreads()                      # a barrier (advances the race detector's epoch)
    with t.where(tx < n):                # a divergent branch: lanes outside are inactive
        B[tx] = x

Leading axes of an index are UNROLLED instructions (one instruction per entry, as an unrolled
``for`` loop would issue them): ``tile[tx * 65 + unroll(64)]`` is 64 loads, and returns a
(64, L) array: register c of every thread is row c. An index whose last axis has size 1 is the
same for every thread (a broadcast). float2/float4 accesses go through ``A.f2[i]``/``A.f4[i]``
(element index i, a multiple of 2/4) and return (..., 2|4, L).

Counting rules (documented with their Nsight Compute metrics in docs/gpusim_guide.md):
- global: a request is a warp instruction with >= 1 active lane; its sectors are the distinct
  32-byte aligned segments the active lanes touch; useful bytes are the distinct bytes they touch.
  DRAM bytes with no cache = sectors x 32; with an ideal cache each sector of a buffer is counted
  once per launch (reads and writes separately).
- shared ("course" rule): wavefronts = max over the 32 banks (4-byte words, bank = word % 32) of
  the number of distinct words the active lanes touch there, every word of a vector access
  included; lanes reading the same word cost nothing extra (broadcast). The "quarter-warp" rule
  processes 128-bit accesses one quarter-warp (8 lanes) at a time, as recent hardware does.
- atomics: element operations (active lanes) and sectors, resolved in L2 (not in the DRAM bytes).
- races: syncthreads() advances an epoch; a shared word written by one warp and read or written
  by another warp of the same block in the same epoch is a race.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from .counters import SECTOR_BYTES, WORD_BYTES, LaunchCounters, merge_stats  # noqa: F401 (re-exported)
from .errors import (
    DivergentBarrierError,
    GpuSimError,
    KernelShapeError,
    LaunchError,
    MisalignedAccessError,
    OutOfBoundsError,
    RaceError,
    SharedMemoryError,
)

WARP_SIZE = 32
NUM_BANKS = 32
ELEMS_PER_SECTOR = SECTOR_BYTES // WORD_BYTES
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_BYTES = 227 * 1024  # H100: the most shared memory one block may opt in to
SHARED_RULES = ("course", "quarter-warp")
RACE_MODES = ("record", "raise", "off")

# Frames in these files are skipped when looking for the kernel line that made an access
# (contextlib: t.where() is a generator-based context manager).
_ENGINE_FILES = {os.path.abspath(__file__), __file__, contextlib.__file__,
                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace.py")}
# Set by a replay (course.gpusim.trace): the recorded source line of the instruction being replayed.
_LINE: "tuple[str, int, str] | None" = None


class Dim3(NamedTuple):
    x: Any
    y: Any
    z: Any


def unroll(n: int) -> np.ndarray:
    """np.arange(n) as a column (n, 1): n unrolled instructions, the same for every thread.

    ``tile[tx * 65 + unroll(64)]`` issues 64 loads; ``unroll(a)[:, None] * d + unroll(b)`` is an
    (a, b, 1) block of a*b instructions (the index of a doubly unrolled loop)."""
    return np.arange(int(n), dtype=np.int64).reshape(int(n), 1)


def host_array(data: Any, dtype: Any = None) -> np.ndarray:
    """Host data as a numpy array: a numpy array, a torch tensor (any device) or nested lists."""
    if hasattr(data, "detach"):  # a torch tensor
        data = data.detach().cpu().numpy()
    return np.asarray(data, dtype)


def _bcast(a: np.ndarray, shape: tuple) -> np.ndarray:
    """np.broadcast_to, skipped when the array already has the shape (the common case)."""
    return a if getattr(a, "shape", None) == tuple(shape) else np.broadcast_to(a, shape)


def _dim3(v: Any, what: str) -> Dim3:
    if isinstance(v, (int, np.integer)):
        v = (int(v),)
    try:
        vals = [int(x) for x in v]
    except TypeError:
        raise LaunchError(f"{what} must be an int or a tuple of up to 3 ints, got {v!r}") from None
    if not 1 <= len(vals) <= 3 or any(x < 1 for x in vals):
        raise LaunchError(f"{what} must be 1 to 3 positive ints, got {tuple(vals)}")
    vals += [1] * (3 - len(vals))
    return Dim3(*vals)


# ----------------------------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------------------------
class _Vec:
    """``buf.f2[i]`` / ``buf.f4[i]``: 8- or 16-byte vector access at element index i."""

    __slots__ = ("buf", "width")

    def __init__(self, buf: "_Array", width: int):
        self.buf, self.width = buf, width

    def __getitem__(self, idx):
        return _active(self.buf).load(self.buf, idx, self.width)

    def __setitem__(self, idx, value):
        _active(self.buf).store(self.buf, idx, self.width, value)


class _Array:
    space = ""

    def __init__(self, name: str, size: int, dtype):
        self.name, self.size, self.dtype = name, int(size), np.dtype(dtype)
        self.f2, self.f4 = _Vec(self, 2), _Vec(self, 4)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx):
        return _active(self).load(self, idx, 1)

    def __setitem__(self, idx, value):
        _active(self).store(self, idx, 1, value)


class Buffer(_Array):
    """A global-memory array: flat, 4-byte elements, indexed by element like a ``float*``.

    Create with GPU.array / GPU.zeros / GPU.full; read back on the host with ``.numpy()``."""

    space = "global"

    def __init__(self, gpu: "GPU", name: str, data: np.ndarray):
        super().__init__(name, data.size, data.dtype)
        self.gpu, self.shape = gpu, tuple(data.shape)
        self.data = np.ascontiguousarray(data).reshape(-1)
        self.nsectors = -(-self.size // ELEMS_PER_SECTOR)

    def numpy(self) -> np.ndarray:
        """A host copy, in the shape the buffer was created with."""
        return self.data.reshape(self.shape).copy()

    def __repr__(self) -> str:
        return f"Buffer({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class SharedArray(_Array):
    """Per-block shared memory, declared in the kernel with ``t.shared(name, size)``."""

    space = "shared"

    def __init__(self, name: str, size: int, dtype, nblocks: int, track_races: bool, warps: int = 1):
        super().__init__(name, size, dtype)
        # A real GPU leaves shared memory uninitialised; NaN makes a read-before-write visible.
        fill = np.nan if self.dtype.kind == "f" else 0
        self.data = np.full(nblocks * self.size, fill, dtype=self.dtype)
        # which words some thread has stored to (counting runs: a read of another word is reported,
        # "unwritten_reads" in the stats: garbage on a real GPU, never an error, a pad word may be read)
        self.written = np.zeros(nblocks * self.size, bool)
        if track_races:
            n = nblocks * self.size
            self.w_epoch = np.full(n, -1, np.int64)  # epoch of the last write
            self.w_warp = np.zeros(n, np.int64)  # warp (within its block) of the last write
            self.r_epoch = np.full(n, -1, np.int64)  # epoch of the reads recorded in r_seen
            self.r_seen = np.zeros((n, warps), bool)  # r_seen[word, w]: warp w read it in r_epoch
            self.last_write_ep = np.full(nblocks, -1, np.int64)  # per block: epoch of its last write
            self.last_read_ep = np.full(nblocks, -1, np.int64)  # per block: epoch of recorded reads
            # Reads not yet entered in r_seen: (thunk -> (flat words, warps), epochs at the time).
            # They matter only if a write follows in the same epoch, so they are entered lazily.
            self.pending: list = []

    def __repr__(self) -> str:
        return f"SharedArray({self.name!r}, size={self.size})"


def _words(flat: np.ndarray, w: int, act) -> np.ndarray:
    """The flat words an access of width w touches in its active lanes (1-D)."""
    sel = flat[act] if act is not None else flat.reshape(-1)
    return (sel.reshape(-1, 1) + np.arange(w)).reshape(-1) if w > 1 else sel.reshape(-1)


_ACTIVE: "ThreadContext | None" = None


def _active(arr: _Array) -> "ThreadContext":
    if _ACTIVE is None:
        raise GpuSimError(
            f"{arr.name}[...] used outside a kernel: access GPU memory only inside a launched kernel "
            f"(read results on the host with buffer.numpy())"
        )
    return _ACTIVE


_KEYS: dict[tuple[str, int], tuple[str, int, str]] = {}


def _caller() -> tuple[str, int, str]:
    """(key 'file.py:line', line, file) of the first frame outside this engine: the kernel line."""
    if _LINE is not None:
        return _LINE
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename in _ENGINE_FILES:
        f = f.f_back
    if f is None:  # pragma: no cover - only when called from the engine itself
        return "?:0", 0, "?"
    at = (f.f_code.co_filename, f.f_lineno)
    key = _KEYS.get(at)
    if key is None:
        key = _KEYS[at] = (f"{os.path.basename(at[0])}:{at[1]}", at[1], at[0])
    return key


# ----------------------------------------------------------------------------------------------
# The thread context: executes the memory instructions of one batch of blocks
# ----------------------------------------------------------------------------------------------
class _Mask:
    """An active-lane mask: ``m`` over the kernel's threads (…, B·T) or None (all active);
    ``padded()`` over the warp-padded lanes (…, B·Tp) that the counting works on."""

    __slots__ = ("m", "ctx", "_padded", "_warp_any")

    def __init__(self, m: np.ndarray | None, ctx: "ThreadContext"):
        self.m, self.ctx, self._padded, self._warp_any = m, ctx, False, None

    def padded(self) -> np.ndarray | None:
        if self._padded is False:
            ctx = self.ctx
            if ctx._T == ctx._Tp:
                self._padded = self.m
            elif self.m is None:
                self._padded = ctx._real
            else:
                self._padded = ctx._pad(self.m, False)
        return self._padded

    def warp_any(self) -> np.ndarray | None:
        """(*mask_unroll, BW): does warp w have an active lane (None: every warp does)."""
        m = self.padded()
        if m is None:
            return None
        if self._warp_any is None:
            self._warp_any = m.reshape(m.shape[:-1] + (self.ctx._BW, WARP_SIZE)).any(-1)
        return self._warp_any


class ThreadContext:
    """What a kernel sees as ``t``: thread/block indices, shared memory, barriers, masks, atomics.

    Per-thread arrays have one entry per thread of the block (L = blockDim.x·y·z), or of every
    block with blocks_at_once (L = blocks × threads). Attributes: ``threadIdx``, ``blockIdx``
    (ints, or per-thread arrays with blocks_at_once), ``blockDim``, ``gridDim`` (Dim3 of ints),
    ``tid`` (linear thread index in the block), ``lane`` and ``warp`` ((L,) arrays), ``nthreads``
    (L), ``warp_size`` (32). Internally a partial last warp is padded with inactive lanes."""

    warp_size = WARP_SIZE

    def __init__(self, gpu: "GPU", ctr: LaunchCounters, grid: Dim3, block: Dim3, block_ids: list[tuple[int, int, int]]):
        self.gpu, self._ctr = gpu, ctr
        self.gridDim, self.blockDim = grid, block
        T = block.x * block.y * block.z
        W = -(-T // WARP_SIZE)
        Tp = W * WARP_SIZE
        B = len(block_ids)
        self._T, self._W, self._Tp, self._B = T, W, Tp, B
        self._BW, self._L, self._Lu = B * W, B * Tp, B * T  # warps, padded lanes, threads
        self.nthreads = B * T
        tl = np.arange(B * T, dtype=np.int64) % T
        self.tid = tl
        self.lane = tl % WARP_SIZE
        self.warp = tl // WARP_SIZE
        self.threadIdx = Dim3(tl % block.x, (tl // block.x) % block.y, tl // (block.x * block.y))
        if B == 1:
            self.blockIdx = Dim3(*block_ids[0])
        else:
            ids = np.asarray(block_ids, dtype=np.int64)  # (B, 3)
            rep = np.repeat(ids, T, axis=0)
            self.blockIdx = Dim3(rep[:, 0], rep[:, 1], rep[:, 2])
        self._block_ids = block_ids
        lanes = np.arange(self._L, dtype=np.int64)
        self._lane_block = lanes // Tp  # which block of the batch each (padded) lane belongs to
        self._real = None if T == Tp else (lanes % Tp) < T  # padding lanes are never active
        self._masks = [_Mask(None, self)]
        self._shared: dict[str, SharedArray] = {}
        self._shared_bytes = 0
        self._epoch = np.zeros(B, np.int64)
        self._races_on = gpu.race_check != "off" and W > 1
        self._quarter = gpu.shared_rule == "quarter-warp"
        self._rec = _recorder()  # course.gpusim.trace: records the instructions when grading
        # A recorder may switch counting off: the grader counts in its own replay, not here.
        self._counting = self._rec is None or self._rec.counting
        self._races_on = self._races_on and self._counting

    # ------------------------------------------------------------------ public kernel API
    def shared(self, name: str, size: int, dtype=np.float32) -> SharedArray:
        """Declare a per-block shared array of ``size`` 4-byte elements (like ``__shared__ float a[size]``)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != WORD_BYTES:
            raise SharedMemoryError(f"shared array {name!r}: dtype must have 4-byte elements (float32/int32), got {dtype}")
        if name in self._shared:
            raise SharedMemoryError(f"shared array {name!r} declared twice in one block: give each array its own name")
        size = int(size)
        if size < 1:
            raise SharedMemoryError(f"shared array {name!r} must have at least 1 element, got {size}")
        self._shared_bytes += size * WORD_BYTES
        if self._shared_bytes > self.gpu.max_shared_bytes:
            raise SharedMemoryError(
                f"{_caller()[0]}: shared memory per block would be {self._shared_bytes} bytes, more than the "
                f"{self.gpu.max_shared_bytes} a block may have: use smaller tiles"
            )
        self._ctr.shared_bytes_per_block = max(self._ctr.shared_bytes_per_block, self._shared_bytes)
        arr = SharedArray(name, size, dtype, self._B, self._races_on, self._W)
        self._shared[name] = arr
        if self._rec is not None:
            self._rec.event(["S", name, size, dtype.str, _caller()[0]])
        return arr

    @contextmanager
    def where(self, cond) -> Iterator[None]:
        """Run the body with only the lanes where ``cond`` holds active (a divergent ``if``).

        ``cond``: bool per thread (last axis L), a bool, or per unrolled instruction (..., L)."""
        c = np.asarray(cond)
        if c.dtype != np.bool_:
            raise KernelShapeError(f"{_caller()[0]}: where() needs a boolean condition, got dtype {c.dtype}")
        if c.ndim and c.shape[-1] not in (1, self._Lu):
            raise KernelShapeError(
                f"{_caller()[0]}: where() condition has last axis {c.shape[-1]}; it must be one value per "
                f"thread ({self._Lu}) or 1"
            )
        cur = self._masks[-1].m
        if cur is not None:
            new = cur & c
        elif c.ndim == 0:
            new = None if bool(c) else np.zeros(self._Lu, bool)
        else:
            new = _bcast(c, c.shape[:-1] + (self._Lu,))
        if self._rec is not None:
            self._rec.event(["W", self._rec.ref(cond), _caller()[0]])
        self._masks.append(_Mask(new, self))
        try:
            yield
        finally:
            self._masks.pop()
            if self._rec is not None:
                self._rec.event(["P"])

    @property
    def active(self) -> np.ndarray:
        """Bool (…, L): the lanes active at this point (inside the enclosing where() blocks)."""
        m = self._masks[-1].m
        return np.ones(self._Lu, bool) if m is None else m

    def syncthreads(self) -> None:
        """__syncthreads(): every thread of the block must reach it (not inside a divergent where)."""
        key, lineno, fname = _caller()
        m = self._masks[-1].m
        B, T = self._B, self._T
        if m is None:
            part = np.ones(B, bool)
        else:
            if m.ndim != 1:
                if any(s != 1 for s in m.shape[:-1]):
                    raise DivergentBarrierError(f"{key}: syncthreads() inside a where() over unrolled instructions")
                m = m.reshape(-1)
            mb = m.reshape(B, T)
            part, full = mb.any(1), mb.all(1)
            bad = np.flatnonzero(part & ~full)
            if bad.size:
                b = int(bad[0])
                raise DivergentBarrierError(
                    f"{key}: syncthreads() reached by only {int(mb[b].sum())} of {T} threads of block "
                    f"{self._block_ids[b]}: a barrier inside a divergent branch deadlocks on a real GPU; "
                    f"move it out of the where()"
                )
        self._epoch[part] += 1
        if self._races_on and part.all():  # queued reads are now of a past epoch: drop them
            for arr in self._shared.values():
                arr.pending.clear()
        if self._rec is not None:
            self._rec.event(["B", key])
        warps = int(part.sum()) * self._W
        c = self._ctr.line(key, lineno, fname)
        c["barriers"] += warps
        c["warp_instructions"] += warps

    def atomic_add(self, buf: Buffer, idx, value) -> None:
        """atomicAdd(&buf[idx], value) per active lane, on a global buffer (no return value: RED)."""
        if not isinstance(buf, Buffer):
            raise GpuSimError(f"{_caller()[0]}: atomic_add needs a global Buffer, got {type(buf).__name__}")
        rec = self._rec
        if rec is not None:
            ev = ["AT", "global", buf.name, 1, rec.ref(idx), rec.ref(value), _caller()[0]]
        self._global_access(buf, idx, 1, "atomic", value)
        if rec is not None:
            rec.event(ev)

    # ------------------------------------------------------------------ memory instructions
    def _pad(self, a: np.ndarray, fill) -> np.ndarray:
        """(…, B·T) per-thread array -> (…, B·Tp): the partial last warp padded with ``fill``."""
        lead = a.shape[:-1]
        out = np.full(lead + (self._B, self._Tp), fill, a.dtype)
        out[..., : self._T] = a.reshape(lead + (self._B, self._T))
        return out.reshape(lead + (self._L,))

    def _unpad(self, a: np.ndarray) -> np.ndarray:
        if self._T == self._Tp or a.shape[-1] == 1:
            return a
        lead = a.shape[:-1]
        return a.reshape(lead + (self._B, self._Tp))[..., : self._T].reshape(lead + (self._Lu,))

    def load(self, arr: _Array, idx, w: int):
        rec = self._rec
        if rec is not None:
            iref = rec.ref(idx)
        if arr.space == "shared":
            out = self._shared_access(arr, idx, w, None)
        else:
            out = self._global_access(arr, idx, w, "load", None)
        if rec is None:
            return out
        t = rec.loaded(out)  # a register value: its arithmetic is recorded from here on
        rec.event(["LD", arr.space, arr.name, w, iref, t._tid, _caller()[0]])
        return t

    def store(self, arr: _Array, idx, w: int, value) -> None:
        rec = self._rec
        if rec is not None:
            ev = ["ST", arr.space, arr.name, w, rec.ref(idx), rec.ref(value), _caller()[0]]
        if arr.space == "shared":
            self._shared_access(arr, idx, w, value)
        else:
            self._global_access(arr, idx, w, "store", value)
        if rec is not None:
            rec.event(ev)

    def _prepare(self, arr: _Array, idx, w: int, key: str):
        """Normalise an index: -> (idx, U, n, uniform, mask (…,L) or None, warp_any (n, BW) or None)."""
        if isinstance(arr, SharedArray) and self._shared.get(arr.name) is not arr:
            raise GpuSimError(f"{key}: shared array {arr.name!r} belongs to another block or launch")
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise KernelShapeError(f"{key}: index into {arr.name} must be integers, got dtype {idx.dtype}")
        if idx.ndim == 0:
            idx = idx.reshape(1)
        last = idx.shape[-1]
        if last not in (1, self._Lu):
            raise KernelShapeError(
                f"{key}: index into {arr.name} has last axis {last}; it must be one value per thread "
                f"({self._Lu}) or 1 (the same for every thread); leading axes are unrolled instructions"
            )
        if last != 1 and self._T != self._Tp:
            idx = self._pad(idx, 0)
        mk = self._masks[-1]
        m = mk.padded()
        mshape = m.shape[:-1] if m is not None else ()
        try:
            U = np.broadcast_shapes(idx.shape[:-1], mshape)
        except ValueError:
            raise KernelShapeError(
                f"{key}: index into {arr.name} (unrolled shape {idx.shape[:-1]}) does not broadcast with the "
                f"where() condition (unrolled shape {mshape})"
            ) from None
        n = math.prod(U)
        wa = mk.warp_any()
        if wa is not None:
            wa = _bcast(wa, U + (self._BW,)).reshape(n, self._BW)
        return idx.astype(np.int64, copy=False), U, n, last == 1, m, wa

    def _check_bounds(self, arr: _Array, sel: np.ndarray, w: int, key: str, what: str) -> None:
        if not sel.size:
            return
        lo, hi = int(sel.min()), int(sel.max())
        if lo < 0 or hi + w > arr.size:
            bad = lo if lo < 0 else hi
            fix = ("declare it with room for every index its layout uses (a row padded to d + 1 words needs "
                   "rows·(d + 1)), or guard lanes that have nothing there with t.where(...)" if arr.space == "shared"
                   else "guard the access with t.where(...) (a ragged last block), or check its offset and stride")
            raise OutOfBoundsError(
                f"{key}: {what} {arr.space} {arr.name}[{bad}] is out of bounds ({arr.name} has {arr.size} "
                f"elements{', float' + str(w) if w > 1 else ''}): {fix}"
            )
        if w > 1 and (sel % w).any():
            bad = int(sel[(sel % w) != 0][0])
            raise MisalignedAccessError(
                f"{key}: float{w} access {arr.name}.f{w}[{bad}] is misaligned: the element index of a "
                f"float{w} access must be a multiple of {w}"
            )

    def _values(self, data: np.ndarray, flat: np.ndarray, w: int, act: np.ndarray | None) -> np.ndarray:
        """Gather data[flat (+0..w-1)] -> (*U, L) or (*U, w, L); inactive lanes read 0."""
        if act is not None:
            flat = np.where(act, flat, 0)
        if w == 1:
            v = data[flat]
        else:
            v = data[flat[..., None, :] + np.arange(w).reshape(w, 1)]
        if act is not None:
            v = np.where(act[..., None, :] if w > 1 else act, v, 0).astype(data.dtype, copy=False)
        return self._unpad(v)

    def _store_values(self, arr: _Array, value, U: tuple, w: int, key: str) -> np.ndarray:
        L = self._L
        shape = U + ((w,) if w > 1 else ()) + (L,)
        v = np.asarray(value)
        if v.ndim and v.shape[-1] == self._Lu and self._T != self._Tp:
            v = self._pad(v, 0)
        try:
            return _bcast(v, shape).astype(arr.dtype, copy=False)
        except ValueError:
            want = shape[:-1] + (self._Lu,)
            hint = f" (a float{w} value has shape (..., {w}, L))" if w > 1 else ""
            raise KernelShapeError(
                f"{key}: value stored to {arr.name} has shape {np.shape(value)}, which does not broadcast to {want}{hint}"
            ) from None

    # ---- global -------------------------------------------------------------------------
    def _global_access(self, buf: Buffer, idx, w: int, op: str, value):
        key, lineno, fname = _caller()
        if not isinstance(buf, Buffer):
            raise GpuSimError(f"{key}: {buf!r} is not a global buffer")
        idx, U, n, uniform, m, wa = self._prepare(buf, idx, w, key)
        L, BW = self._L, self._BW
        full = U + (L,)
        idxf = _bcast(idx, full)
        act = None if m is None else _bcast(m, full)
        sel = idxf[act] if act is not None else idxf
        self._check_bounds(buf, sel, w, key, {"load": "load from", "store": "store to", "atomic": "atomic_add on"}[op])
        if not self._counting:  # recording for the grader, which counts in its own replay
            if op == "load" and uniform and act is None:  # as below: one value for every thread
                return self._values(buf.data, _bcast(idx, U + (1,)), w, None)
            return self._move(buf.data, op, idxf, act, sel, U, w, value, buf, key)
        # --- counting: per warp instruction, distinct elements and distinct 32-byte sectors
        if uniform:
            nreq = n * BW if wa is None else int(wa.sum())
            nsec, ndist = nreq, nreq
        else:
            x = idxf.reshape(n * BW, WARP_SIZE)
            if act is not None:
                x = np.where(act.reshape(n * BW, WARP_SIZE), x, -1)
            x = np.sort(x, axis=1)
            valid = x >= 0
            first = valid[:, :1]
            el_new = np.concatenate([first, (x[:, 1:] != x[:, :-1]) & valid[:, 1:]], axis=1)
            s = x >> 3  # element -> sector (8 four-byte elements per 32-byte sector); -1 stays < 0
            sec_new = np.concatenate([first, (s[:, 1:] != s[:, :-1]) & valid[:, 1:]], axis=1)
            nreq = int(wa.sum()) if wa is not None else n * BW
            nsec, ndist = int(sec_new.sum()), int(el_new.sum())
        c = self._ctr.line(key, lineno, fname)
        bc = self._ctr.buffer(buf)
        c["warp_instructions"] += nreq
        if op == "atomic":
            for cc in (c, bc):
                cc["atomic_requests"] += nreq
                cc["atomic_sectors"] += nsec
                cc["atomic_element_ops"] += int(sel.size)
            vals = self._store_values(buf, value, U, 1, key)
            v = vals[act] if act is not None else vals.reshape(-1)
            np.add.at(buf.data, sel.reshape(-1), v.reshape(-1))
            return None
        pre = "global_load_" if op == "load" else "global_store_"
        nbytes = ndist * w * WORD_BYTES
        for cc in (c, bc):
            cc[pre + "requests"] += nreq
            cc[pre + "sectors"] += nsec
            cc[pre + "bytes"] += nbytes
        touched = (self._ctr.read_touched if op == "load" else self._ctr.write_touched)[buf.name]
        touched[sel >> 3] = True
        if op == "load":
            if uniform and act is None:
                flat = _bcast(idx, U + (1,))
                return self._values(buf.data, flat, w, None)
            return self._values(buf.data, idxf, w, act)
        vals = self._store_values(buf, value, U, w, key)
        self._scatter(buf.data, idxf, vals, w, act)
        return None

    def _move(self, data, op: str, flat, act, sel, U, w: int, value, arr: _Array, key: str):
        """The values of an access without its counting (a recorded run: the grader counts)."""
        if op == "load":
            return self._values(data, flat, w, act)
        if op == "atomic":
            vals = self._store_values(arr, value, U, 1, key)
            v = vals[act] if act is not None else vals.reshape(-1)
            np.add.at(data, sel.reshape(-1), v.reshape(-1))
            return None
        self._scatter(data, flat, self._store_values(arr, value, U, w, key), w, act)
        return None

    @staticmethod
    def _scatter(data: np.ndarray, flat: np.ndarray, vals: np.ndarray, w: int, act) -> None:
        if w == 1:
            if act is None:
                data[flat.reshape(-1)] = vals.reshape(-1)
            else:
                data[flat[act]] = vals[act]
            return
        words = flat[..., None, :] + np.arange(w).reshape(w, 1)  # (*U, w, L)
        if act is None:
            data[words.reshape(-1)] = vals.reshape(-1)
        else:
            a = _bcast(act[..., None, :], words.shape)
            data[words[a]] = vals[a]

    # ---- shared -------------------------------------------------------------------------
    def _shared_access(self, arr: SharedArray, idx, w: int, value):
        key, lineno, fname = _caller()
        idx, U, n, uniform, m, wa = self._prepare(arr, idx, w, key)
        L, B, W, BW, S = self._L, self._B, self._W, self._BW, arr.size
        full = U + (L,)
        act = None if m is None else _bcast(m, full)
        is_load = value is None
        if not self._counting:  # recording for the grader, which counts in its own replay
            if uniform and is_load:  # as below: a broadcast read, (..., 1) when one block runs
                iu = _bcast(idx.reshape(idx.shape[:-1]), U).reshape(n)
                live = np.ones((n, BW), bool) if wa is None else wa
                self._check_bounds(arr, iu[live.any(1)], w, key, "load from")
                if B == 1:
                    return self._values(arr.data, iu.reshape(U + (1,)), w, None)
                return self._values(arr.data, self._lane_block * S + iu.reshape(U + (1,)), w, act)
            idxf = _bcast(idx, full)
            sel = idxf[act] if act is not None else idxf
            self._check_bounds(arr, sel, w, key, "load from" if is_load else "store to")
            flat = idxf if B == 1 else idxf + self._lane_block * S
            return self._move(arr.data, "load" if is_load else "store", flat, act, sel, U, w, value, arr, key)
        c = self._ctr.line(key, lineno, fname)
        pre = "shared_load_" if is_load else "shared_store_"

        if uniform and is_load:
            # Every lane reads the same word(s): a broadcast, one wavefront per active warp
            # (course rule); per active quarter-warp for a 128-bit access under the quarter-warp rule.
            iu = _bcast(idx.reshape(idx.shape[:-1]), U).reshape(n)
            live = np.ones((n, BW), bool) if wa is None else wa
            nreq = int(live.sum())
            self._check_bounds(arr, iu[live.any(1)], w, key, "load from")
            if self._quarter and w == 4:  # one wavefront per quarter-warp with an active lane
                nwf = n * BW * 4 if act is None else int(act.reshape(n, BW, 4, 8).any(-1).sum())
            else:
                nwf = nreq
            c[pre + "requests"] += nreq
            c[pre + "wavefronts"] += nwf
            c["warp_instructions"] += nreq
            if self._races_on and nreq:

                def pairs(iu=iu, live=live):  # (word, warp): every word of the access, every live warp
                    i_, bw_ = np.nonzero(live)
                    fw = ((bw_ // W) * S + iu[i_]).reshape(-1, 1) + np.arange(w)
                    lw = _bcast((bw_ % W).reshape(-1, 1), fw.shape)
                    return fw.reshape(-1), lw.reshape(-1)

                self._race_read(arr, pairs, key)
            if B == 1:
                self._note_unwritten(arr, iu[live.any(1)].reshape(-1, 1) + np.arange(w), key)
                return self._values(arr.data, iu.reshape(U + (1,)), w, None)
            flat = self._lane_block * S + iu.reshape(U + (1,))  # (*U, L): each block its own copy
            self._note_unwritten(arr, _words(_bcast(flat, full), w, act), key)
            return self._values(arr.data, flat, w, act)

        idxf = _bcast(idx, full)
        sel = idxf[act] if act is not None else idxf
        self._check_bounds(arr, sel, w, key, "load from" if is_load else "store to")
        # --- wavefronts: distinct words per bank, per warp (or per quarter-warp for 128-bit)
        words = idxf.reshape(n, BW, WARP_SIZE, 1)
        if w > 1:
            words = words + np.arange(w).reshape(1, 1, 1, w)
        phases = 4 if (self._quarter and w == 4) else 1
        K = WARP_SIZE * w // phases
        x = words.reshape(n * BW * phases, K).astype(np.int32)
        if act is not None:
            a4 = _bcast(act.reshape(n, BW, WARP_SIZE, 1), words.shape)
            x[~a4.reshape(x.shape)] = -1
        x.sort(axis=1)
        new = np.empty(x.shape, bool)  # first occurrence of each distinct word in its row
        new[:, :1] = x[:, :1] >= 0
        np.not_equal(x[:, 1:], x[:, :-1], out=new[:, 1:])
        if act is not None:
            new &= x >= 0
        R = x.shape[0]
        at = np.flatnonzero(new)
        uw = x.reshape(-1)[at].astype(np.int64)  # the distinct words of each row
        row_of = at // K
        per_bank = np.bincount(row_of * NUM_BANKS + (uw & (NUM_BANKS - 1)), minlength=R * NUM_BANKS)
        wf = per_bank.reshape(R, NUM_BANKS).max(1)
        distinct = np.bincount(row_of, minlength=R)
        nwf = int(wf.sum())
        conflicts = nwf - int((-(-distinct // NUM_BANKS)).sum())
        nreq = n * BW if wa is None else int(wa.sum())
        c[pre + "requests"] += nreq
        c[pre + "wavefronts"] += nwf
        c[pre + "bank_conflicts"] += conflicts
        c["warp_instructions"] += nreq
        if self._races_on and uw.size:
            bw_ = (row_of // phases) % BW
            fw, lw = (bw_ // W) * S + uw, bw_ % W
            if is_load:
                self._race_read(arr, lambda: (fw, lw), key)
            else:
                self._race_write(arr, fw, lw, key)
        flat = idxf if B == 1 else idxf + self._lane_block * S
        if is_load:
            self._note_unwritten(arr, _words(flat, w, act), key)
            return self._values(arr.data, flat, w, act)
        vals = self._store_values(arr, value, U, w, key)
        self._scatter(arr.data, flat, vals, w, act)
        arr.written[_words(flat, w, act)] = True
        return None

    def _note_unwritten(self, arr: SharedArray, words: np.ndarray, key: str) -> None:
        """Report a load of shared words no thread has stored to yet (their values are garbage on a real
        GPU: NaN here): a store and the loads of its tile that use different layouts, or a tile loaded
        only in part. A report in the stats (unwritten_reads), for the grader's hints; never an error."""
        unwritten = ~arr.written[words]
        if not unwritten.any():
            return
        r = self._ctr.unwritten.get((key, arr.name))
        if r is None:
            word = int(words.reshape(-1)[int(np.flatnonzero(unwritten.reshape(-1))[0])])
            self._ctr.unwritten[(key, arr.name)] = {
                "line": key, "source": self._ctr.sources.get(key, ""), "buffer": arr.name,
                "words": int(unwritten.sum()),
                "example": f"block {self._block_ids[word // arr.size]} reads {arr.name}[{word % arr.size}]",
            }
        else:
            r["words"] += int(unwritten.sum())

    # ---- race detection -----------------------------------------------------------------
    def _record_race(self, arr: SharedArray, key: str, kind: str, count: int, example: str) -> None:
        if self.gpu.race_check == "raise":
            raise RaceError(f"{key}: shared-memory race on {arr.name}: {example}")
        r = self._ctr.races.get((key, arr.name, kind))
        if r is None:
            self._ctr.races[(key, arr.name, kind)] = {
                "line": key,
                "source": self._ctr.sources.get(key, ""),
                "buffer": arr.name,
                "kind": kind,
                "accesses": count,
                "example": example,
            }
        else:
            r["accesses"] += count

    # Race model: a block's epoch advances at each syncthreads(). A word written by warp X in
    # epoch e and read or written by another warp in epoch e is a race. Writes are entered at
    # once (w_epoch, w_warp); reads are queued and entered in r_seen only when a write to the
    # same array follows in the same epoch, so a kernel with correct barriers pays little.
    def _race_read(self, arr: SharedArray, pairs: Callable, key: str) -> None:
        if (arr.last_write_ep == self._epoch).any():  # written this epoch: check read-after-write
            fw, lw = pairs()
            S = arr.size
            ep = self._epoch[fw // S]
            racy = (arr.w_epoch[fw] == ep) & (arr.w_warp[fw] != lw)
            if racy.any():
                i = int(np.flatnonzero(racy)[0])
                self._record_race(
                    arr, key, "read-after-write", int(racy.sum()),
                    f"block {self._block_ids[int(fw[i] // S)]}: warp {int(lw[i])} reads {arr.name}[{int(fw[i] % S)}], "
                    f"which warp {int(arr.w_warp[fw[i]])} wrote after the last syncthreads()",
                )
            arr.pending.append((lambda: (fw, lw), self._epoch.copy()))
        else:
            arr.pending.append((pairs, self._epoch.copy()))

    def _enter_reads(self, arr: SharedArray) -> None:
        """Enter the queued reads that belong to their block's current epoch into r_seen."""
        S = arr.size
        for pairs, ep_then in arr.pending:
            fw, lw = pairs()
            blk = fw // S
            ep = self._epoch[blk]
            keep = ep_then[blk] == ep
            if not keep.all():
                fw, lw, ep, blk = fw[keep], lw[keep], ep[keep], blk[keep]
            if not fw.size:
                continue
            stale = arr.r_epoch[fw] != ep
            arr.r_seen[fw[stale]] = False  # forget readers of earlier epochs
            arr.r_epoch[fw] = ep
            arr.r_seen[fw, lw] = True
            arr.last_read_ep[blk] = ep
        arr.pending.clear()

    def _race_write(self, arr: SharedArray, fw: np.ndarray, lw: np.ndarray, key: str) -> None:
        S = arr.size
        blk = fw // S
        ep = self._epoch[blk]
        if arr.pending:
            self._enter_reads(arr)
        racy_kinds = []
        if (arr.last_write_ep == self._epoch).any():  # another warp wrote it this epoch
            racy_kinds.append(("write-after-write", (arr.w_epoch[fw] == ep) & (arr.w_warp[fw] != lw), "another warp wrote"))
        if (arr.last_read_ep == self._epoch).any():  # another warp read it this epoch
            seen = arr.r_seen[fw]  # (n, W)
            others = seen.sum(1) - seen[np.arange(fw.size), lw]
            racy_kinds.append(("write-after-read", (arr.r_epoch[fw] == ep) & (others > 0), "another warp read"))
        arr.w_warp[fw] = lw
        same_instr = arr.w_warp[fw] != lw  # two warps wrote the word in this (unrolled) instruction
        racy_kinds.append(("write-after-write", same_instr, "another warp wrote in the same instruction"))
        arr.w_epoch[fw] = ep
        arr.last_write_ep[blk] = ep
        for kind, racy, what in racy_kinds:
            if racy.any():
                i = int(np.flatnonzero(racy)[0])
                self._record_race(
                    arr, key, kind, int(racy.sum()),
                    f"block {self._block_ids[int(fw[i] // S)]}: warp {int(lw[i])} writes {arr.name}[{int(fw[i] % S)}], "
                    f"which {what} after the last syncthreads()",
                )


# ----------------------------------------------------------------------------------------------
# The device
# ----------------------------------------------------------------------------------------------
_CAPTURES: list[list[dict]] = []


@contextmanager
def capture() -> Iterator[list[dict]]:
    """Collect the stats of every launch made inside the ``with`` (on any GPU object).

    The dicts are the launches' own live stats, so code running inside can change them: the
    grader does not use them, it replays a recording (course.gpusim.trace) and counts itself."""
    rec: list[dict] = []
    _CAPTURES.append(rec)
    try:
        yield rec
    finally:
        _CAPTURES.remove(rec)


class GPU:
    """A simulated GPU: global buffers, kernel launches, and the counters of every launch.

    shared_rule: "course" (default; the rule behind the lecture's 71,680 and 616,448) or
    "quarter-warp" (128-bit shared accesses processed 8 lanes at a time, as recent hardware does).
    race_check: "record" (default; races appear in the stats), "raise" (RaceError) or "off".
    """

    def __init__(self, shared_rule: str = "course", race_check: str = "record", max_shared_bytes: int = MAX_SHARED_BYTES):
        if shared_rule not in SHARED_RULES:
            raise ValueError(f"shared_rule must be one of {SHARED_RULES}, got {shared_rule!r}")
        if race_check not in RACE_MODES:
            raise ValueError(f"race_check must be one of {RACE_MODES}, got {race_check!r}")
        self.shared_rule, self.race_check, self.max_shared_bytes = shared_rule, race_check, int(max_shared_bytes)
        self.buffers: dict[str, Buffer] = {}
        self.launches: list[dict] = []

    # ---- buffers ------------------------------------------------------------------------
    def array(self, name: str, data, dtype=np.float32) -> Buffer:
        """A global buffer holding a copy of ``data`` (numpy array, torch tensor or list)."""
        arr = np.array(host_array(data), dtype=dtype, copy=True)
        if arr.dtype.itemsize != WORD_BYTES:
            raise GpuSimError(f"buffer {name!r}: elements must be 4 bytes (float32 or int32), got {arr.dtype}")
        if name in self.buffers:
            raise GpuSimError(f"a buffer named {name!r} already exists on this GPU: give each buffer its own name")
        if arr.size == 0:
            raise GpuSimError(f"buffer {name!r} is empty: a buffer needs at least one element")
        buf = Buffer(self, name, arr)
        self.buffers[name] = buf
        rec = _recorder()
        if rec is not None:
            rec.buffer(self, buf)
        return buf

    def zeros(self, name: str, shape, dtype=np.float32) -> Buffer:
        """A global buffer of zeros (like cudaMemset to 0)."""
        return self.array(name, np.zeros(shape, dtype=dtype), dtype)

    def full(self, name: str, shape, value: float, dtype=np.float32) -> Buffer:
        """A global buffer filled with ``value``."""
        return self.array(name, np.full(shape, value, dtype=dtype), dtype)

    # ---- launches -----------------------------------------------------------------------
    def launch(self, kernel: Callable, grid, block, *args, blocks_at_once: bool = False) -> dict:
        """Run ``kernel(t, *args)`` over ``grid`` x ``block`` threads; return the launch's stats.

        By default the blocks run one after another, each in lockstep, and ``t.blockIdx`` holds
        ints (so Python control flow may depend on it). With ``blocks_at_once=True`` every block
        runs together and ``t.blockIdx.x`` is a per-thread array: faster for uniform kernels;
        the counts are identical."""
        global _ACTIVE
        grid, block = _dim3(grid, "grid"), _dim3(block, "block")
        T = block.x * block.y * block.z
        if T > MAX_THREADS_PER_BLOCK:
            raise LaunchError(f"block has {T} threads; a block may have at most {MAX_THREADS_PER_BLOCK}")
        if not callable(kernel):
            raise LaunchError(f"kernel must be a function kernel(t, *args), got {type(kernel).__name__}")
        if _ACTIVE is not None:
            raise LaunchError("a kernel cannot launch another kernel (no dynamic parallelism here)")
        name = getattr(kernel, "__name__", "kernel")
        ctr = LaunchCounters(name)
        ids = [(x, y, z) for z in range(grid.z) for y in range(grid.y) for x in range(grid.x)]
        batches = [ids] if blocks_at_once else [[b] for b in ids]
        rec = _recorder()
        if rec is not None:
            rec.begin_launch(self, name, grid, block, args, blocks_at_once)
        try:
            with np.errstate(all="ignore"):
                for batch in batches:
                    if rec is not None:
                        rec.begin_batch()
                    ctx = ThreadContext(self, ctr, grid, block, batch)
                    _ACTIVE = ctx
                    kernel(ctx, *args)
                    if len(ctx._masks) != 1:  # pragma: no cover - only if a where() generator is misused
                        raise LaunchError(f"kernel {name} left a where() open")
        finally:
            _ACTIVE = None
            if rec is not None:
                rec.end_launch()
        used = [a for a in args if isinstance(a, Buffer)]
        stats = ctr.finalize(grid, block, self.shared_rule, used)
        self.launches.append(stats)
        for rec in _CAPTURES:
            rec.append(stats)
        return stats

    def report(self) -> dict:
        """All launches so far, summed (see merge_stats): plain data, JSON-serialisable."""
        return merge_stats(self.launches)


def _recorder():
    """The active recorder of course.gpusim.trace (grading), or None (every normal run)."""
    return _trace._RECORDERS[-1] if _trace._RECORDERS else None


from . import trace as _trace  # noqa: E402 (trace imports this module)
