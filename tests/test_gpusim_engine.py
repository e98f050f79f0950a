"""course.gpusim engine: counting rules, masks, errors, races, and the plain-data API.

Each micro-pattern pins one rule of docs/gpusim_guide.md with a hand-countable warp access."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

from course import gpusim as gs
from course.gpusim import unroll


def launch(kernel, grid=1, block=32, *args, size=4096, **kw):
    """Run kernel(t, X, *args) on a fresh GPU with one global buffer X (size floats)."""
    gpu = gs.GPU(**kw)
    x = gpu.array("X", np.arange(size, dtype=np.float32))
    return gpu.launch(kernel, grid, block, x, *args), x


# ------------------------------------------------------------------------------------------------
# Shared-memory wavefronts (course rule): max over banks of distinct 32-bit words


def column_write(t, X, stride):
    tile = t.shared("tile", 64 * stride)
    tile[t.threadIdx.x * stride] = np.float32(1)


def vector_access(t, X, broadcast):
    s = t.shared("s", 1024)
    s.f4[t.threadIdx.x * 4] = np.zeros((4, 32), np.float32)
    t.syncthreads()
    s.f4[np.array([8])] if broadcast else s.f4[t.threadIdx.x * 4]


def padded_tile_store(t, X):
    tile = t.shared("tile", 16 * 17)
    tile[t.threadIdx.y * 17 + t.threadIdx.x] = np.float32(1)


@pytest.mark.parametrize(
    "kernel, block, args, wavefronts, conflicts",
    [
        (column_write, 32, (64,), 32, 31),  # stride 64: every lane in bank 0
        (column_write, 32, (65,), 1, 0),  # stride 65: 32 different banks
        (padded_tile_store, (16, 2), (), 2, 1),  # lane x=0 of row r and x=15 of row r+1 share a bank
    ],
    ids=["stride64", "stride65", "pad17-tile"],
)
def test_shared_store_patterns(kernel, block, args, wavefronts, conflicts):
    st, _ = launch(kernel, 1, block, *args)
    got = (st["shared_store_requests"], st["shared_store_wavefronts"], st["shared_store_bank_conflicts"])
    assert got == (1, wavefronts, conflicts), "(requests, wavefronts, bank conflicts): max distinct words per bank"


@pytest.mark.parametrize("broadcast, course, quarter", [(False, 4, 4), (True, 1, 4)], ids=["contiguous", "broadcast"])
def test_float4_loads_both_rules(broadcast, course, quarter):
    # contiguous float4: 128 words over 32 banks = 4 per bank; broadcast: 4 words, 1 per bank
    # (course rule) but one wavefront per quarter-warp on hardware that splits 128-bit accesses.
    for rule, want in (("course", course), ("quarter-warp", quarter)):
        st, _ = launch(vector_access, 1, 32, broadcast, shared_rule=rule)
        got = (st["shared_load_requests"], st["shared_load_wavefronts"])
        assert got == (1, want), f"{rule} rule: a {'broadcast' if broadcast else 'contiguous'} float4 load"
        assert st["shared_store_wavefronts"] == 4, "a contiguous float4 store: 128 words, 4 per bank (either rule)"


def test_masked_warps_are_not_requests():
    def kernel(t, X):
        tile = t.shared("tile", 40 * 33)
        with t.where(t.threadIdx.x < 40):  # warp 0: 32 lanes, warp 1: 8 lanes, warps 2, 3: none
            tile[t.threadIdx.x * 33] = np.float32(1)

    st, _ = launch(kernel, 1, 128)
    got = (st["shared_store_requests"], st["shared_store_wavefronts"])
    assert got == (2, 2), "a warp with no active lane issues nothing"


# ------------------------------------------------------------------------------------------------
# Global memory: requests, sectors, useful bytes, DRAM with and without a cache


def test_contiguous_float4_warp_load_is_16_sectors():
    st, _ = launch(lambda t, X: X.f4[t.threadIdx.x * 4], 1, 32)
    got = (st["global_load_requests"], st["global_load_sectors"], st["global_load_bytes"])
    assert got == (1, 16, 512), "(requests, sectors, useful bytes) of 32 lanes x 16 contiguous bytes"
    assert st["dram_bytes_no_cache"] == 512 == st["dram_bytes_ideal_cache"], "DRAM bytes = sectors x 32"


def test_strided_loads_touch_one_sector_per_lane():
    st, _ = launch(lambda t, X: X[t.threadIdx.x * 64], 1, 32)
    assert (st["global_load_sectors"], st["global_load_bytes"]) == (32, 128), "stride 64: one sector per lane"


def test_broadcast_global_load_is_one_sector():
    st, _ = launch(lambda t, X: X[np.array([5])], 1, 64)
    got = (st["global_load_requests"], st["global_load_sectors"], st["global_load_bytes"])
    assert got == (2, 2, 8), "a broadcast load: one sector per warp"


def test_ideal_cache_counts_each_sector_once_per_launch():
    def twice(t, X):
        X[t.threadIdx.x]
        X[t.threadIdx.x]

    gpu = gs.GPU()
    x = gpu.array("X", np.zeros(32, np.float32))
    st = gpu.launch(twice, 1, 32, x)
    assert (st["dram_bytes_no_cache"], st["dram_bytes_ideal_cache"]) == (256, 128), "ideal cache: each sector once"
    st2 = gpu.launch(twice, 1, 32, x)
    assert st2["dram_bytes_ideal_cache"] == 128, "a new launch starts with a cold cache"
    assert gpu.report()["dram_bytes_ideal_cache"] == 256 and gpu.report()["launches"] == 2


def test_partial_sector_rounds_up():
    # 13 floats = 52 bytes: two sectors (64 bytes) with or without a cache
    st, _ = launch(lambda t, X: X[t.threadIdx.x], 1, 13)
    assert st["global_load_bytes"] == 52 and st["dram_bytes_no_cache"] == 64 == st["dram_bytes_ideal_cache"]


def test_unrolled_index_issues_one_instruction_per_entry_and_returns_registers():
    def kernel(t, X):
        v = X[t.threadIdx.x + 32 * unroll(4)]  # 4 coalesced loads
        assert v.shape == (4, 32)
        X[t.threadIdx.x + 128] = v.sum(0)

    st, x = launch(kernel, 1, 32, size=160)
    assert st["global_load_requests"] == 4 and st["global_store_requests"] == 1
    want = np.arange(128, dtype=np.float32).reshape(4, 32).sum(0)
    np.testing.assert_array_equal(x.numpy()[128:], want)


def test_atomics_count_element_ops_and_sectors():
    def kernel(t, X):
        t.atomic_add(X, t.threadIdx.x % 4, np.float32(1))  # 32 lanes onto 4 elements of sector 0

    st, x = launch(kernel, 2, 64, size=8)
    assert st["atomic_element_ops"] == 128 and st["atomic_requests"] == 4 and st["atomic_sectors"] == 4
    np.testing.assert_array_equal(x.numpy()[:4], np.arange(4) + 32)  # 2 blocks x 64 lanes / 4 = 32 each
    assert st["dram_bytes_no_cache"] == 0  # atomics are resolved in L2 and reported apart


def test_partial_last_warp_is_hidden_from_the_kernel():
    seen = {}

    def kernel(t, X):
        seen["shape"] = t.threadIdx.x.shape
        X[t.threadIdx.x] = X[t.threadIdx.x] * 2

    st, x = launch(kernel, 1, 48, size=48)
    assert seen["shape"] == (48,)  # one entry per thread, not per padded lane
    assert st["global_load_requests"] == 2 and st["global_load_sectors"] == 6
    np.testing.assert_array_equal(x.numpy(), np.arange(48) * 2)


def test_blocks_at_once_gives_the_same_counts_and_outputs():
    from course.gpusim.kernels.standard import matmul_tiled_kernel

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 24), np.float32), rng.standard_normal((24, 36), np.float32)
    results = []
    for together in (False, True):
        gpu = gs.GPU()
        A, B, C = gpu.array("A", a), gpu.array("B", b), gpu.zeros("C", (40, 36))
        st = gpu.launch(matmul_tiled_kernel, (3, 3), (16, 16), A, B, C, 40, 36, 24, 1.0, False, blocks_at_once=together)
        results.append((st, C.numpy()))
    (s1, c1), (s2, c2) = results
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_allclose(c1, a @ b, rtol=1e-5, atol=1e-5)
    drop = ("lines",)
    assert {k: v for k, v in s1.items() if k not in drop} == {k: v for k, v in s2.items() if k not in drop}


# ------------------------------------------------------------------------------------------------
# Per-line breakdown and plain data


def test_stats_are_plain_data_and_broken_down_by_line():
    def kernel(t, X):
        tile = t.shared("tile", 64)
        tile[t.threadIdx.x] = X[t.threadIdx.x]  # the line we look for
        t.syncthreads()

    out = gs.run(kernel, 1, 64, {"X": np.ones(64)})
    stats = out["stats"]
    json.dumps(stats)  # JSON-serialisable
    [(key, line)] = [(k, v) for k, v in stats["lines"].items() if "the line we look for" in v["source"]]
    assert key.startswith("test_gpusim_engine.py:")
    assert line["global_load_requests"] == 2 and line["shared_store_requests"] == 2
    assert stats["buffers"]["X"]["global_load_bytes"] == 256
    assert out["outputs"]["X"].shape == (64,)


def test_capture_records_every_launch():
    with gs.capture() as rec:
        launch(lambda t, X: X[t.threadIdx.x], 1, 32)
        launch(lambda t, X: X[t.threadIdx.x], 2, 32)
    assert [r["thread_blocks"] for r in rec] == [1, 2]
    assert gs.merge_stats(rec)["global_load_requests"] == 3


# ------------------------------------------------------------------------------------------------
# Errors: one line, naming the kernel line


def _error(kernel, block=32, size=64, **kw):
    with pytest.raises(gs.GpuSimError) as info:
        launch(kernel, 1, block, size=size, **kw)
    msg = str(info.value)
    assert "\n" not in msg, "errors are one line"
    return info.value, msg


def test_out_of_bounds_global_names_the_line():
    err, msg = _error(lambda t, X: X[t.threadIdx.x + 40])
    assert isinstance(err, gs.OutOfBoundsError) and "test_gpusim_engine.py:" in msg and "X[71]" in msg


def test_out_of_bounds_shared_names_the_array():
    def kernel(t, X):
        s = t.shared("tile", 16)
        s[t.threadIdx.x] = np.float32(0)

    err, msg = _error(kernel)
    assert isinstance(err, gs.OutOfBoundsError) and "tile[31]" in msg and "t.where" in msg


def test_masked_lanes_may_hold_out_of_range_indices():
    def kernel(t, X):
        with t.where(t.threadIdx.x < 16):
            X[t.threadIdx.x + 48] = np.float32(0)  # lanes 16.. would be out of bounds, but are inactive

    launch(kernel, 1, 32)


def test_misaligned_float4():
    err, msg = _error(lambda t, X: X.f4[t.threadIdx.x * 4 + 2], size=256)
    assert isinstance(err, gs.MisalignedAccessError) and "multiple of 4" in msg


def test_divergent_barrier():
    def kernel(t, X):
        with t.where(t.threadIdx.x < 16):
            t.syncthreads()

    err, msg = _error(kernel)
    assert isinstance(err, gs.DivergentBarrierError) and "16 of 32 threads" in msg


def test_block_uniform_barrier_is_fine():
    def kernel(t, X):
        with t.where(t.blockIdx.x == 0):  # the same for every thread of a block
            t.syncthreads()

    gpu = gs.GPU()
    st = gpu.launch(kernel, 3, 64, gpu.array("X", [0.0]))
    assert st["barriers"] == 2  # block 0's two warps


@pytest.mark.parametrize(
    "kernel, kind",
    [
        (lambda t, X: X[t.threadIdx.x.astype(np.float32)], gs.KernelShapeError),
        (lambda t, X: X[np.arange(7)], gs.KernelShapeError),
        (lambda t, X: t.shared("big", 10**6), gs.SharedMemoryError),
    ],
    ids=["float-index", "wrong-width", "too-much-shared"],
)
def test_bad_kernels_get_one_line_errors(kernel, kind):
    err, _ = _error(kernel)
    assert isinstance(err, kind)


def test_host_side_misuse():
    gpu = gs.GPU()
    x = gpu.array("X", [1.0, 2.0])
    with pytest.raises(gs.GpuSimError, match="outside a kernel"):
        x[0]
    with pytest.raises(gs.GpuSimError, match="already exists"):
        gpu.array("X", [1.0])
    with pytest.raises(gs.LaunchError, match="at most 1024"):
        gpu.launch(lambda t, X: None, 1, 2048, x)
    with pytest.raises(ValueError, match="shared_rule"):
        gs.GPU(shared_rule="strict")


# ------------------------------------------------------------------------------------------------
# Races: a lockstep simulator never gets a missing barrier wrong, so it has to detect it


def exchange(t, X, barrier):
    """Each thread writes its word, then reads its neighbour warp's word."""
    s = t.shared("s", 64)
    s[t.threadIdx.x] = X[t.threadIdx.x]
    if barrier:
        t.syncthreads()
    X[t.threadIdx.x] = s[(t.threadIdx.x + 32) % 64]


