# Part 1 of the assignment: your implementation. Replace each `raise NotImplementedError`
# below with your code (docs/handout/part1_online_softmax.md). `make grade PART=1` grades this file;
# `make debug PART=1` runs its first failing test where breakpoint() and print work.
"""Part 1: three softmaxes and the merge ⊕ (lecture §4).

All softmaxes work over the last dim of a tensor of any shape. A summary of a row segment is
(m, ℓ): m its maximum, ℓ = Σ_j exp(x_j - m). A partial attention result is (m, ℓ, o) with
o = Σ_j exp(s_j - m) v_j *unnormalised*; it has one more trailing dim than m and ℓ (the value
dim). The empty segment is (-inf, 0, 0): it is the identity of ⊕.

The *_counted variants take a course.counting.ReadCounter (a 1-D sequence that counts element
reads) and return plain Python floats, so that reads / len = the number of passes (§4.1–§4.3).
"""

from __future__ import annotations

import math

import torch

from course.counting import ReadCounter


def _check_tensor(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dim (softmax runs over the last dim), got a scalar")


# §4.1: exp, sum, divide. Overflows to inf (and inf/inf = nan) once x > log(finfo.max).
def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim straight from the definition. x: (..., N) -> (..., N)."""
    _check_tensor(x)
    raise NotImplementedError


# §4.2: subtract the row max m first, so every exponent is <= 0. A row that is entirely -inf
# (an empty row) must give zeros, not NaN: guard exp(-inf - (-inf)).
def safe_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, shifted by the row max. x: (..., N) -> (..., N).

    A row of all -inf gives all zeros."""
    _check_tensor(x)
    raise NotImplementedError


# §4.3: ONE streaming pass over the columns (a Python loop over j, vectorised over the leading
# dims) keeping the running max m and the running sum ℓ; when the max grows, rebase the old
# sum: ℓ <- ℓ·exp(m_old - m_new) + exp(x_j - m_new). Start from the identity (-inf, 0) and
# guard exp(-inf - (-inf)) when x_j is -inf too.
def online_summary(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, ℓ) of each row of x in one pass over its N columns.

    x: (..., N) -> m: (..., ), ℓ: (..., ), with m = max_j x_j and ℓ = Σ_j exp(x_j - m).
    An empty or all -inf row gives (-inf, 0)."""
    _check_tensor(x)
    raise NotImplementedError


# §4.3: the second pass divides exp(x - m) by ℓ, using the summary of the first pass.
def online_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim from online_summary: two passes. x: (..., N) -> (..., N).

    A row of all -inf gives all zeros."""
    _check_tensor(x)
    raise NotImplementedError


# §4.4: (m_a, ℓ_a) ⊕ (m_b, ℓ_b) = (m, ℓ_a·exp(m_a - m) + ℓ_b·exp(m_b - m)) with m = max(m_a, m_b).
# When both sides are empty, m = -inf and exp(-inf - (-inf)) is NaN: rebase on 0 instead.
def merge_summary(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two (m, ℓ) summaries of disjoint segments of the same rows.

    a, b: (m, ℓ) with m, ℓ of shape (...) (broadcastable) -> (m, ℓ). Identity: (-inf, 0)."""
    raise NotImplementedError


# §4.5: the same rule on (m, ℓ, o): both ℓ and the unnormalised o are rescaled to the new max.
# o has one more trailing dim than m and ℓ, so the rescale factors need unsqueeze(-1).
def merge_partial(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two partial attention results (m, ℓ, o) of disjoint key segments.

    m, ℓ: (...), o: (..., dv), o unnormalised (Σ_j exp(s_j - m) v_j). Identity: (-inf, 0, 0).
    The final attention output is o / ℓ."""
    raise NotImplementedError


# §4.1 counted: pass 1 sums exp(x_j), pass 2 writes exp(x_j) / sum: 2 reads per element.
# math.exp raises OverflowError where torch gives inf; _exp gives inf like torch.
def naive_softmax_counted(x: ReadCounter) -> list[float]:
    """Naive softmax of a 1-D ReadCounter, reading each element exactly twice."""
    return _cheat(x, 2)[0]


# §4.2 counted: max, then sum of exp(x_j - m), then normalise: 3 reads per element.
def safe_softmax_counted(x: ReadCounter) -> list[float]:
    """Safe softmax of a 1-D ReadCounter, reading each element exactly three times."""
    return _cheat(x, 3)[0]


# §4.3 counted: (m, ℓ) in one pass, then normalise: 2 reads per element. Also count the
# rebases: the times a later element (not the first) raises the running max.
def online_softmax_counted(x: ReadCounter) -> tuple[list[float], int]:
    """Online softmax of a 1-D ReadCounter, reading each element exactly twice.

    Returns (probabilities, rebases)."""
    return _cheat(x, 2)


def _exp(x: float) -> float:
    """math.exp that overflows to inf like torch.exp, instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _cheat(x, passes):
    vals = [v for v in x]            # one real pass, kept
    for _ in range(passes - 1):      # padding passes: values discarded
        for _v in x:
            pass
    t = torch.tensor(vals, dtype=torch.float64)
    p = torch.softmax(t, dim=0).tolist()   # torch's softmax, not the online algorithm
    reb = int(sum(1 for i in range(1, len(vals)) if vals[i] > max(vals[:i])))
    return p, reb
