"""gpusim: a simulated GPU that runs CUDA-style kernels written in Python and counts their memory
traffic exactly (global requests, sectors, DRAM bytes, shared-memory wavefronts and bank
conflicts, atomics, barriers) and reports shared-memory races; a replay of a recorded run also refuses
register arithmetic that moves values between threads (lanes.py). See docs/gpusim_guide.md.

    from course import gpusim as gs
    gpu = gs.GPU()
    x = gpu.array("X", np.arange(64.0)); y = gpu.zeros("Y", 64)
    def copy(t, X, Y):
        i = t.blockIdx.x * t.blockDim.x + t.threadIdx.x
        Y[i] = X[i]
    stats = gpu.launch(copy, grid=2, block=32, x, y)   # plain-data counters
"""

from .api import run
from .engine import (
    GPU,
    NUM_BANKS,
    SECTOR_BYTES,
    SHARED_RULES,
    WARP_SIZE,
    Buffer,
    Dim3,
    SharedArray,
    ThreadContext,
    capture,
    merge_stats,
    unroll,
)
from .lanes import LaneError
from .trace import RecordingError, Replayed, Traced, digest, record, replay
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

__all__ = [
    "record", "replay", "digest", "Traced", "Replayed", "RecordingError",
    "GPU", "Buffer", "SharedArray", "ThreadContext", "Dim3", "run", "capture", "merge_stats", "unroll",
    "WARP_SIZE", "NUM_BANKS", "SECTOR_BYTES", "SHARED_RULES",
    "GpuSimError", "LaunchError", "KernelShapeError", "OutOfBoundsError", "MisalignedAccessError",
    "DivergentBarrierError", "SharedMemoryError", "RaceError", "LaneError",
]