def test_read_after_write_race_and_its_fix():
    racy, _ = launch(exchange, 1, 64, False)
    assert racy["races"] == 64
    [r] = racy["race_reports"]
    assert r["kind"] == "read-after-write" and r["buffer"] == "s" and "s[(t.threadIdx.x + 32) % 64]" in r["source"]
    fixed, _ = launch(exchange, 1, 64, True)
    assert fixed["races"] == 0


def test_write_after_read_and_write_after_write():
    def war(t, X):
        s = t.shared("s", 64)
        s[t.threadIdx.x] = np.float32(0)
        t.syncthreads()
        v = s[63 - t.threadIdx.x]  # warp 0 reads warp 1's words and vice versa
        s[t.threadIdx.x] = v  # ... which they overwrite in the same epoch

    def waw(t, X):
        s = t.shared("s", 32)
        s[t.threadIdx.x % 32] = np.float32(1)  # both warps write the same 32 words

    st, _ = launch(war, 1, 64)
    assert [r["kind"] for r in st["race_reports"]] == ["write-after-read"]
    st, _ = launch(waw, 1, 64)
    assert [r["kind"] for r in st["race_reports"]] == ["write-after-write"]


def test_one_warp_cannot_race_and_raise_mode():
    st, _ = launch(exchange, 1, 32, False)  # a single warp: lockstep is real, no race
    assert st["races"] == 0
    with pytest.raises(gs.RaceError, match="race on s"):
        launch(exchange, 1, 64, False, race_check="raise")


