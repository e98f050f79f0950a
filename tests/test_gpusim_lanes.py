"""Registers are per thread (course/gpusim/lanes.py): the judge's replay refuses register arithmetic
that moves values between threads, with one line naming two threads, the operation and its line.

A per-thread value is an array with one axis over the threads (the last, as loads return it); plain
numpy would let one operation read across that axis (a reduction, a gather, a reshape, a matmul
contracting it), a free exchange between threads that a GPU makes only through shared memory. These
tests pin what is refused, and what stays legal: the reference's own forms (elementwise arithmetic,
reductions over unrolled axes, tile @ x, views that keep one entry per thread) and a rows-first
layout (the thread on another axis, last again where a value meets memory).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import itertools

import numpy as np
import pytest

from course import gpusim as gs
from course.gpusim import lanes, trace

RULE = "per-thread values are registers"


def _replay(kernel, *, block=32, grid=2, data=None, at_once=False):
    """Record kernel(t, X, Y) (X: 64·4 floats, Y: 64 zeros), replay it on other X; -> Y of the replay."""
    data = np.arange(256.0) if data is None else data
    with gs.record() as rec:
        gpu = gs.GPU()
        X, Y = gpu.array("X", data), gpu.zeros("Y", 64)
        gpu.launch(kernel, grid, block, X, Y, blocks_at_once=at_once)
    r = gs.replay(rec.program(), {(0, "X"): data[::-1].copy()})
    return r.buffers[0]["Y"]


def _line(fn) -> str:
    """'test_gpusim_lanes.py:N' of the line of fn's source that is marked '# <-'."""
    src, first = inspect.getsourcelines(fn)
    n = next(i for i, s in enumerate(src) if "# <-" in s)
    return f"test_gpusim_lanes.py:{first + n}"


def _gid(t):
    return t.blockIdx.x * t.blockDim.x + t.threadIdx.x


# ------------------------------------------------------------------------------------------------
# What stays legal: the forms the reference kernel and its equivalents use


def test_lane_local_register_arithmetic_replays():
    def kernel(t, X, Y):
        i = _gid(t)
        tx = t.threadIdx.x
        x = X[i]  # (L,): one value per thread
        xs = X[4 * i + gs.unroll(4)]  # (4, L): four registers per thread
        tile = X[gs.unroll(4)[:, None] * 4 + gs.unroll(4)].reshape(4, 4)  # uniform: the same in every thread
        s = tile @ xs  # (4, L): each thread multiplies the shared tile by its own vector
        m = np.maximum(s.max(0), x)  # over the unrolled axis, then elementwise
        p = np.exp(s - m)
        acc = np.zeros_like(xs)
        acc += tile.T @ p  # in place, a per-thread target
        acc[0] = acc[0] + p.sum(0)  # assignment into a register of every thread
        b = (tile[:, :, None] * xs[None]).sum(1)  # broadcast product, summed over d
        v = np.where(tx % 2 == 0, acc.reshape(2, 2, -1)[1, 0], b[2])  # views keep the thread axis last
        Y[i] = v + np.concatenate([xs[None, 0], p[None, 1]]).sum(0) + xs[:, None, :][3, 0] * np.float32(0)

    y = _replay(kernel)
    assert y.shape == (64,) and np.isfinite(y).all()


def test_a_transposed_layout_is_lane_local_too():
    """Rows first, as in part 2's torch tiles: q.T is (L, d), the thread on axis -2; S = q.T @ k.T,
    the softmax along axis 1, P @ V, and the thread moved back last (o.T) before the store."""
    def kernel(t, X, Y):
        i = _gid(t)
        q = X[4 * i + gs.unroll(4)]  # (4, L)
        kt = X[gs.unroll(8)[:, None] * 4 + gs.unroll(4)].reshape(8, 4)  # (8, 4) uniform: 8 keys
        s = q.T @ kt.T  # (L, 8)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        o = (p @ kt) / p.sum(1)[:, None]  # (L, 4)
        acc = np.zeros_like(o)
        acc[:, 1:] = o[:, 1:]
        Y[i] = np.moveaxis(acc, 0, -1).sum(0) + np.swapaxes(o, 0, 1)[0]

    assert np.isfinite(_replay(kernel, data=np.linspace(0, 1, 256))).all()


