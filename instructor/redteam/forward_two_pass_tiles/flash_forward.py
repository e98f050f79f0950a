"""Two-pass tiled softmax, NO online softmax: pass 1 streams S tiles for the exact row max;
pass 2 recomputes S, P = exp(S - m) with the final max (never rescaled), l and P V."""
from __future__ import annotations
import math
import torch
from course.reference import check_attention_inputs


def _pieces(i0, i1, Nk, block_k, causal, offset):
    pieces = []
    for j0 in range(0, Nk, block_k):
        j1 = min(j0 + block_k, Nk)
        if not causal:
            pieces.append((i0, i1, j0, j1))
            continue
        full_from = max(i0, j1 - 1 - offset)  # rows r >= this see the whole tile
        if full_from < i1:
            pieces.append((full_from, i1, j0, j1))
        for r in range(i0, min(full_from, i1)):
            e = r + 1 + offset
            if e > j0:
                pieces.append((r, r + 1, j0, min(e, j1)))
    return pieces


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    check_attention_inputs(q, k, v, block_q, block_k)
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    kt = k.reshape(-1, Nk, d).transpose(1, 2)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq
    o = q.new_zeros(B, Nq, dv)
    lse = q.new_zeros(B, Nq)
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        pieces = _pieces(i0, i1, Nk, block_k, causal, offset)
        # pass 1: the exact row max, no exp at all
        m = q.new_full((B, i1 - i0), float("-inf"))
        for r0, r1, j0, j1 in pieces:
            s = q[:, r0:r1] @ kt[:, :, j0:j1]
            m[:, r0 - i0:r1 - i0] = torch.maximum(m[:, r0 - i0:r1 - i0], s.amax(dim=-1))
        base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        # pass 2: the plain softmax against the final max
        l = q.new_zeros(B, i1 - i0)
        acc = q.new_zeros(B, i1 - i0, dv)
        for r0, r1, j0, j1 in pieces:
            s = q[:, r0:r1] @ kt[:, :, j0:j1]
            p = torch.exp(s - base[:, r0 - i0:r1 - i0].unsqueeze(-1))
            l[:, r0 - i0:r1 - i0] = l[:, r0 - i0:r1 - i0] + p.sum(dim=-1)
            acc[:, r0 - i0:r1 - i0] = acc[:, r0 - i0:r1 - i0] + p @ v[:, j0:j1]
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = m + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
