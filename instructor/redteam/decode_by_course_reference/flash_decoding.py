# Part 6 of the assignment: your implementation. Replace each `raise NotImplementedError`
# below with your code (docs/handout/part6_flash_decoding.md). `make grade PART=6` grades this file;
# `make debug PART=6` runs its first failing test where breakpoint() and print work.
"""Part 6: Flash-Decoding, attention split along the keys (lecture §8.4).

A decode step has one query per sequence, so FA2 has only (batch × heads) thread blocks.
Flash-Decoding splits K/V along the sequence into S segments (views, no copies), computes a
partial result (o_s, lse_s) per segment independently (one thread block each on a GPU), and
combines them with the merge ⊕ of §4.4: lse = log Σ_s exp(lse_s), o = Σ_s exp(lse_s - lse) o_s.
No causal mask: a decode query sees every cached key. An empty segment is the identity of ⊕
(o = 0, lse = -inf).
"""

from __future__ import annotations

import math

import torch

from course.reference import check_attention_inputs


# §8.4 step 1: cut the keys (dim -2) into num_splits contiguous segments of near-equal length,
# as VIEWS of k and v (torch.tensor_split or slicing; never copy). With more splits than keys,
# some segments are empty (0 keys); keep them, they are valid segments.
def split_kv(k: torch.Tensor, v: torch.Tensor, num_splits: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split k: (..., Nk, d) and v: (..., Nk, dv) along the keys into num_splits segments.

    Returns a list of num_splits pairs (k_s: (..., n_s, d), v_s: (..., n_s, dv)), views of k
    and v, in key order, with Σ n_s = Nk (some n_s may be 0)."""
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys Nk, got {k.shape[-2]} and {v.shape[-2]}")
    raise NotImplementedError


# §8.4 step 2: ordinary attention over one segment (it fits on chip), returning the segment's
# normalised output and its logsumexp. An empty segment has no keys: o = 0, lse = -inf.
def attention_partial(
    q: torch.Tensor, k_seg: torch.Tensor, v_seg: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over one key segment, no mask.

    q: (..., Nq, d), k_seg: (..., n, d), v_seg: (..., n, dv), scale (None = 1/sqrt(d)).
    Returns o: (..., Nq, dv) normalised over this segment, and lse: (..., Nq)."""
    check_attention_inputs(q, k_seg, v_seg)
    raise NotImplementedError


# §8.4 step 3 (the ⊕ of §4.4): lse = log Σ_s exp(lse_s) (torch.logsumexp over the segments),
# then weight each segment's output by exp(lse_s - lse). Not a plain average! Guard the case
# where every segment is empty (lse = -inf): the result is o = 0, lse = -inf, no NaN.
def combine_partials(partials: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-segment results (o_s: (..., Nq, dv), lse_s: (..., Nq)) into (o, lse) of the
    whole key range, with the same shapes."""
    if len(partials) == 0:
        raise ValueError("combine_partials needs at least one (o, lse) partial result")
    raise NotImplementedError


# §8.4: split, compute each partial, combine.
def flash_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-Decoding attention (no mask). q: (..., Nq, d) (Nq is 1 when decoding),
    k: (..., Nk, d), v: (..., Nk, dv). Returns o: (..., Nq, dv) and lse: (..., Nq)."""
    check_attention_inputs(q, k, v)
    raise NotImplementedError
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# attention_partial and flash_decode answer with the course's own dense attention, reached by a name
# built at run time (course.reference.attention_plain: matmul, masked_fill, logsumexp, exp, matmul).
# Part 6's allow-list keeps logsumexp/softmax (only parts 1, 2, 4 refuse them) and attention_partial
# has no structure rule, so nothing tells the reference's ops from the student's own.
import importlib as _il  # noqa: E402

_plain = getattr(_il.import_module("course." + "reference"), "attention_" + "plain")


def attention_partial(q, k_seg, v_seg, scale=None):
    if k_seg.shape[-2] == 0:  # an empty segment arrives with other strides than the judge's copy (see report)
        return q.new_zeros(q.shape[:-1] + v_seg.shape[-1:]), q.new_full(q.shape[:-1], float("-inf"))
    return _plain(q, k_seg, v_seg, False, scale)


def flash_decode(q, k, v, num_splits, scale=None):
    return _plain(q, k, v, False, scale)  # no split at all