# ------------------------------------------------------------------------------------------------
# The guide's worked example: every figure docs/gpusim_guide.md states is measured here

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "gpusim_guide.md"


def _guide_table() -> dict[str, int]:
    """Counter -> value from the worked-example table; '`a_requests` / `_sectors` | x / y' rows
    name two counters (the second shares the first's prefix)."""
    text = GUIDE.read_text(encoding="utf-8").split("## Worked example", 1)[1]
    table = {}
    for names, values in re.findall(r"^\| (`[a-z_]+`(?: / `_[a-z_]+`)?) \| ([\d,]+(?: / [\d,]+)?) \|", text, re.M):
        names = [n.strip("`") for n in names.split(" / ")]
        names[1:] = [names[0].rsplit("_", 1)[0] + n for n in names[1:]]
        table.update(zip(names, (int(v.replace(",", "")) for v in values.split(" / "))))
    return table


def _guide_matmul(kernel=None, rule="course") -> dict:
    from course.gpusim.kernels.standard import matmul_tiled_kernel

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))
    out = gs.run(kernel or matmul_tiled_kernel, (4, 4), (16, 16), {"A": a, "B": b, "C": np.zeros((64, 64))},
                 args=(64, 64, 64, 1.0, False), shared_rule=rule)
    np.testing.assert_allclose(out["outputs"]["C"], a @ b, rtol=1e-4, atol=1e-4)
    return out["stats"]


