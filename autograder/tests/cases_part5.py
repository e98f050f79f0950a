"""Part 5 (kv_cache): cases and checks shared by the public and the hidden tests.

The trusted side is the course model WITHOUT a cache (course.tiny_transformer, committed
checkpoint): logits of the whole sequence in one call, positions 0..T-1. The student's cache runs
in the worker (autograder/scenarios/part5.py), which RECORDS the ops; the judge replays the record
with its own copy of the model weights (autograder/engine/replay.py) and grades the replay (the course
model's embedding, norms, projections + RoPE, SwiGLU and lm_head are the record's "judge::" ops, computed
by the judge with its own course functions: TRUSTED below):
- the logits of every call come from the replay; a twin replay with the judge's own perturbed
  weights must give the logits of the perturbed model (an answer computed outside the call fails);
- "no recompute": the replayed matmul FLOPs of each forward_with_cache call are at most those of its
  c NEW tokens (projections, FFN, head) plus their attention over at most max_len keys
  (`call_flops_bound`): linear in the context, where recomputing the prefix costs (prefix + c)
  tokens' worth every call;
- "views, not copies": in the judge's replay every k_all / v_all an update returns lives in one
  storage per layer, as large as a (B, H, max_len, d) buffer.

Which inputs expose which bug (measured on the course's testing notes and on this model):
- the layer-0 cache-length regression (§8.2: positions read from cache.length inside the layer
  loop, after layer 0 has appended) leaves prefill logits exact (RoPE is relative within one
  call) and shifts later steps only slightly (~1e-2 on logits), and does nothing with a 1-token
  prompt or a 1-layer model. So: the 2-layer model, prompts of >= 2 tokens, logits compared at
  EVERY step at a tight tolerance, not just greedy tokens;
- a top-left mask while a cache is in use shows on decode steps and multi-token chunks.
When a logits check fails, the judge recomputes the known buggy variants with its own small
reference cache (below) and names the bug the student's logits match.

Tolerance (float32): the student's cached logits against the float64 uncached model may be off by
at most FACTOR × the error of the float32 UNCACHED model + ATOL32. A cache changes the order of
float32 operations (attention over k_all instead of a masked full S, per-chunk matmuls), so its
rounding error is a few times the plain model's; the measured figures are next to the constants.
float64 runs use ATOL64 against the float64 uncached model.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from autograder.engine import replay, sanitize
from autograder.engine import tolerances as tol
from autograder.engine.checks import CheckFailure, check, check_close, join_hints, one_thread
from autograder.engine.errors import StudentError
from course import likesworld
from course import tiny_transformer as tt
from course.tiny_transformer import TinyTransformer, load_checkpoint, rope

from . import probes as pb

DTYPES = {"float32": torch.float32, "float64": torch.float64}

# The rule and its measurements: autograder/engine/tolerances.py, rule 8.
FACTOR = tol.KV_CACHE_FACTOR
ATOL32 = tol.KV_CACHE_ATOL32
ATOL64 = tol.FLOAT64_ATOL

HINT_LAYER0 = ("layer-0 cache-length regression (§8.2): the new tokens' positions were read from cache.length "
               "inside the layer loop, after layer 0 had already appended them, so layers >= 1 used positions "
               "shifted by T; compute positions = arange(cache.length, cache.length + T) ONCE per call, "
               "before the loop")
HINT_POSITIONS_ZERO = ("the new tokens get positions 0..T-1 at every call: positions continue the sequence, "
                       "cache.length .. cache.length + T - 1, for the queries and for the keys cached (RoPE, §8.2)")
HINT_TOPLEFT = ("top-left causal mask while a cache is in use: the T new queries are the LAST T positions of "
                "the cached keys, so query i may see key j iff j <= i + (Tk - T) (bottom-right, handout "
                "conventions); give each block's attention the whole filled cache and causal=True")
HINT_CACHE = ("with a cache, the logits must equal recomputing the whole sequence at every step (§8.2): "
              "append each layer's new k, v (after RoPE) to THAT layer's cache, attend to the whole filled "
              "prefix, and give the new tokens positions cache.length .. cache.length + T - 1")
HINT_LENGTH = "cache.length is the number of tokens cached so far by layer 0 (it grows by T per forward call)"
HINT_GENERATE = ("generate must be greedy: prefill the prompt once, then feed back one token per step; with "
                 "use_cache=False recompute the whole sequence each step; both must give the same tokens")
HINT_FITS = ("the cache overflows only when length + T > max_len: a chunk that fills it to exactly max_len "
             "fits (compare with >, not >=), and each layer counts its own lengths[layer]")
HINT_UPDATE = ("update(layer, k_new, v_new) writes the new (B, H, T, d) keys/values after that layer's "
               "previous ones and returns the filled prefix (B, H, length + T, d)")
HINT_VIEWS = ("update must return views (slices) of the preallocated (…, max_len, d) buffers, not fresh "
              "tensors: allocate once in __init__, never torch.cat")
HINT_ERRORS = ("raise ValueError with a one-line message that says what is wrong and what to do; check the layer "
               "against 0 <= layer < n_layers first (a negative index would silently update the last layer)")
HINT_NO_FINAL_NORM = ("the logits are the model's without its final norm: logits = model.lm_head(model.norm(x)) after "
                      "the last block (model.forward's last step)")
HINT_BLOCK_SKIPPED = ("the logits are the model's without its last block: run every block of model.blocks, each with its "
                      "own layer of the cache")
HINT_REJECTED = ("a rejected update changes nothing: check every argument (layer, shapes, room left) before you write "
                 "into the buffers or move the layer's length, so the next update that fits succeeds and returns the "
                 "tokens cached before it, then its own")
HINT_RECOMPUTE = ("forward_with_cache must not recompute the cached tokens: project only the T new tokens, append "
                  "their k, v to the cache and attend to the cache (§8.2); each call's work must grow with T and "
                  "the context length, not with re-running the whole prefix")


# ---------------------------------------------------------------------------------------------------
# The trusted side: the course model, and a small reference cache that can reproduce the known bugs




@lru_cache(maxsize=None)
def model(dtype: str = "float32") -> TinyTransformer:
    return load_checkpoint().to(DTYPES[dtype]).requires_grad_(False)


@lru_cache(maxsize=None)
def twin_model(dtype: str = "float32") -> TinyTransformer:
    """The judge's own model for the twin replay: every weight of the float32 checkpoint moved by up to
    5 % (replay.perturbed), then cast to `dtype` (so the float64 twin is the float32 twin exactly)."""
    m = load_checkpoint().requires_grad_(False)
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(m.named_parameters())):
            p.copy_(replay.perturbed(p.detach(), 500 + i))
    return m.to(DTYPES[dtype])


def named_weights(m: TinyTransformer) -> dict[str, torch.Tensor]:
    """The names the worker gives the model's parameters in a record (scenarios/part5._recorder)."""
    return {f"param:{n}": p.detach() for n, p in m.named_parameters()}


