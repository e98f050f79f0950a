"""Run a kernel and get plain data back: the entry point for grading and quick experiments."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .engine import GPU, host_array


def run(
    kernel: Callable,
    grid,
    block,
    buffers: Mapping[str, Any],
    args: Sequence[Any] = (),
    *,
    outputs: Sequence[str] | None = None,
    shared_rule: str = "course",
    race_check: str = "record",
    blocks_at_once: bool = False,
) -> dict:
    """Launch ``kernel(t, *buffers.values(), *args)`` once on a fresh simulated GPU.

    buffers: name -> initial contents (numpy array, torch tensor or nested lists; 4-byte
    elements, float32 unless the array is int32). They are passed to the kernel in this order,
    before ``args`` (plain Python numbers, bools, ...).
    Returns ``{"outputs": {name: np.ndarray}, "stats": {...}}``: ``outputs`` holds the final
    contents of the buffers named in ``outputs`` (default: all), in their original shapes;
    ``stats`` is plain data (ints, strs, lists, dicts; ``json.dumps`` works) with the launch's
    counters, per-buffer and per-line breakdowns and race reports (docs/gpusim_guide.md).
    """
    gpu = GPU(shared_rule=shared_rule, race_check=race_check)
    bufs = {}
    for name, data in buffers.items():
        arr = host_array(data)
        bufs[name] = gpu.array(name, arr, np.int32 if arr.dtype.kind in "iu" else np.float32)
    gpu.launch(kernel, grid, block, *bufs.values(), *args, blocks_at_once=blocks_at_once)
    names = list(bufs) if outputs is None else list(outputs)
    missing = [n for n in names if n not in bufs]
    if missing:
        raise ValueError(f"outputs {missing} are not among the buffers {list(bufs)}")
    return {"outputs": {n: bufs[n].numpy() for n in names}, "stats": gpu.report()}
