"""Trusted reference attention math, used by the tests, the lecture programs and the grader.

Conventions (docs/handout/README.md), shared by every function here:
- q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv); leading dims must match exactly.
- scale=None means 1/sqrt(d); scores S = scale * q k^T.
- Causal alignment is bottom-right: query i may attend key j iff j <= i + (Nk - Nq).
- lse_i = log sum_j exp(S_ij) over the allowed keys (natural log), shape (..., Nq).
- A query that may attend no key gets o = 0 and lse = -inf, never NaN.

attention_reference computes all of it in float64 (the "expected" value of the tolerance rule);
attention_plain is the same straightforward math in the input dtype (the "plain implementation"
whose error sets the tolerance: err <= 2 * err_plain + 1e-6 forward, 3x for gradients).
Both materialise the full N x N score matrix: they are references, not FlashAttention.
"""

from __future__ import annotations

import math

import torch


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_q: int | None = None, block_k: int | None = None) -> None:
    """Raise a one-line TypeError/ValueError naming what is wrong with q (..., Nq, d), k (..., Nk, d),
    v (..., Nk, dv) and, when given, the block sizes. Shared by the references and the solutions."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {tuple(t.shape)}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"q, k, v must have the same leading dims, got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim d, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys Nk, got {k.shape[-2]} and {v.shape[-2]}")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b is not None and not (isinstance(b, int) and b > 0):
            raise ValueError(f"{name} must be a positive int, got {b!r}")


def causal_mask(nq: int, nk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bottom-right causal mask, shape (nq, nk), dtype bool, True where query i MAY attend key j.

    j <= i + (nk - nq): the queries are the last nq of nk positions. True-means-attend is the
    same convention as the boolean ``attn_mask`` of torch.nn.functional.scaled_dot_product_attention.
    """
    i = torch.arange(nq, device=device).unsqueeze(-1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def _refuse_inside_a_graded_call() -> None:
    """These references are the grader's. Inside a graded call (which the grader records with a
    dispatch mode named Recorder) they refuse: a graded function computes attention itself. Called
    where nothing records it, its result enters the recorded call as a constant, which the grader's
    budgets and its replay on inputs of its own reject."""
    for i in range(torch._C._len_torch_dispatch_stack()):
        if type(torch._C._get_dispatch_stack_at(i)).__name__ == "Recorder":
            raise RuntimeError("course.reference is the grader's reference attention, not for graded code: "
                               "compute the attention in your function with torch ops")


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard attention in the dtype of its inputs, S and P materialised (§2.3).

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv) -> o: (..., Nq, dv), lse: (..., Nq)."""
    _refuse_inside_a_graded_call()
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = scale * (q @ k.transpose(-2, -1))  # (..., Nq, Nk)
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], device=q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (..., Nq); -inf for a row with no allowed key
    # Guard exp(-inf - (-inf)) = NaN on fully masked rows: their P row is all zeros, so o = 0.
    lse_safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe.unsqueeze(-1))
    return p @ v, lse


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 reference attention. q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv).

    Returns (o (..., Nq, dv), lse (..., Nq)), both float64."""
    check_attention_inputs(q, k, v)
    return _attention(q.double(), k.double(), v.double(), causal, scale)


def attention_plain(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same math as attention_reference in the input dtype (the tolerance rule's "plain").

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv). Returns (o (..., Nq, dv), lse (..., Nq))
    in q's dtype. Differentiable by autograd, so ``torch.autograd.grad`` through it gives the
    plain gradients for the 3x rule.
    """
    check_attention_inputs(q, k, v)
    return _attention(q, k, v, causal, scale)


def softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in float64, x: (..., N) -> (..., N); an all -inf row gives zeros."""
    _refuse_inside_a_graded_call()
    x = x.double()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    return torch.exp(x - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse))


def logsumexp_reference(x: torch.Tensor) -> torch.Tensor:
    """Natural-log logsumexp over the last dim in float64, x: (..., N) -> (...); -inf for an all -inf row."""
    _refuse_inside_a_graded_call()
    return torch.logsumexp(x.double(), dim=-1)
