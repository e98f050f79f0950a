"""Counters of the simulated GPU: what one launch accumulates, and how launches are merged.

Every counter is kept per kernel source line and per global buffer; a launch's totals are the
sum over its lines. The rules behind each counter, and the Nsight Compute metric each one
imitates, are in docs/gpusim_guide.md ("Counting rules").
"""

from __future__ import annotations

import linecache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Buffer, Dim3

WORD_BYTES = 4  # every buffer holds 4-byte elements (float32 or int32)
SECTOR_BYTES = 32

# Every counter kept per kernel line (and summed per launch). Names follow docs/gpusim_guide.md.
LINE_COUNTERS = (
    "global_load_requests",
    "global_load_sectors",
    "global_load_bytes",
    "global_store_requests",
    "global_store_sectors",
    "global_store_bytes",
    "shared_load_requests",
    "shared_load_wavefronts",
    "shared_load_bank_conflicts",
    "shared_store_requests",
    "shared_store_wavefronts",
    "shared_store_bank_conflicts",
    "atomic_requests",
    "atomic_element_ops",
    "atomic_sectors",
    "barriers",
    "warp_instructions",
)
BUFFER_COUNTERS = (
    "global_load_requests",
    "global_load_sectors",
    "global_load_bytes",
    "global_store_requests",
    "global_store_sectors",
    "global_store_bytes",
    "atomic_requests",
    "atomic_element_ops",
    "atomic_sectors",
)


class LaunchCounters:
    """What one launch accumulates: counters per kernel line and per buffer, the sectors touched
    (ideal cache) and the race reports; ``finalize`` turns them into the launch's plain-data stats."""

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.lines: dict[str, dict[str, int]] = {}
        self.sources: dict[str, str] = {}
        self.buffers: dict[str, dict[str, int]] = {}
        self.buffer_info: dict[str, "Buffer"] = {}
        self.read_touched: dict[str, np.ndarray] = {}  # ideal cache: sectors read this launch
        self.write_touched: dict[str, np.ndarray] = {}
        self.races: dict[tuple[str, str, str], dict] = {}
        self.unwritten: dict[tuple[str, str], dict] = {}  # loads of shared words no thread stored to
        self.shared_bytes_per_block = 0
        # The most words of per-thread values live at once in a block: measured only by a replay
        # (course.gpusim.trace.LiveState); a direct run leaves 0 (the engine does not see registers).
        self.live_words_per_thread = 0
        self.live_words_per_block = 0  # the same, per block: a value alike in every thread once (LiveState)

    def line(self, key: str, lineno: int, fname: str) -> dict[str, int]:
        c = self.lines.get(key)
        if c is None:
            c = self.lines[key] = dict.fromkeys(LINE_COUNTERS, 0)
            self.sources[key] = linecache.getline(fname, lineno).strip()
        return c

    def buffer(self, buf: "Buffer") -> dict[str, int]:
        c = self.buffers.get(buf.name)
        if c is None:
            c = self.buffers[buf.name] = dict.fromkeys(BUFFER_COUNTERS, 0)
            self.buffer_info[buf.name] = buf
            self.read_touched[buf.name] = np.zeros(buf.nsectors, bool)
            self.write_touched[buf.name] = np.zeros(buf.nsectors, bool)
        return c

    def finalize(self, grid: "Dim3", block: "Dim3", shared_rule: str, launch_buffers: "list[Buffer]") -> dict:
        """The launch's counters as plain data (ints, strs, lists, dicts): JSON-serialisable."""
        for b in launch_buffers:  # a buffer passed to the kernel but never touched still appears
            self.buffer(b)
        tot = dict.fromkeys(LINE_COUNTERS, 0)
        for c in self.lines.values():
            for k, v in c.items():
                tot[k] += v
        buffers = {}
        for name, c in self.buffers.items():
            b = self.buffer_info[name]
            rd = int(self.read_touched[name].sum()) * SECTOR_BYTES
            wr = int(self.write_touched[name].sum()) * SECTOR_BYTES
            buffers[name] = {
                "shape": list(b.shape),
                "elements": int(b.size),
                "bytes": int(b.size) * WORD_BYTES,
                **{k: int(v) for k, v in c.items()},
                "dram_read_bytes_no_cache": int(c["global_load_sectors"]) * SECTOR_BYTES,
                "dram_write_bytes_no_cache": int(c["global_store_sectors"]) * SECTOR_BYTES,
                "dram_bytes_no_cache": int(c["global_load_sectors"] + c["global_store_sectors"]) * SECTOR_BYTES,
                "dram_read_bytes_ideal_cache": rd,
                "dram_write_bytes_ideal_cache": wr,
                "dram_bytes_ideal_cache": rd + wr,
            }
        out = {"kernels": [self.kernel_name], "launches": 1, "grid": list(grid), "block": list(block)}
        out["thread_blocks"] = grid.x * grid.y * grid.z
        out["shared_rule"] = shared_rule
        out.update({k: int(v) for k, v in tot.items()})
        out.update(_derived(out, buffers))
        out["shared_bytes_per_block"] = int(self.shared_bytes_per_block)
        out["live_words_per_thread"] = int(self.live_words_per_thread)
        out["live_words_per_block"] = int(self.live_words_per_block)
        out["buffers"] = buffers
        out["lines"] = {
            k: {"source": self.sources[k], **{n: int(v) for n, v in c.items() if v}} for k, c in self.lines.items()
        }
        out["race_reports"] = [dict(r) for r in self.races.values()]
        out["races"] = sum(r["accesses"] for r in out["race_reports"])
        out["unwritten_reads"] = [dict(r) for r in self.unwritten.values()]
        return out