def test_a_value_reaches_memory_with_the_thread_last():
    def kernel(t, X, Y):
        i = _gid(t)
        xs = X[(4 * i + gs.unroll(4)) % 256]  # (4, L)
        with t.where(t.threadIdx.x < 4):
            Y[i + 0 * gs.unroll(32)] = xs.T[:, :1]  # <- (L, 1): the engine would take axis -2 as unrolled loads

    with pytest.raises(lanes.LaneError, match=r"thread on axis -2, not the last, used in a memory instruction"):
        _replay(kernel)


def test_printing_a_per_thread_value_is_harmless():
    """numpy's printing reads across the thread axis, and float() of one entry is a constant: values
    made by mixing threads are refused only where they reach memory, a mask or an assignment."""
    def kernel(t, X, Y):
        i = _gid(t)
        x = X[i]
        with contextlib.redirect_stdout(io.StringIO()):
            print(x, x.max(), f"{float(x[3]):.2f}")
        Y[i] = x * 2

    assert np.array_equal(_replay(kernel), np.arange(256.0)[::-1][:64] * 2)


def test_a_branch_on_a_vote_of_the_threads_is_recorded_like_any_branch():
    """(x > 1e6).any() reads every thread (a vote): it only decides the way a Python `if` went, which
    the replay checks against the recording (tests/test_gpusim_replay.py), so it is not refused here."""
    def kernel(t, X, Y):
        i = _gid(t)
        x = X[i]
        if (x > 1e6).any():
            x = x * 0
        Y[i] = x

    assert np.array_equal(_replay(kernel), np.arange(256.0)[::-1][:64])


def test_one_thread_blocks_have_nothing_to_mix():
    def kernel(t, X, Y):
        x = X[t.blockIdx.x + 0 * t.threadIdx.x]
        Y[t.blockIdx.x + 0 * t.threadIdx.x] = x.sum(-1) + x[::-1]

    assert _replay(kernel, block=1, grid=64).shape == (64,)


# ------------------------------------------------------------------------------------------------
# What is refused: every way plain numpy moves values across the thread axis