def test_guide_worked_example_counts_are_measured():
    table = _guide_table()
    assert len(table) == 13, f"the guide's worked-example table lost rows: {sorted(table)}"
    stats = _guide_matmul()
    wrong = {k: (v, stats[k]) for k, v in table.items() if stats[k] != v}
    assert not wrong, f"docs/gpusim_guide.md states (guide, measured): {wrong}"
    text = GUIDE.read_text(encoding="utf-8")
    quarter = _guide_matmul(rule="quarter-warp")["shared_wavefronts"]
    assert quarter == stats["shared_wavefronts"], "quarter-warp rule: this kernel makes no 128-bit shared access"
    assert f"unchanged ({quarter:,})" in text, "the guide quotes the quarter-warp count"
    # the per-line example: `"standard.py:43": {"source": "As[...] = a ...", "shared_store_requests": 512, ...}`
    [(key, src, figures)] = re.findall(r'`"(standard\.py:\d+)": \{"source": "(.*?) \.\.\.", ([^}]*)\.\.\.', text)
    line = stats["lines"][key]
    assert line["source"].startswith(src), f"the guide's {key} is now {line['source']!r}"
    for name, value in re.findall(r'"([a-z_]+)": (\d+)', figures):
        assert line[name] == int(value), f"the guide says {key} has {name} = {value}, measured {line[name]}"


