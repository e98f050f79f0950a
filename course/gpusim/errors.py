"""Errors raised by the simulated GPU. Each message is ONE line that says what is wrong, where
(the kernel's file and line when it comes from a kernel), and what to do about it."""

from __future__ import annotations


class GpuSimError(Exception):
    """Base class of every error the simulator raises."""


class LaunchError(GpuSimError):
    """A bad launch configuration (grid, block, arguments) or a kernel that cannot run."""


class KernelShapeError(GpuSimError):
    """An index, mask or value whose shape is not 'one per thread' (last axis) or broadcastable."""


class OutOfBoundsError(GpuSimError):
    """A global or shared access outside its array (CUDA: an illegal address, or silent garbage)."""


class MisalignedAccessError(GpuSimError):
    """A float2/float4 access whose element index is not a multiple of 2/4 (CUDA: misaligned address)."""


class DivergentBarrierError(GpuSimError):
    """syncthreads() reached by only some threads of a block (CUDA: deadlock or undefined behaviour)."""


class SharedMemoryError(GpuSimError):
    """Shared memory declared twice, or more than a block may have."""


class RaceError(GpuSimError):
    """A shared-memory race (raised only with race_check="raise"; by default races are recorded)."""
