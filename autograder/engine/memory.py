"""The judge's own memory: what it holds, giving back what it no longer needs, and its bound.

The worker's memory is bounded by the kernel (rlimits, the sandbox). The judge's is bounded here:
every reply it decodes and every replay it runs are data a submission chose the size of, and the
judge is one process for the whole grade (a batch's judge, for many grades). Limits.judge_memory_mb
is the bound; Engine.request checks it after each reply, replay.py every 256 ops of a pass.

Two things made the judge's memory grow past what it held data for (measured: 5.7 GB still held
after grading one hostile submission's part 5, public and hidden): failed tests' exceptions kept
their tracebacks, and through the frames every replay of the test (runner.py now drops them); and
glibc keeps freed heap pages mapped, so resident memory never came down (release() hands them back).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

DEFAULT_BOUND_MB = 3072
_REGROW = 256 << 20  # over the bound, release again only once this much more is held since the last release

_page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_bound = DEFAULT_BOUND_MB << 20
_released = 0  # resident_anon() right after the last release()

try:  # glibc's malloc_trim: freed heap pages back to the kernel (absent on musl and macOS)
    _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
except (OSError, AttributeError):
    _trim = None


def resident_anon() -> int:
    """Bytes of this process's resident memory that no file backs (resident − shared), 0 where
    /proc is absent. Torch's libraries are file-backed and shared: they do not count."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * _page
    except (OSError, IndexError, ValueError):
        return 0


def release() -> int:
    """Free unreachable cycles and hand freed heap back; returns what is held after."""
    global _released
    gc.collect()
    if _trim is not None:
        _trim(0)
    _released = resident_anon()
    return _released


def trim_if_above(threshold: int) -> None:
    """release() where more than `threshold` bytes are held (after a grade: the next one starts lean)."""
    if resident_anon() > threshold:
        release()


def set_bound(mb: int) -> None:
    global _bound
    _bound = int(mb) << 20


def bound() -> int:
    return _bound


def over_bound() -> int | None:
    """The bytes held where that is over the bound even after a release, else None. A release
    (a full collection) runs only when the judge holds over the bound and has grown by _REGROW since
    the last one, so a judge that sits just over the bound is not collected on every reply."""
    used = resident_anon()
    if used <= _bound:
        return None
    if used - _released > _REGROW:
        used = release()
    return used if used > _bound else None


def describe(used: int) -> str:
    """'4.4 GB of the judge's memory (its bound: 3.0 GB)'."""
    return f"{used / 2**30:.1f} GB of the judge's memory (its bound: {_bound / 2**30:.1f} GB)"