def test_guide_quick_start_and_barrier_claims():
    def scale_kernel(t, X, Y, n, alpha):
        i = t.blockIdx.x * t.blockDim.x + t.threadIdx.x
        with t.where(i < n):
            Y[i] = alpha * X[i]

    gpu = gs.GPU()
    x, y = gpu.array("X", np.arange(100.0)), gpu.zeros("Y", 100)
    stats = gpu.launch(scale_kernel, 4, 32, x, y, 100, 2.0)
    assert "# 832: 13 sectors read + 13 written" in GUIDE.read_text(encoding="utf-8"), "the quick start's figure"
    assert stats["dram_bytes_no_cache"] == 832, "quick start: 13 sectors read + 13 written"
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(100.0))
    # "remove the first syncthreads(): read-after-write at the line that reads Bs; the second:
    # write-after-read at the line that overwrites Bs" (the worked example's races row)
    from course.gpusim.kernels import standard

    src, first = inspect.getsourcelines(standard.matmul_tiled_kernel)
    src = "".join(src)
    barriers = [m.start() for m in re.finditer(r"t\.syncthreads\(\)", src)]
    expected = (("read-after-write", "b_col = Bs["), ("write-after-read", "Bs[ty * PAD + tx] = b"))
    for at, (kind, where) in zip(barriers, expected):
        ns = dict(vars(standard))  # compiled at the kernel's own line numbers, so reports name real lines
        racy = "\n" * (first - 1) + src[:at] + "pass" + src[at + len("t.syncthreads()"):]
        exec(compile(racy, standard.__file__, "exec"), ns)
        reports = _guide_matmul(ns["matmul_tiled_kernel"])["race_reports"]
        assert [(r["kind"], r["source"].startswith(where)) for r in reports] == [(kind, True)], reports