def _k_reduce(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x - x.max()  # <-


def _k_reduce_axis(t, X, Y):
    xs = X[4 * _gid(t) + gs.unroll(4)]
    Y[_gid(t)] = np.sum(xs, axis=-1, keepdims=True)[0] + xs[0]  # <-


def _k_reverse(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x[::-1]  # <-


def _k_one_lane(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x * 0 + x[5]  # <-


def _k_gather(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x[(t.threadIdx.x + 1) % 32]  # <-


def _k_data_index(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x[x.astype(np.int64) % 32]  # <-


def _k_concatenate(t, X, Y):
    xs = X[4 * _gid(t) + gs.unroll(4)]
    Y[_gid(t)] = np.concatenate([xs[1], xs[0]])[16:48]  # <-


def _k_transpose(t, X, Y):
    xs = X[(32 * gs.unroll(32) + t.threadIdx.x) % 256]  # (32, L) with L = 32
    Y[_gid(t)] = xs.T[0]  # <- xs.T is (L, 32), the thread on axis -2; its row 0 is thread 0's


def _k_reshape(t, X, Y):
    xs = X[4 * _gid(t) + gs.unroll(4)]
    Y[_gid(t)] = xs.reshape(32, 4).sum(1).reshape(4, 8)[0].repeat(4)  # <-


def _k_matmul_lanes(t, X, Y):
    x = X[_gid(t)]
    w = np.ones((32, 32), np.float32)
    Y[_gid(t)] = w @ x  # <-


def _k_matmul_first(t, X, Y):
    xs = X[(32 * gs.unroll(32) + t.threadIdx.x) % 256]
    Y[_gid(t)] = (xs @ np.eye(32, dtype=np.float32))[0]  # <-


def _k_dot(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = x * np.dot(x, x)  # <-


def _k_broadcast_column(t, X, Y):
    x = X[_gid(t)]
    Y[_gid(t)] = (x[:, None] * x[None, :]).sum(0)  # <-


MIXING = {"reduce": (_k_reduce, "np.maximum.reduce over every axis"),
          "reduce_axis": (_k_reduce_axis, "np.sum over the thread axis"),
          "reverse": (_k_reverse, "indexing x[...] moves values across the thread axis: thread 0 would read a value of thread 31"),
          "one_lane": (_k_one_lane, "indexing x[...] leaves no thread axis"),
          "gather": (_k_gather, "indexing x[...] moves values across the thread axis: thread 0 would read a value of thread 1"),
          "data_index": (_k_data_index, "a per-thread value used as an index"),
          "concatenate": (_k_concatenate, "np.concatenate leaves no thread axis"),
          "transpose_row": (_k_transpose, "indexing x[...] moves values across the thread axis: thread 1 would read a value of thread 0"),
          "reshape": (_k_reshape, "x.reshape() moves values across the thread axis"),
          "matmul_lanes": (_k_matmul_lanes, "np.matmul sums over the thread axis of a per-thread operand"),
          "matmul_first": (_k_matmul_first, "np.matmul sums over the thread axis of a per-thread operand"),
          "dot": (_k_dot, "np.dot sums over the thread axis"),
          "broadcast_column": (_k_broadcast_column, "np.multiply combines per-thread values whose thread axes do not line up")}


@pytest.mark.parametrize("name", sorted(MIXING))
def test_register_arithmetic_across_threads_is_refused_in_one_line(name):
    kernel, what = MIXING[name]
    with pytest.raises(lanes.LaneError) as e:
        _replay(kernel)
    msg = str(e.value)
    assert "\n" not in msg and RULE in msg and what in msg, msg
    assert msg.startswith(_line(kernel) + ": "), msg  # the kernel line, through numpy's own frames
    if "index" not in what:
        assert "thread " in msg and "without shared memory" in msg


def test_a_lane_gather_is_refused_with_the_two_threads_named():
    def kernel(t, X, Y):
        x = X[_gid(t)]
        Y[_gid(t)] = x[np.arange(32) ^ 1]  # <- swap neighbours: thread 2 reads thread 3

    with pytest.raises(lanes.LaneError, match="thread 0 would read a value of thread 1 without shared memory"):
        _replay(kernel)


def test_per_thread_values_into_a_value_every_thread_holds_are_refused():
    def kernel(t, X, Y):
        x = X[_gid(t)]
        u = X[gs.unroll(32)].reshape(32)  # uniform: every thread holds X[0:32]
        u[:] = x  # <-
        Y[_gid(t)] = u

    with pytest.raises(lanes.LaneError, match="writes per-thread values into a value that is the same in every thread"):
        _replay(kernel)


def test_blocks_at_once_name_the_block():
    def kernel(t, X, Y):
        x = X[_gid(t)]
        Y[_gid(t)] = x[::-1]  # <-

    with pytest.raises(lanes.LaneError, match=r"thread 0 of block \(0, 0, 0\) would read a value of thread 31 of block \(1, 0, 0\)"):
        _replay(kernel, at_once=True)


def test_a_mixed_value_is_refused_where_it_reaches_memory_a_mask_or_an_assignment():
    def store(t, X, Y):
        x = X[_gid(t)]
        m = x.sum()  # every thread's value
        Y[_gid(t)] = x + m * 0

    def mask(t, X, Y):
        x = X[_gid(t)]
        with t.where(x > x.sum() / 32):
            Y[_gid(t)] = x

    def index(t, X, Y):
        x = X[_gid(t)]
        Y[_gid(t)] = X[(x.max() + 0 * t.threadIdx.x).astype(np.int64) % 64]

    for k in (store, mask, index):
        with pytest.raises(lanes.LaneError, match=RULE):
            _replay(k)


# ------------------------------------------------------------------------------------------------
# The rule covers every allowed operation; a crafted program gets no way around it


def test_every_allowed_function_and_method_has_a_kind():
    kinds = (lanes.ELEMENTWISE | lanes.REDUCTIONS | lanes.ACCUMULATIONS | lanes.LIKE | lanes.MATMUL | set(lanes.MOVES))
    assert set(trace._FUNCTIONS) <= kinds
    assert set(trace._METHODS) <= lanes.METHOD_MOVES | {"astype", "copy", "dot"}
    for name in lanes.ELEMENTWISE:
        params = {p for p, _ in lanes._params(trace._FUNCTIONS[name])}
        assert set(lanes._ELEMENTWISE_DATA[name]) <= params, name


def _program(kernel):
    with gs.record() as rec:
        gpu = gs.GPU()
        X, Y = gpu.array("X", np.arange(256.0)), gpu.zeros("Y", 64)
        gpu.launch(kernel, 2, 32, X, Y)
    return trace.unpack(rec.program())


def test_a_crafted_out_operand_is_refused():
    def kernel(t, X, Y):
        x = X[_gid(t)]
        Y[_gid(t)] = x + x

    p = _program(kernel)
    ev = next(e for e in p["launches"][0]["batches"][0] if e[0] == "U")
    ev[3].append(ev[3][0])  # np.add(x, x, x): a third operand is an out= the replay would not see
    with pytest.raises(gs.RecordingError, match="operands out of place"):
        gs.replay(trace.pack(p))
    p = _program(kernel)
    ev = next(e for e in p["launches"][0]["batches"][0] if e[0] == "U")
    ev[4]["out"] = ev[3][0]
    with pytest.raises(gs.RecordingError, match="operands out of place"):
        gs.replay(trace.pack(p))


def test_a_recording_without_lines_is_still_checked():
    p = _program(_k_reverse)
    for b in p["launches"][0]["batches"]:
        for e in b:
            if e[0] in "UFMI" and type(e[-1]) is str:
                e.pop()
    with pytest.raises(lanes.LaneError, match=r"^indexing x\[\.\.\.\] moves values across the thread axis"):
        gs.replay(trace.pack(p))


def test_a_constant_given_as_out_is_not_changed_by_the_replay():
    def kernel(t, X, Y):
        xs = X[4 * _gid(t) + gs.unroll(4)]
        Y[_gid(t)] = np.sum(xs, axis=0, out=np.zeros(32, np.float32))

    with gs.record() as rec:
        gpu = gs.GPU()
        X, Y = gpu.array("X", np.arange(256.0)), gpu.zeros("Y", 64)
        gpu.launch(kernel, 2, 32, X, Y)
    program = trace.unpack(rec.program())
    before = [a.clone() for a in program["arrays"]]
    for _ in range(2):
        gs.replay(program, {(0, "X"): np.ones(256)})
    assert all(a.equal(b) for a, b in zip(program["arrays"], before))


# ------------------------------------------------------------------------------------------------
# The contraction and reduction rules against the ground truth: which output entries change when one
# thread's entries of the per-thread operand change (every accepted case must keep them to that thread)


def _depends(f, operands, which, ax, res, L):
    out = []
    for lane in range(L):
        ops = [np.array(x, copy=True) for x in operands]
        idx = [slice(None)] * ops[which].ndim
        idx[ax] = lane
        ops[which][tuple(idx)] += 1.5
        out.append((np.abs(np.asarray(f(*ops)) - np.asarray(res)) > 1e-9).nonzero())
    return out


def test_the_contraction_rules_never_accept_a_mixing():
    L, rng = 3, np.random.default_rng(0)
    chk = lanes.Checker(L, L, [(0, 0, 0)])
    kinds = {"matmul": np.matmul, "dot": np.dot, "inner": np.inner, "outer": np.outer, "ufunc_outer": np.multiply.outer}
    sizes = [(1,), (L,), (4,), (L, 4), (4, L), (L, L), (1, L), (2, 4, L), (L, 4, 2), (2, L, 4)]
    accepted = 0
    for kind, f in kinds.items():
        for sa, sb in itertools.product(sizes, sizes):
            for which, s in ((0, sa), (1, sb)):
                for ax in [a for a in range(-len(s), 0) if s[a] == L]:
                    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
                    try:
                        res = f(a, b)
                    except ValueError:
                        continue
                    axes = (ax, None) if which == 0 else (None, ax)
                    try:
                        r = chk.fits(res, chk.contracted(kind, *axes, a, b, res, None, kind), None, kind)
                    except lanes.LaneError:
                        continue
                    accepted += 1
                    for lane, nz in enumerate(_depends(f, [a, b], which, ax, res, L)):
                        assert (nz[np.ndim(res) + r] == lane).all(), (kind, sa, sb, which, ax, r)
    assert accepted > 100


def test_the_reduction_rule_never_accepts_a_mixing():
    L, rng = 3, np.random.default_rng(1)
    chk = lanes.Checker(L, L, [(0, 0, 0)])
    for s in [(L,), (L, 2), (2, L), (L, L), (2, L, 4), (L, 1, 2)]:
        for ax in [a for a in range(-len(s), 0) if s[a] == L]:
            axes = [None, *range(-len(s), len(s)), *itertools.combinations(range(len(s)), 2)]
            for axis, keep in itertools.product(axes, (False, True)):
                x = rng.standard_normal(s)
                f = lambda v: np.add.reduce(v, axis=axis, keepdims=keep)  # noqa: E731
                res = f(x)
                try:
                    r = chk.fits(res, chk.reduced(x, ax, axis, keep, None, "sum"), None, "sum")
                except lanes.LaneError:
                    continue
                for lane, nz in enumerate(_depends(f, [x], 0, ax, res, L)):
                    assert (nz[np.ndim(res) + r] == lane).all(), (s, ax, axis, keep, r)