# ---------------------------------------------------------------------------------------------------
# The course model's pieces that contain no student code, as the record's "judge::" ops
# (scenarios/part5._course_ops_trusted): the judge computes each with its own course function on the
# replay's tensors (its own weights, named), after checking the arguments against the function's
# signature and bounding the op from shapes (replay.TrustedOp). No scalar argument: eps, the RoPE base
# and the number of heads are the judge's own model config. Matmul FLOPs: the course function's, 2 per multiply-add (what the
# replay of its recorded ops counts: tests/test_part5_trusted.py), so a recompute pays for every token.


def _refuse(name: str, why: str) -> None:
    raise replay.ReplayRefused(f"the record's judge::{name} is called on {why}", "malformed")


def _same_floats(name: str, *ts: torch.Tensor) -> None:
    if ts[0].dtype not in (torch.float32, torch.float64) or any(t.dtype != ts[0].dtype for t in ts):
        _refuse(name, "tensors that are not all float32 or all float64")


def _rows(name: str, x: torch.Tensor, d: int) -> int:
    """The rows of x (..., d), 1 to 4 dims."""
    if not 1 <= x.dim() <= 4 or x.shape[-1] != d:
        _refuse(name, f"a tensor of shape {tuple(x.shape)} where (..., {d}) is expected")
    return math.prod(x.shape[:-1])


def _linear_cost(args: list) -> tuple[list[int], int]:
    """x (..., d_in) @ w (d_out, d_in)ᵀ: out (..., d_out); 2·rows·d_in·d_out FLOPs."""
    x, w = replay.trusted_tensors("linear", args, 2)
    _same_floats("linear", x, w)
    if w.dim() != 2:
        _refuse("linear", "a weight that is not a matrix")
    rows = _rows("linear", x, w.shape[1])
    return [8 * rows * w.shape[0]], 2 * rows * w.shape[0] * w.shape[1]


def _rms_norm_cost(args: list) -> tuple[list[int], int]:
    """x (..., d), weight (d,): out (..., d) and two temporaries of x's size; no matmul."""
    x, w = replay.trusted_tensors("rms_norm", args, 2)
    _same_floats("rms_norm", x, w)
    if w.dim() != 1:
        _refuse("rms_norm", "a weight that is not a vector")
    _rows("rms_norm", x, w.shape[0])
    return [8 * x.numel()] * 3, 0


def _swiglu_cost(args: list) -> tuple[list[int], int]:
    """x (..., d), w1 and w3 (d_ff, d), w2 (d, d_ff): out (..., d), four (..., d_ff) temporaries;
    three matmuls, 2·rows·d·d_ff FLOPs each."""
    x, w1, w3, w2 = replay.trusted_tensors("swiglu", args, 4)
    _same_floats("swiglu", x, w1, w3, w2)
    if w1.dim() != 2 or w1.shape != w3.shape or tuple(w2.shape) != (w1.shape[1], w1.shape[0]):
        _refuse("swiglu", "weights of shapes that do not fit together")
    d_ff, d = w1.shape
    rows = _rows("swiglu", x, d)
    return [8 * rows * d_ff] * 4 + [8 * rows * d], 3 * 2 * rows * d * d_ff


def _embedding_cost(args: list) -> tuple[list[int], int]:
    """tokens (...) long, weight (V, d): out (..., d); no matmul (a lookup)."""
    tokens, w = replay.trusted_tensors("embedding", args, 2)
    _same_floats("embedding", w)
    if tokens.dtype != torch.long or not 1 <= tokens.dim() <= 4 or w.dim() != 2:
        _refuse("embedding", "tensors other than token ids (...) long and a (V, d) table")
    return [8 * tokens.numel() * w.shape[1]], 0


