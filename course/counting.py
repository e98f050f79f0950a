"""Counting element reads, for the "how many passes over the input" demos of §4.

A ReadCounter wraps a 1-D sequence of numbers and counts every element that is read, so that
``counter.reads / len(counter)`` is the number of passes an algorithm made over its input
(naive softmax 2, safe softmax 3, online softmax 2; §4.1–§4.3).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


class ReadCounter:
    """A read-only 1-D sequence of floats that counts element reads.

    ``x[i]`` and iteration each count one read per element returned. ``len(x)`` is free.
    Slicing is refused: an algorithm must say which elements it reads.
    """

    def __init__(self, values: Sequence[float] | torch.Tensor) -> None:
        if isinstance(values, torch.Tensor):
            if values.dim() != 1:
                raise ValueError(f"ReadCounter wraps a 1-D sequence, got a tensor of shape {tuple(values.shape)}")
            values = values.tolist()
        self._values = [float(v) for v in values]
        self.reads = 0

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i: int) -> float:
        if not isinstance(i, int):
            raise TypeError(f"ReadCounter takes one integer index at a time, got {type(i).__name__}")
        value = self._values[i]  # raises IndexError as a list would
        self.reads += 1
        return value

    def __iter__(self) -> Iterator[float]:
        for value in self._values:
            self.reads += 1
            yield value

    @property
    def passes(self) -> float:
        """Reads divided by the length: how many times the input was read end to end."""
        return self.reads / len(self._values) if self._values else 0.0

    def reset(self) -> None:
        """Forget the reads counted so far (to reuse one counter for several algorithms)."""
        self.reads = 0

    def __repr__(self) -> str:
        return f"ReadCounter(len={len(self)}, reads={self.reads})"
