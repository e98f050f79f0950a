"""The student API: every function (and class member) of the graded files that the tests call.

This is the one list of what the grader expects a submission to provide, as CS336's
tests/adapters.py is for that course: module (the graded file, without .py), name, the parameters
(names and defaults, as in solutions/ and the handout) and what comes back. The tests and scenarios
reach student code only through these names: `student.call("flash_forward.flash_forward", ...)`,
`student.function(...)`, `student.module(...)` (tests/test_student_api.py checks that every target
they use is listed here, and that each entry matches solutions/, starter/ and the handout).

Renaming a graded function means changing it here, in the handout, in solutions/ (then
`make starter`), and in the tests that call it; the check above names every place that disagrees.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Graded:
    part: int
    target: str  # "module.name" or "module.Class.member"
    params: str  # parameter names and defaults, e.g. "(q, k, v, causal=False)"; "" for a property
    returns: str  # what comes back, with shapes
    implement: bool = True  # False: given code the tests call (the student does not write it)


API: tuple[Graded, ...] = (
    # part 1: online_softmax.py
    Graded(1, "online_softmax.naive_softmax", "(x)", "softmax over the last dim, shape of x"),
    Graded(1, "online_softmax.safe_softmax", "(x)", "softmax over the last dim, shape of x"),
    Graded(1, "online_softmax.online_summary", "(x)", "(m, l): max and Σ exp(x - m) over the last dim"),
    Graded(1, "online_softmax.online_softmax", "(x)", "softmax over the last dim, shape of x"),
    Graded(1, "online_softmax.merge_summary", "(a, b)", "(m, l) of the two segments together (⊕)"),
    Graded(1, "online_softmax.merge_partial", "(a, b)", "(m, l, o) of the two partial results together"),
    Graded(1, "online_softmax.naive_softmax_counted", "(x)", "list[float] (x: a course.counting.ReadCounter)"),
    Graded(1, "online_softmax.safe_softmax_counted", "(x)", "list[float]"),
    Graded(1, "online_softmax.online_softmax_counted", "(x)", "(list[float], number of rebases)"),
    # part 2: flash_forward.py
    Graded(2, "flash_forward.flash_forward", "(q, k, v, causal=False, block_q=64, block_k=64, scale=None)",
           "(o, lse): o (..., Nq, d) like q; lse (..., Nq) natural-log logsumexp"),
    # part 3: flash_kernel.py
    Graded(3, "flash_kernel.flash_forward_kernel",
           "(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols)", "None (writes O and L on the simulated GPU)"),
    Graded(3, "flash_kernel.run_flash_kernel", "(q, k, v, causal=False, block_rows=64, block_cols=64)",
           "(o, lse, stats): o (Nq, d), lse (Nq,), the simulator's counters", implement=False),
    # part 4: flash_backward.py
    Graded(4, "flash_backward.flash_backward",
           "(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None)", "(dq, dk, dv), shapes of q, k, v"),
    Graded(4, "flash_backward.FlashAttentionFunction", "(q, k, v, causal=False, block_q=64, block_k=64, scale=None)",
           "torch.autograd.Function: .apply(...) returns o (differentiable), saves q, k, v, o, lse for its backward"),
    Graded(4, "flash_backward.flash_forward", "(q, k, v, causal=False, block_q=64, block_k=64, scale=None)",
           "part 2's flash_forward as flash_backward.py imports it (the tests swap in a correct one)", implement=False),
    Graded(4, "flash_backward.flash_attention", "(q, k, v, causal=False)", "o, differentiable (via FlashAttentionFunction)"),
    # part 5: kv_cache.py
    Graded(5, "kv_cache.KVCache", "(n_layers, batch, n_heads, max_len, head_dim, dtype=torch.float32)",
           "a cache of n_layers K/V buffers (batch, n_heads, max_len, head_dim)"),
    Graded(5, "kv_cache.KVCache.length", "", "int: tokens cached so far (layer 0)"),
    Graded(5, "kv_cache.KVCache.update", "(self, layer, k_new, v_new)",
           "(k, v) of that layer so far, (batch, n_heads, length, head_dim), views of the buffers"),
    Graded(5, "kv_cache.forward_with_cache", "(model, tokens, cache, attention=standard_attention)",
           "logits (B, T, vocab) for the new tokens"),
    Graded(5, "kv_cache.generate", "(model, prompt, max_new_tokens, use_cache=True, attention=standard_attention)",
           "tokens (B, L + max_new_tokens), greedy"),
    # part 6: flash_decoding.py
    Graded(6, "flash_decoding.split_kv", "(k, v, num_splits)", "list of (k_seg, v_seg) views along the key dim"),
    Graded(6, "flash_decoding.attention_partial", "(q, k_seg, v_seg, scale)", "(o, lse) of q over one segment"),
    Graded(6, "flash_decoding.combine_partials", "(partials)", "(o, lse) of all segments together"),
    Graded(6, "flash_decoding.flash_decode", "(q, k, v, num_splits, scale=None)", "(o, lse), as attention over all keys"),
)

TARGETS: frozenset[str] = frozenset(g.target for g in API)
MODULES: frozenset[str] = frozenset(g.target.split(".", 1)[0] for g in API)


def entry(target: str) -> Graded:
    """The entry for "module.name" (KeyError if the tests may not call it)."""
    for g in API:
        if g.target == target:
            return g
    raise KeyError(f"{target} is not in the student API (autograder/student_api.py)")