def _attention_heads_cost(args: list) -> tuple[list[int], int]:
    """x (B, T, D), positions (T,) long, wq/wk/wv (D', D) with D' = H·d, d even (H: the judge's config):
    q, k, v (B, H, T, d) and the temporaries of two ropes; three matmuls, 2·B·T·D·D' FLOPs each, and
    the angle table (positions × frequencies, an outer product: 2·T·d/2 FLOPs, as replay counts it)."""
    x, positions, wq, wk, wv = replay.trusted_tensors("attention_heads", args, 5)
    _same_floats("attention_heads", x, wq, wk, wv)
    H = _config().n_heads
    if x.dim() != 3 or wq.dim() != 2 or not wq.shape == wk.shape == wv.shape or wq.shape[1] != x.shape[-1] \
            or wq.shape[0] % (2 * H) or positions.dtype != torch.long or tuple(positions.shape) != (x.shape[1],):
        _refuse("attention_heads", "tensors other than x (B, T, D), positions (T,) long and three (H·d, D) weights")
    out = x.shape[0] * x.shape[1] * wq.shape[0]
    T, d = positions.numel(), wq.shape[0] // H
    angles = T * d if T > 1 and d > 2 else 0  # one position or one frequency is a scaling, not a product
    return [8 * out] * 11 + [8 * positions.numel() * wq.shape[0] // H] * 6, 3 * 2 * out * x.shape[-1] + angles


def _merge_heads_cost(args: list) -> tuple[list[int], int]:
    """o (B, H, T, d), wo (D, H·d): out (B, T, D) and o's heads side by side; 2·B·T·H·d·D FLOPs."""
    o, wo = replay.trusted_tensors("merge_heads", args, 2)
    _same_floats("merge_heads", o, wo)
    if o.dim() != 4 or wo.dim() != 2 or wo.shape[1] != o.shape[1] * o.shape[3]:
        _refuse("merge_heads", "tensors other than o (B, H, T, d) and a (D, H·d) weight")
    rows = o.shape[0] * o.shape[2]
    return [8 * o.numel(), 8 * rows * wo.shape[0]], 2 * rows * wo.shape[0] * wo.shape[1]


def _embedding(tokens: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < w.shape[0]):
        _refuse("embedding", "token ids outside the table")
    return F.embedding(tokens, w)


def _config() -> Any:
    return model().config


TRUSTED: dict[str, replay.TrustedOp] = {
    "linear": replay.TrustedOp(F.linear, _linear_cost),
    "rms_norm": replay.TrustedOp(lambda x, w: tt.rms_norm(x, w, _config().norm_eps), _rms_norm_cost),
    "swiglu": replay.TrustedOp(tt.swiglu, _swiglu_cost),
    "embedding": replay.TrustedOp(_embedding, _embedding_cost),
    "attention_heads": replay.TrustedOp(lambda x, positions, wq, wk, wv: tt.attention_heads(
        x, positions, wq, wk, wv, _config().n_heads, _config().rope_base), _attention_heads_cost),
    "merge_heads": replay.TrustedOp(tt.merge_heads, _merge_heads_cost),
}


def call_flops_bound(c: int, max_len: int, batch: int = 1) -> int:
    """Most matmul FLOPs of one forward_with_cache call on c new tokens with a cache of max_len:
    per new token the projections (4·d²), the FFN (3·d·d_ff) and the head (d·V), 2 FLOPs each, in
    every layer; plus scores and P·V (4·d per query-key pair and layer) over at most max_len keys;
    plus RoPE's angle table (positions × frequencies, an outer product of 2·c·head_dim/2 FLOPs when a
    block is written out op by op), allowed twice per layer (once for q, once for k). Broadcast
    products count as the matmuls they are (replay), so recomputing through them pays too."""
    cfg = model().config
    per_token = cfg.n_layers * 2 * (4 * cfg.d_model ** 2 + 3 * cfg.d_model * cfg.d_ff) + 2 * cfg.d_model * cfg.vocab_size
    rope = cfg.n_layers * 2 * c * cfg.head_dim
    return batch * c * (per_token + cfg.n_layers * 4 * cfg.d_model * max_len) + rope


def pairwise_allowance(c: int, max_len: int, batch: int = 1) -> int:
    """Most elementwise work (replay.Replayed.pairwise_between: 2 per output element of an op that
    combines two tensors of data, 2 per input element of a reduction, 2 per element an index_add, an
    accumulating index_put or a reducing scatter brings in) of one forward_with_cache call on c
    new tokens besides its matmuls, for a block written out op by op, per new token and layer: RMSNorm
    twice (x·x, x·r, ·w and the mean: 8·d), RoPE on q and k (6·d), the residual adds (2·d), SwiGLU's
    product (d_ff), a softmax written out (S − m, ÷ ℓ, its max and sum: 4 per key and head); the final
    RMSNorm (4·d); 2 units each, allowed twice over: 4·(16·d + d_ff + 4·H·max_len) per token and layer.
    A recompute through such ops (a matmul as a multiply and a sum, or a stack reduced by prod, column by
    column) costs the cached tokens' projections, far above it."""
    cfg = model().config
    per_layer = 16 * cfg.d_model + cfg.d_ff + 4 * cfg.n_heads * max_len
    return 4 * batch * c * (cfg.n_layers * per_layer + 4 * cfg.d_model)


def check_call_flops(rp: replay.Replayed, sizes: list[int], max_len: int, batch: int, inputs: dict) -> None:
    """Each recorded forward_with_cache call (between "call" marks) within call_flops_bound, its matmul
    FLOPs with its elementwise work (pairwise_allowance more): work is counted whatever op does it."""
    marks = rp.marks.get("call", [])
    check(len(marks) == len(sizes) + 1, what="the record marks every forward_with_cache call",
          detail=f"{len(marks)} marks for {len(sizes)} calls", hint=HINT_CACHE, inputs=inputs)
    start = 0
    for j, c in enumerate(sizes):
        flops, pairwise = rp.flops_between(marks[j], marks[j + 1]), rp.pairwise_between(marks[j], marks[j + 1])
        most, extra = call_flops_bound(c, max_len, batch), pairwise_allowance(c, max_len, batch)
        check(flops <= most and flops + pairwise <= most + extra,
              what=f"call {j} (tokens {start}..{start + c - 1}) computes only its {c} new token(s) "
                   "against the cache (no recompute)",
              detail=f"{flops:,} matmul FLOPs and {pairwise:,} of elementwise work; {c} new token(s) with a cache of "
                     f"{max_len} need at most {most:,} and {extra:,} more; recomputing all {start + c} tokens would "
                     f"cost about {call_flops_bound(start + c, max_len, batch):,}",
              hint=HINT_RECOMPUTE, inputs=inputs)
        start += c
    # the marks come from the worker: the whole program too
    total = sum(call_flops_bound(c, max_len, batch) for c in sizes)
    extra = sum(pairwise_allowance(c, max_len, batch) for c in sizes)
    pairwise = rp.pairwise_between(0)
    check(rp.matmul_flops <= total and rp.matmul_flops + pairwise <= total + extra,
          what="forward_with_cache computes only the new tokens against the cache (no recompute)",
          detail=f"{rp.matmul_flops:,} matmul FLOPs and {pairwise:,} of elementwise work in all calls; the new tokens "
                 f"with the cache need at most {total:,} and {extra:,} more",
          hint=HINT_RECOMPUTE, inputs=inputs)


@torch.no_grad()
def bug_logits(m: TinyTransformer, tokens: torch.Tensor, chunks: list[int], bug: str) -> list[torch.Tensor]:
    """The logits per chunk that a KV cache with a known bug gives, computed WITHOUT a cache (the whole
    sequence at once): with the bug, what a token computes depends only on itself, the tokens before it
    and its own chunk's start and size, so one pass over the sequence can give every token the
    positions or the mask the buggy cache would have used.

    "no_final_norm": logits = lm_head(x) without model.norm; "last_block_skipped": the loop leaves out the
    last block (range(n_layers - 1)). "layer0_length": layers >= 1 rotate each token by its chunk's size T too far (they read the cache
    length after layer 0 appended, §8.2); "top_left": the causal mask of a chunk aligned top-left, so its
    query j sees only the first j + 1 keys of the cache; "positions_from_zero": every call gives its
    tokens positions 0..T-1 (queries and the keys it caches), not cache.length onwards."""
    if bug not in ("layer0_length", "top_left", "positions_from_zero", "no_final_norm", "last_block_skipped"):
        raise ValueError(f"unknown bug {bug!r}")
    cfg = m.config
    B, N = tokens.shape
    size = torch.tensor([c for c in chunks for _ in range(c)])  # each token's chunk size and start
    start = torch.tensor([sum(chunks[:i]) for i, c in enumerate(chunks) for _ in range(c)])
    pos = torch.arange(N)
    keys = torch.arange(N).unsqueeze(0)
    visible = keys <= (pos - start).unsqueeze(1) if bug == "top_left" else keys <= pos.unsqueeze(1)
    x = m.tok_emb(tokens)
    for i, blk in enumerate(m.blocks[:-1] if bug == "last_block_skipped" else m.blocks):
        at = pos + size if (bug == "layer0_length" and i > 0) else pos - start if bug == "positions_from_zero" else pos
        h = blk.attn_norm(x)
        a = blk.attn
        q, k, v = (w(h).view(B, N, cfg.n_heads, cfg.head_dim).transpose(1, 2) for w in (a.wq, a.wk, a.wv))
        q, k = rope(q, at, cfg.rope_base), rope(k, at, cfg.rope_base)
        scores = (q @ k.transpose(-2, -1)) / cfg.head_dim ** 0.5
        o = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v
        x = x + a.wo(o.transpose(1, 2).reshape(B, N, -1))
        x = x + blk.ffn(blk.ffn_norm(x))
    logits = m.lm_head(x if bug == "no_final_norm" else m.norm(x))
    cuts = [0, *[sum(chunks[: j + 1]) for j in range(len(chunks))]]
    return [logits[:, a:b] for a, b in zip(cuts, cuts[1:])]


# ---------------------------------------------------------------------------------------------------
# Cases


N_EXAMPLES = 400  # test-split examples a case draws from per seed


@lru_cache(maxsize=None)
def test_examples(seed: int, n: int = N_EXAMPLES) -> tuple[tuple[int, ...], ...]:
    """The token ids of n test-split LikesWorld examples drawn with `seed` (made once per process)."""
    return tuple(e.tokens for e in likesworld.examples("test", n, seed=seed))


def _first_examples(seed: int) -> Iterator[tuple[int, ...]]:
    """The token ids of test_examples(seed) one at a time: most callers need only the first few (each
    example is rejection-sampled, ~0.1 ms)."""
    return (e.tokens for e in itertools.islice(likesworld.iter_examples("test", seed), N_EXAMPLES))


def example_tokens(seed: int, batch: int = 1, min_len: int = 0) -> torch.Tensor:
    """(batch, T) token ids of test-split LikesWorld examples (seed `seed`): the first `batch`
    examples that have the length of the first example at least min_len tokens long."""
    return torch.tensor(_example_rows(seed, batch, min_len), dtype=torch.long)


@lru_cache(maxsize=None)
def _example_rows(seed: int, batch: int, min_len: int) -> tuple[tuple[int, ...], ...]:
    length, rows = None, []
    for tokens in _first_examples(seed):  # the usual case: the first length found has `batch` examples
        if length is None and len(tokens) >= min_len:
            length = len(tokens)
        if len(tokens) == length:
            rows.append(tokens)
            if len(rows) == batch:
                return tuple(rows)
    exs = test_examples(seed)  # else the next length of the list that has them
    for first in exs:
        if len(first) >= min_len:
            same = [t for t in exs if len(t) == len(first)][:batch]
            if len(same) == batch:
                return tuple(same)
    raise ValueError(f"test bug: no {batch} examples of length >= {min_len} for seed {seed}")


@dataclass(frozen=True)
class CacheCase:
    """Feed `batch` LikesWorld sequences (from `seed`) in chunks: chunks[0] is the prefill; the
    rest of the sequence follows in the given sizes (the last size repeats to the end)."""
    chunks: tuple[int, ...] = (5, 1)
    batch: int = 1
    seed: int = 100
    dtype: str = "float32"
    extra_len: int = 0          # cache max_len beyond what is needed

    @property
    def id(self) -> str:
        c = "-".join(map(str, self.chunks))
        return f"b{self.batch}-chunks{c}-{self.dtype}-s{self.seed}" + (f"-slack{self.extra_len}" if self.extra_len else "")

    def plan(self) -> tuple[torch.Tensor, list[int]]:
        tokens = example_tokens(self.seed, self.batch, min_len=sum(self.chunks) + 2)
        T, sizes = tokens.shape[1], []
        for c in self.chunks:
            if sum(sizes) + c > T:
                break
            sizes.append(c)
        while sum(sizes) < T:
            sizes.append(min(self.chunks[-1], T - sum(sizes)))
        return tokens, sizes


def _diagnose(m: TinyTransformer, tokens: torch.Tensor, sizes: list[int], got: list[Any], bound: float) -> str | None:
    """The hint of the known bug whose logits the student's match (within `bound`), if any."""
    for bug, hint in (("layer0_length", HINT_LAYER0), ("top_left", HINT_TOPLEFT),
                      ("positions_from_zero", HINT_POSITIONS_ZERO), ("no_final_norm", HINT_NO_FINAL_NORM),
                      ("last_block_skipped", HINT_BLOCK_SKIPPED)):
        want = bug_logits(m, tokens, sizes, bug)
        if all(isinstance(g, torch.Tensor) and g.shape == w.shape and
               float((g.double() - w.double()).abs().max()) <= bound for g, w in zip(got, want, strict=True)):
            return hint
    return None


@torch.no_grad()
def check_cached_logits(student, case: CacheCase) -> None:
    """Cached logits at EVERY chunk equal the uncached model's (float64 reference, plain float32)."""
    tokens, sizes = case.plan()
    total = sum(sizes)
    max_len = total + case.extra_len
    record = student.scenario("part5.cached_logits", tokens=tokens, chunks=sizes, dtype=case.dtype, max_len=max_len)

    cuts = [0, *[sum(sizes[: j + 1]) for j in range(len(sizes))]]

    def per_call(full: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        return {"logits": [full[:, a:b] for a, b in zip(cuts, cuts[1:])]}

    def twin_reference(tokens):
        with one_thread():
            return per_call(twin_model("float64")(tokens))

    with one_thread():
        expected = model("float64")(tokens)                 # trusted: one uncached call, positions 0..T-1
        plain = model(case.dtype)(tokens)
        rp, _, _ = replay.replay_record(student, record, "forward_with_cache", (tokens,), {},
                                        named=named_weights(model(case.dtype)), reference=twin_reference,
                                        main_reference=lambda tokens: per_call(expected),  # the same tokens
                                        twin_inputs=((tokens,), {}), twin_named=named_weights(twin_model(case.dtype)),
                                        trusted=TRUSTED)
    res = rp.result
    check(isinstance(res, dict) and isinstance(res.get("logits"), list) and len(res["logits"]) == len(sizes),
          what="forward_with_cache returns logits (B, T, V) for each call",
          detail=f"expected {len(sizes)} results", hint=HINT_CACHE)
    got, lengths = res["logits"], res["lengths"]
    atol = ATOL64 if case.dtype == "float64" else ATOL32
    factor = FACTOR if case.dtype == "float32" else 0.0
    err_plain = float((plain.double() - expected).abs().max())
    bound = factor * err_plain + atol
    start = 0
    for j, (c, g) in enumerate(zip(sizes, got)):
        what = (f"logits of call {j} (tokens {start}..{start + c - 1}, "
                f"{'prefill' if j == 0 else 'decode step' if c == 1 else 'chunk'}) with the cache "
                f"vs recomputing the whole sequence")
        inputs = {"tokens": tokens, "chunks": sizes, "dtype": case.dtype}
        try:
            check_close(g, expected[:, start:start + c], what=what, inputs=inputs, plain=plain[:, start:start + c],
                        factor=factor, atol=atol, dtype=DTYPES[case.dtype], hint=HINT_CACHE)
        except CheckFailure as failure:
            if failure.kind in ("type", "dtype", "shape"):
                raise
            with one_thread():
                known = _diagnose(model(case.dtype), tokens, sizes, got, bound)
            # The cache probes first; when they find nothing, a known bug the logits match (proven on
            # this test's inputs) is the hint on its own; else a neutral line and the recipe.
            try:
                finding = pb.cache_ladder(student)
                if finding.failed is not None:
                    failure.hint = join_hints(finding.message(), known)
                else:
                    failure.hint = known or (f"{pb.NEUTRAL}: KVCache.update keeps and returns the right keys and "
                                             "values, so the bug is in forward_with_cache (positions, which layer's "
                                             f"cache, the mask); {HINT_CACHE}")
            except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
                failure.hint = known or f"{HINT_CACHE} (probes unavailable: {type(exc).__name__})"
            failure.args = (failure.message(),)
            raise failure
        start += c
    want_lengths = [sum(sizes[: j + 1]) for j in range(len(sizes))]
    what = "cache.length after each forward_with_cache call"
    for n in lengths:
        check_length_type(n, what=what)
    check(lengths == want_lengths, what=what, detail=f"expected {want_lengths}, got {lengths}", hint=HINT_LENGTH)
    check_call_flops(rp, sizes, max_len, tokens.shape[0], {"tokens": tokens, "chunks": sizes, "dtype": case.dtype})


def check_length_type(n: Any, *, what: str, inputs: dict | None = None) -> None:
    """cache.length as KVCache promises it (`-> int`): a Python int, before it is compared (a tensor of
    several lengths compares to a tensor, whose truth is an error; a float or a 0-d tensor equal to the
    count is still not the int the docstring promises)."""
    if type(n) is not int:
        shown = f"{type(n).__name__} {n!r}" if type(n) is not torch.Tensor else \
            f"Tensor of shape {tuple(n.shape)} and dtype {str(n.dtype).removeprefix('torch.')}"
        raise CheckFailure(what, detail=f"cache.length must be a Python int (tokens cached in layer 0), got a "
                           f"{shown[:120]}", hint=HINT_LENGTH, inputs=inputs, kind="type")


def length_batches(prompts: list[list[int]]) -> list[list[int]]:
    """Indices of the prompts grouped by length, each group in prompt order, groups in the order of
    their first prompt: same-length prompts are one (B, T0) batch for generate()."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    return list(groups.values())


MIN_MARGIN = 1e-4  # twin prompts whose greedy steps have a top-2 logit gap below this are not used (float32
# implementations of the same model differ by ~1e-6 in a logit)


@lru_cache(maxsize=None)
def greedy_reference(batch: tuple[tuple[int, ...], ...], max_new_tokens: int,
                     dtype: str = "float32") -> tuple[tuple[tuple[int, ...], ...], float]:
    """Greedy continuation of the uncached course model (each step recomputes the whole sequence, as
    course.tiny_transformer.greedy_generate) on one (B, T0) batch, and the smallest gap between the
    two largest logits over its steps (how far the argmax is from a tie)."""
    tokens = torch.tensor(batch, dtype=torch.long)
    gap = math.inf
    with one_thread(), torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(dtype)(tokens)[:, -1]
            top = logits.topk(2, dim=-1).values
            gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
            tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return tuple(tuple(row) for row in tokens.tolist()), gap


@lru_cache(maxsize=None)
def twin_prompts(shapes: tuple[tuple[int, int], ...], max_new_tokens: int, dtype: str,
                 seed: int) -> tuple[tuple[tuple[int, ...], ...], ...] | None:
    """For the twin replay of generate(): one batch of other LikesWorld token sequences per (B, T0) in
    `shapes` (the first T0 tokens of test examples drawn with the judge's secret, replay.twin_seed),
    whose greedy steps are all at least MIN_MARGIN
    from a tie, so that any correct cache gives the reference's tokens; None if five draws do not
    give such batches."""
    for draw in range(1, 6):
        rows: list[list[tuple[int, ...]]] = [[] for _ in shapes]  # per shape: the first B examples longer than T0
        for tokens in _first_examples(replay.twin_seed(seed * 1000 + draw)):  # unpredictable outside the judge
            for (b, t0), got in zip(shapes, rows):
                if len(got) < b and len(tokens) > t0:
                    got.append(tokens[:t0])
            if all(len(got) == b for (b, _), got in zip(shapes, rows)):
                batches = [tuple(got) for got in rows]
                if all(greedy_reference(batch, max_new_tokens, dtype)[1] >= MIN_MARGIN for batch in batches):
                    return tuple(batches)
                break
    return None


def generate_flops_bound(prompt_len: int, batch: int, max_new_tokens: int) -> int:
    """Most matmul FLOPs of a cached generate: one prefill of the prompt, then one call per new token
    (each within call_flops_bound, cache max_len = prompt + new tokens). The last token needs no call
    (its logits are never used), but a generate that makes it anyway is correct, only a step wasteful:
    the bound is there to catch recomputing the cached tokens, which costs a prefill per step."""
    max_len = prompt_len + max_new_tokens
    return call_flops_bound(prompt_len, max_len, batch) + max_new_tokens * call_flops_bound(1, max_len, batch)


def generate_pairwise_allowance(prompt_len: int, batch: int, max_new_tokens: int) -> int:
    """pairwise_allowance of the calls of a cached generate (as generate_flops_bound counts them)."""
    max_len = prompt_len + max_new_tokens
    return pairwise_allowance(prompt_len, max_len, batch) + max_new_tokens * pairwise_allowance(1, max_len, batch)


def replayed_generations(student, prompts: list[list[int]], groups: list[list[int]], max_new_tokens: int,
                         use_cache: bool, what: str, dtype: str = "float32",
                         twin_seed: int = 0) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
    """generate() on each group of same-length prompts (one (B, T0) call per group), recorded in the
    worker as ONE program and replayed by the judge: every token graded is the judge's replay's, and
    with the cache every call's matmul FLOPs stay within generate_flops_bound (no recompute). A twin
    replay on other prompts of the same shapes must give the reference's tokens for THOSE prompts.
    Returns (the replay's token rows, the reference's token rows), per group."""
    batches = [[prompts[i] for i in g] for g in groups]
    xs = tuple(torch.tensor(b, dtype=torch.long) for b in batches)
    record = student.scenario("part5.generate", batches=batches, max_new_tokens=max_new_tokens, use_cache=use_cache,
                              dtype=dtype)
    want = [torch.tensor(greedy_reference(tuple(map(tuple, b)), max_new_tokens, dtype)[0]) for b in batches]
    twin = twin_prompts(tuple(tuple(x.shape) for x in xs), max_new_tokens, dtype, twin_seed)
    twin_kw: dict[str, Any] = {}
    if twin is not None:
        twin_want = [torch.tensor(greedy_reference(b, max_new_tokens, dtype)[0]) for b in twin]
        twin_kw = dict(reference=lambda *_: twin_want, main_reference=lambda *_: want,
                       twin_inputs=(tuple(torch.tensor(b, dtype=torch.long) for b in twin), {}))
    with one_thread():
        rp, _, _ = replay.replay_record(student, record, "generate", xs, {}, seed=None,
                                        named=named_weights(model(dtype)), trusted=TRUSTED, **twin_kw)
    res = rp.result
    check(type(res) is list and len(res) == len(batches), what=what,
          detail=f"the replay returned {type(res).__name__}, expected one result per generate() call",
          hint=HINT_GENERATE)
    marks = rp.marks.get("call", [])
    check(len(marks) == len(batches) + 1, what=f"{what}: the record marks every generate() call",
          detail=f"{len(marks)} marks for {len(batches)} calls", hint=HINT_GENERATE)
    for n, (x, got) in enumerate(zip(xs, res)):
        b, t0 = x.shape
        check(type(got) is torch.Tensor and got.dtype == torch.long and tuple(got.shape) == (b, t0 + max_new_tokens),
              what=f"{what}: generate() returns the prompt and its continuation",
              detail=f"expected a ({b}, {t0} + {max_new_tokens}) long tensor for a batch of {b} prompts of {t0} tokens, "
                     f"got {_describe(got)}", hint=HINT_GENERATE)
        if use_cache:
            most, extra = generate_flops_bound(t0, b, max_new_tokens), generate_pairwise_allowance(t0, b, max_new_tokens)
            used, pairwise = rp.flops_between(marks[n], marks[n + 1]), rp.pairwise_between(marks[n], marks[n + 1])
            check(used <= most and used + pairwise <= most + extra,
                  what=what + ": the cache is used (no recompute of earlier tokens)",
                  detail=f"{used:,} matmul FLOPs and {pairwise:,} of elementwise work for a batch of {b} prompts of "
                         f"{t0} tokens; a cached generate needs at most {most:,} and {extra:,} more",
                  hint=HINT_RECOMPUTE)
    if use_cache:  # the marks come from the worker: the whole program is bounded too, whatever they say
        most = sum(generate_flops_bound(x.shape[1], x.shape[0], max_new_tokens) for x in xs)
        extra = sum(generate_pairwise_allowance(x.shape[1], x.shape[0], max_new_tokens) for x in xs)
        pairwise = rp.pairwise_between(0)
        check(rp.matmul_flops <= most and rp.matmul_flops + pairwise <= most + extra,
              what=what + ": the cache is used (no recompute of earlier tokens)",
              detail=f"{rp.matmul_flops:,} matmul FLOPs and {pairwise:,} of elementwise work in all; cached generates "
                     f"need at most {most:,} and {extra:,} more", hint=HINT_RECOMPUTE)
    return [r.tolist() for r in res], [w.tolist() for w in want]


def _describe(x: Any) -> str:
    if type(x) is torch.Tensor:
        return f"a {tuple(x.shape)} {str(x.dtype).removeprefix('torch.')} tensor"
    return "None (not a tensor)" if x is None else type(x).__name__


def check_generate(student, seed: int, n: int = 60, max_new_tokens: int = 8, use_cache: bool = True,
                   dtype: str = "float32") -> None:
    """The student's greedy generate() gives the same tokens as the uncached course model on n prompts
    (the model in `dtype`: a float64 model needs a float64 cache), one batch per prompt length."""
    prompts = likesworld.make_prompts(n, seed)
    groups = length_batches(prompts)
    what = (f"generate(use_cache={use_cache}) on {n} LikesWorld prompts ({len(groups)} batches of equal length), "
            f"{max_new_tokens} new tokens each" + (f", {dtype} model" if dtype != "float32" else ""))
    got, want = replayed_generations(student, prompts, groups, max_new_tokens, use_cache, what, dtype, twin_seed=seed)
    rows_got = {i: row for g, rows in zip(groups, got) for i, row in zip(g, rows)}
    rows_want = {i: row for g, rows in zip(groups, want) for i, row in zip(g, rows)}
    bad = [i for i in range(n) if rows_got[i] != rows_want[i]]
    if bad:
        i = bad[0]
        detail = (f"{n - len(bad)}/{n} identical; prompt {i}: {likesworld.decode(prompts[i])!r} -> expected "
                  f"{likesworld.decode(rows_want[i][len(prompts[i]):])!r}, got {_words(rows_got[i][len(prompts[i]):])!r}")
        check(False, what=what, detail=detail,
              hint=join_hints(first_wrong_token(prompts[i], rows_got[i], dtype, use_cache), HINT_GENERATE))


def first_wrong_token(prompt: list[int], row: list[int], dtype: str, use_cache: bool) -> str | None:
    """Where a wrong continuation leaves greedy decoding, judged on its OWN prefix: the first new token that
    is not the argmax of the model's logits at the LAST position of the tokens before it (the uncached
    course model), and which choice it was instead: another position's argmax (logits[:, 0] for [:, -1]),
    the second-best token (a sort or topk slip), or neither. Then whether the prefill's token (step 0)
    or a later step's went wrong: the prefill and the decode steps take different paths through a cache."""
    t0 = len(prompt)
    m = model(dtype)
    with one_thread(), torch.no_grad():
        for t in range(t0, len(row)):
            logits = m(torch.tensor([row[:t]], dtype=torch.long))[0]  # (t, V)
            want = int(logits[-1].argmax())
            if row[t] == want:
                continue
            step = t - t0
            when = ("the first new token (from the prefill's logits)" if step == 0 else
                    f"new token {step} (after {step} decode step{'s' if step > 1 else ''} that were right)")
            at = [pos for pos in range(t - 1) if int(logits[pos].argmax()) == row[t]]
            if at:
                how = (f"it is the argmax of position {at[0]}'s logits, not the last position's: the next token "
                       f"comes from logits[:, -1] (the last position of what was just fed in)")
            elif row[t] == int(logits[-1].topk(2).indices[1]):
                how = "it is the second-best token of the last position: greedy takes the argmax"
            else:
                how = "it is not the model's choice at any position of its own prefix: the logits it came from are wrong"
                if use_cache and step > 0:
                    how += " (a decode step: the cache, or the positions of the new token)"
            return f"{when} is not greedy on the tokens before it: {how}"
    return None


def _words(ids: Any) -> str:
    try:
        return likesworld.decode(ids)
    except (ValueError, TypeError):
        return repr(ids)


def check_generate_batched(student, seed: int, batch: int, max_new_tokens: int = 8) -> None:
    """generate() on a (B, T0) batch of same-length prompts equals the uncached model row by row."""
    tokens = example_tokens(seed, batch, min_len=12)[:, :12]
    prompts = tokens.tolist()
    what = f"generate on a batch of {batch} prompts of 12 tokens, {max_new_tokens} new tokens"
    (got,), (want,) = replayed_generations(student, prompts, [list(range(batch))], max_new_tokens, True, what,
                                           twin_seed=seed)
    check(got == want, what=what, detail=f"expected {want}, got {got}" if len(str(got)) < 400 else "",
          hint=HINT_GENERATE)


# ---------------------------------------------------------------------------------------------------
# KVCache unit behaviour


@dataclass(frozen=True)
class UnitCase:
    n_layers: int = 2
    batch: int = 2
    n_heads: int = 3
    max_len: int = 8
    head_dim: int = 4
    steps: tuple[int, ...] = (3, 2, 1)     # tokens appended per round (each round: every layer in order)
    dtype: str = "float32"
    seed: int = 0

    @property
    def id(self) -> str:
        return (f"L{self.n_layers}-B{self.batch}-H{self.n_heads}-max{self.max_len}-d{self.head_dim}-"
                f"steps{'-'.join(map(str, self.steps))}-{self.dtype}")

    def dims(self) -> dict[str, int]:
        return dict(n_layers=self.n_layers, batch=self.batch, n_heads=self.n_heads, max_len=self.max_len,
                    head_dim=self.head_dim)

    def updates(self) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(self.seed)
        shape = lambda t: (self.batch, self.n_heads, t, self.head_dim)
        return [(layer, torch.randn(shape(t), generator=g, dtype=DTYPES[self.dtype]),
                 torch.randn(shape(t), generator=g, dtype=DTYPES[self.dtype]))
                for t in self.steps for layer in range(self.n_layers)]


def check_cache_unit(student, case: UnitCase) -> None:
    """update() returns the concatenation so far (exactly: it is a copy of data), length follows
    layer 0, and the returned tensors live in one preallocated buffer per layer."""
    # one update per layer that fills max_len is a fresh tensor of exactly the buffer's size: the views
    # check could not fail, and the case would grade values alone
    assert len(case.steps) >= 2, "test bug: a case of check_cache_unit appends at least twice per layer"
    updates = case.updates()
    try:
        record = student.scenario("part5.cache_updates", **case.dims(), updates=updates, dtype=case.dtype)
    except StudentError as exc:  # the judge's updates fit: an overflow error here is a check that is too strict
        if exc.exc_type != "ValueError" or sum(case.steps) > case.max_len:
            raise
        raise CheckFailure("KVCache.update takes new tokens as long as they fit (length + T <= max_len)",
                           detail=f"it raised a ValueError, though each layer's {sum(case.steps)} tokens fit "
                                  f"max_len = {case.max_len}: {exc}", hint=HINT_FITS,
                           inputs={**case.dims(), "steps": case.steps}) from None
    flat = tuple(t for _, k, v in updates for t in (k, v))
    rp, _, _ = replay.replay_record(student, record, "KVCache.update", flat, {}, seed=None)
    res = rp.result
    check(type(res) is dict and type(res.get("results")) is list and len(res["results"]) == len(updates)
          and all(type(r) in (list, tuple) and len(r) == 2 for r in res["results"]),
          what="update(layer, k_new, v_new) returns (k_all, v_all) for every update", hint=HINT_UPDATE)
    inputs = {**case.dims(), "steps": case.steps}
    # the lengths first: a length that does not grow makes a later update write over an earlier one's
    # slots, and its view (compared below, after all the updates) would blame the earlier update
    layer0 = 0
    for n, (layer, k, _) in enumerate(updates):
        layer0 += k.shape[2] if layer == 0 else 0
        what = f"cache.length after update #{n} (layer {layer})"
        check_length_type(res["lengths"][n], what=what, inputs=inputs)
        check(res["lengths"][n] == layer0, what=what,
              detail=f"expected {layer0} (tokens in layer 0), got {res['lengths'][n]}", hint=HINT_LENGTH)
    # every layer's tokens, all its updates: what its buffer holds at the end (the views are read then)
    final = {lay: tuple(torch.cat([u[i] for u in updates if u[0] == lay], dim=2) for i in (1, 2))
             for lay in {u[0] for u in updates}}
    seen: dict[int, tuple[list, list]] = {}
    for n, ((layer, k, v), (k_all, v_all)) in enumerate(zip(updates, res["results"], strict=True)):
        ks, vs = seen.setdefault(layer, ([], []))
        ks.append(k)
        vs.append(v)
        for i, (name, got, parts, other) in enumerate((("k_all", k_all, ks, ("v_new", vs)),
                                                        ("v_all", v_all, vs, ("k_new", ks)))):
            want = torch.cat(parts, dim=2)
            others = {f"the {other[0]} values passed so far instead: k and v swapped, or one buffer for both?":
                      torch.cat(other[1], dim=2)}
            for lay, held in final.items():  # another layer's tokens in this layer's slots
                if lay != layer and held[i].shape[2] >= want.shape[2]:
                    others[f"layer {lay}'s tokens instead: an update wrote into another layer's buffer (index the "
                           f"layer: self.k[layer][..., start:start + T], not every layer's slots)"] = \
                        held[i][:, :, :want.shape[2]]
            check_close(got, want, what=f"{name} returned by update #{n} (layer {layer})", inputs=inputs,
                        atol=0.0, rtol=0.0, dtype=DTYPES[case.dtype], hint=HINT_UPDATE,   # a copy: exact
                        others=others)
    # Views, not copies, measured in the judge's replay: each layer's results share ONE storage (the
    # one its first result lives in), of at least a (B, H, max_len, d) buffer's size.
    itemsize = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    need = case.batch * case.n_heads * case.max_len * case.head_dim * itemsize
    first: dict[tuple[int, str], int] = {}
    inputs_storage = {t.untyped_storage().data_ptr() for t in rp.inputs}  # the judge's k_new, v_new
    for n, ((layer, _, _), pair) in enumerate(zip(updates, res["results"])):
        same, size = [], []
        for name, t in zip(("k", "v"), pair):
            storage = t.untyped_storage()
            own = storage.data_ptr() not in inputs_storage  # the cache's own buffer, not the caller's k_new
            same.append(own and first.setdefault((layer, name), storage.data_ptr()) == storage.data_ptr())
            size.append(storage.nbytes())
        check(all(same) and all(s >= need for s in size),
              what=f"update #{n} returns views of a preallocated buffer",
              detail=f"same storage as the layer's first result: {same}; storage bytes {size}, a "
                     f"(B, H, max_len, d) buffer has {need}", hint=HINT_VIEWS)


def bad_updates(case: UnitCase, prefill: int) -> dict[str, tuple[int, torch.Tensor, torch.Tensor]]:
    """Each bad update, its values drawn as the valid updates' are (a bad update must differ from a valid one
    in the property checked alone: all-zero bad updates were told apart by their values)."""
    B, H, d = case.batch, case.n_heads, case.head_dim
    g = torch.Generator().manual_seed(case.seed + 55)

    def z(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return {
        "overflow": (0, z(B, H, case.max_len - prefill + 1, d), z(B, H, case.max_len - prefill + 1, d)),
        "overflow_layer1": (1, z(B, H, case.max_len - prefill + 1, d), z(B, H, case.max_len - prefill + 1, d)),
        "wrong_head_dim": (0, z(B, H, 1, d + 1), z(B, H, 1, d + 1)),
        "wrong_heads": (1, z(B, H + 1, 1, d), z(B, H + 1, 1, d)),
        "k_v_mismatch": (0, z(B, H, 2, d), z(B, H, 1, d)),
        "layer_past_the_last": (case.n_layers, z(B, H, 1, d), z(B, H, 1, d)),  # an off-by-one bound
        "negative_layer": (-1, z(B, H, 1, d), z(B, H, 1, d)),  # Python would index the last layer
    }


def check_cache_errors(student, case: UnitCase, prefill: int, names: tuple[str, ...]) -> None:
    """Overflowing max_len and wrong shapes raise ValueError with a one-line message, and change nothing:
    after each, an update that fits succeeds and returns the tokens cached before it, then its own. (A
    test of "raises" alone is passed by an update that always raises.) The prefill comes in 1, 2 or 3
    updates per layer, so that the bad update is not always the same call."""
    assert 0 < prefill < case.max_len, "a case leaves room for the update that fits"
    bad = {k: v for k, v in bad_updates(case, prefill).items() if k in names}
    g = torch.Generator().manual_seed(case.seed + 77)
    B, H, d, L = case.batch, case.n_heads, case.head_dim, case.n_layers
    k0, v0 = (torch.randn(L, B, H, prefill, d, generator=g) for _ in range(2))
    splits = {name: 1 + i % min(3, prefill) for i, name in enumerate(bad)}
    fit = case.max_len - prefill
    fits = {}
    for name, (layer, _, _) in bad.items():  # the bad update's layer, else the last (a wrapped -1's)
        target = layer if 0 <= layer < L else L - 1
        fits[name] = (target, torch.randn(B, H, fit, d, generator=g), torch.randn(B, H, fit, d, generator=g))
    res = student.scenario("part5.cache_errors", **case.dims(), prefill=(k0, v0), bad_updates=bad, splits=splits,
                           fits=fits)
    for name in names:
        r = res[name]
        what = f"update with {name.replace('_', ' ')} (cache {case.dims()}, {prefill} tokens cached)"
        check(r["value_error"] is True, what=what,
              detail=f"expected ValueError, got {r['raised'] or 'no exception'}", hint=HINT_ERRORS)
        check(bool(r["message"].strip()) and "\n" not in r["message"].strip(), what=what + ": the error message",
              detail=f"message {r['message']!r} is empty or spans several lines", hint=HINT_ERRORS)
        target, k_fit, v_fit = fits[name]
        after, then = r["after"], f"after the rejected update with {name.replace('_', ' ')}, an update of layer " \
                                  f"{target} with {fit} tokens (it fills max_len = {case.max_len} exactly)"
        check(after["raised"] is None, what=then + " succeeds",
              detail=f"it raised {after['raised']}: {sanitize.line(after['message'], 200)}", hint=HINT_REJECTED)
        value = after["value"]
        check(type(value) in (tuple, list) and len(value) == 2, what=then + " returns (k_all, v_all)", hint=HINT_UPDATE)
        for got, old, new, label in ((value[0], k0, k_fit, "k_all"), (value[1], v0, v_fit, "v_all")):
            check_close(got, torch.cat([old[target], new], dim=2), what=f"{label} returned {then}: the tokens "
                        "cached before it, then its own", inputs={**case.dims(), "prefill": prefill}, atol=0.0,
                        rtol=0.0, dtype=torch.float32, hint=HINT_REJECTED)