def _derived(tot: dict, buffers: dict) -> dict:
    g = {
        "global_requests": tot["global_load_requests"] + tot["global_store_requests"],
        "global_sectors": tot["global_load_sectors"] + tot["global_store_sectors"],
        "global_bytes": tot["global_load_bytes"] + tot["global_store_bytes"],
        "shared_requests": tot["shared_load_requests"] + tot["shared_store_requests"],
        "shared_wavefronts": tot["shared_load_wavefronts"] + tot["shared_store_wavefronts"],
        "shared_bank_conflicts": tot["shared_load_bank_conflicts"] + tot["shared_store_bank_conflicts"],
    }
    for kind in ("read_", "write_", ""):
        for cache in ("no_cache", "ideal_cache"):
            key = f"dram_{kind}bytes_{cache}"
            g[key] = sum(b[key] for b in buffers.values())
    return g


_SUMMED = tuple(LINE_COUNTERS) + (
    "launches",
    "thread_blocks",
    "global_requests",
    "global_sectors",
    "global_bytes",
    "shared_requests",
    "shared_wavefronts",
    "shared_bank_conflicts",
    "races",
) + tuple(f"dram_{k}bytes_{c}" for k in ("read_", "write_", "") for c in ("no_cache", "ideal_cache"))


# Per-block peaks: a report of several launches keeps the largest.
_PEAKS = ("shared_bytes_per_block", "live_words_per_thread", "live_words_per_block")


def merge_stats(stats: list[dict]) -> dict:
    """Sum the plain-data counters of several launches (one report for a multi-kernel algorithm).

    Totals, per-buffer and per-line counters are summed (a buffer used by two launches is counted
    in each, as a real GPU with a cache flushed between kernels would); the per-block peaks
    (``shared_bytes_per_block``, ``live_words_per_thread``, ``live_words_per_block``) are the largest of any launch;
    ``per_launch`` keeps each launch's totals, without its lines and buffers."""
    out: dict = {k: 0 for k in _SUMMED}
    out["kernels"], out["buffers"], out["lines"], out["race_reports"], out["per_launch"] = [], {}, {}, [], []
    out["unwritten_reads"] = []
    out["shared_rule"] = stats[0]["shared_rule"] if stats else "course"
    for k in _PEAKS:
        out[k] = 0
    for s in stats:
        for k in _SUMMED:
            out[k] += s[k]
        for k in _PEAKS:
            out[k] = max(out[k], s.get(k, 0))
        out["kernels"] += s["kernels"]
        out["race_reports"] += s["race_reports"]
        out["unwritten_reads"] += s.get("unwritten_reads", [])
        for name, b in s["buffers"].items():
            if name not in out["buffers"]:
                out["buffers"][name] = dict(b)
            else:
                for k, v in b.items():
                    if k not in ("shape", "elements", "bytes"):
                        out["buffers"][name][k] += v
        for key, c in s["lines"].items():
            tgt = out["lines"].setdefault(key, {"source": c["source"]})
            for k, v in c.items():
                if k != "source":
                    tgt[k] = tgt.get(k, 0) + v
        out["per_launch"] += s.get("per_launch") or [
            {k: v for k, v in s.items() if k not in ("buffers", "lines", "race_reports", "unwritten_reads")}
        ]
    return out
