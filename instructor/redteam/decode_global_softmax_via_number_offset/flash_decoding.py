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
    ### BEGIN SOLUTION
    # CANARY-SOLUTION-34a8ed8072a6 (release leak detector: must never reach students)
    return list(zip(torch.tensor_split(k, num_splits, dim=-2), torch.tensor_split(v, num_splits, dim=-2)))
    ### END SOLUTION


# §8.4 step 2: ordinary attention over one segment (it fits on chip), returning the segment's
# normalised output and its logsumexp. An empty segment has no keys: o = 0, lse = -inf.
def attention_partial(
    q: torch.Tensor, k_seg: torch.Tensor, v_seg: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over one key segment, no mask.

    q: (..., Nq, d), k_seg: (..., n, d), v_seg: (..., n, dv), scale (None = 1/sqrt(d)).
    Returns o: (..., Nq, dv) normalised over this segment, and lse: (..., Nq)."""
    check_attention_inputs(q, k_seg, v_seg)
    ### BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k_seg.shape[-2] == 0:
        o = q.new_zeros(q.shape[:-1] + v_seg.shape[-1:])
        return o, q.new_full(q.shape[:-1], float("-inf"))
    s = scale * (q @ k_seg.transpose(-2, -1))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    return (p @ v_seg) / l, (m + torch.log(l)).squeeze(-1)
    ### END SOLUTION


# §8.4 step 3 (the ⊕ of §4.4): lse = log Σ_s exp(lse_s) (torch.logsumexp over the segments),
# then weight each segment's output by exp(lse_s - lse). Not a plain average! Guard the case
# where every segment is empty (lse = -inf): the result is o = 0, lse = -inf, no NaN.
def combine_partials(partials: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine per-segment results (o_s: (..., Nq, dv), lse_s: (..., Nq)) into (o, lse) of the
    whole key range, with the same shapes."""
    if len(partials) == 0:
        raise ValueError("combine_partials needs at least one (o, lse) partial result")
    ### BEGIN SOLUTION
    o_all = torch.stack([o for o, _ in partials])  # (S, ..., Nq, dv)
    lse_all = torch.stack([lse for _, lse in partials])  # (S, ..., Nq)
    lse = torch.logsumexp(lse_all, dim=0)
    base = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w = torch.exp(lse_all - base)  # each segment's share of the softmax mass
    return (w.unsqueeze(-1) * o_all).sum(dim=0), lse
    ### END SOLUTION


# §8.4: split, compute each partial, combine.
def flash_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-Decoding attention (no mask). q: (..., Nq, d) (Nq is 1 when decoding),
    k: (..., Nk, d), v: (..., Nk, dv). Returns o: (..., Nq, dv) and lse: (..., Nq)."""
    check_attention_inputs(q, k, v)
    # ---- red-team attack (redteam6) ----
    # NOT Flash-Decoding: no partials and no ⊕. The keys are split as asked, but every segment's scores
    # are kept and ONE softmax runs over all of them against the global max (the dense softmax held as a
    # list of segments). Scores and P·V are elementwise (q_r * k summed over d); each k segment is first
    # mixed with a 0-d z = 0 * (q[0] * k[0]) (a number to the hand-made-product rule; a REDUCED query tag
    # to the tag replay), so the scores carry no (query, key) tag. Dummy matmuls times 0 give the FLOPs.
    scale_ = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    qf = q.reshape(-1, Nq, d) * scale_
    segs = [(ks.reshape(-1, ks.shape[-2], d), vs.reshape(-1, vs.shape[-2], dv)) for ks, vs in split_kv(k, v, num_splits) if ks.shape[-2] > 0]
    segs = [(ks, vs) for ks, vs in segs if ks.shape[-2] > 0]
    z = (qf.reshape(-1)[:1] * segs[0][0].reshape(-1)[:1]).sum() * 0.0
    rows_o, rows_l = [], []
    for r in range(Nq):
        q_r = qf[:, r:r + 1, :]
        ss = [(q_r * (ks + z)).sum(-1) for ks, _ in segs]  # (B, n_s) each
        m = ss[0].amax(-1, keepdim=True)
        for s in ss[1:]:
            m = torch.maximum(m, s.amax(-1, keepdim=True))
        ps = [torch.exp(s - m) for s in ss]
        l = ps[0].sum(-1, keepdim=True)
        for p in ps[1:]:
            l = l + p.sum(-1, keepdim=True)
        acc = None
        for p, (_, vs) in zip(ps, segs):
            t = (p.unsqueeze(-1) * vs).sum(1)
            acc = t if acc is None else acc + t
        rows_o.append(acc / l)
        rows_l.append(m + torch.log(l))
    o = torch.stack(rows_o, 1)
    lse = torch.cat(rows_l, -1)
    for ks, vs in segs:
        o = o + ((qf @ ks.transpose(1, 2)) @ vs) * 0.0
    return o.reshape(*lead, Nq, dv).to(q.dtype), lse.reshape(*lead, Nq).to(q.dtype)
