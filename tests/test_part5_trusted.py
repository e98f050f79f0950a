"""Part 5's trusted ops: the course model's pieces that contain no student code (the embedding, each
RMSNorm, SwiGLU, lm_head, and in each attention block the q/k/v projections + RoPE and the output
projection) are recorded as one "judge::" op each (autograder/scenarios/part5.py) and computed by the
judge with its own course functions (autograder/tests/cases_part5.TRUSTED).

Pinned here: the judge's replay of such a record gives the same logits, tokens and matmul FLOPs (every
call's) as the replay of the same code recorded op by op, bit for bit; each trusted op's FLOPs are those
of its recorded ops; a recompute pays for every token through them; a forged record that puts a judge::
op on other arguments (wrong shapes or dtypes, scalars, keywords, more outputs, out-of-range token ids,
an unknown name, sizes above the budget) is refused before anything runs, or computes only the course
function; the worker falls back to op by op for arguments outside the judge's signature.
"""
from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.nn.functional as F

from autograder.engine import replay as R
from autograder.engine.checks import CheckFailure
from autograder.scenarios import part5 as S
from autograder.scenarios.tracing import Recorder
from autograder.tests import cases_part5 as C
from course import tiny_transformer as tt
from solutions import kv_cache as kv


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class StandIn:
    """What the engine gives a test as `student`, in-process: scenarios run right here."""

    def __init__(self, module) -> None:
        self._module = module

    def module(self, name: str):
        return self._module

    def scenario(self, target: str, **kwargs):
        return getattr(S, target.split(".", 1)[1])(self, **kwargs)


def _record(fn, op_by_op: bool, **kwargs) -> dict:
    """A part-5 scenario's record, with the trusted ops (the grader's way) or the course code op by op."""
    if not op_by_op:
        return fn(StandIn(kv), **kwargs)
    trusted, S._course_ops_trusted = S._course_ops_trusted, lambda rec, model: contextlib.nullcontext()
    try:
        return fn(StandIn(kv), **kwargs)
    finally:
        S._course_ops_trusted = trusted


def _replay(record: dict, inputs: list[torch.Tensor], dtype: str = "float32") -> R.Replayed:
    return R.replay(record, [t.clone() for t in inputs], part=5, named=C.named_weights(C.model(dtype)),
                    trusted=C.TRUSTED)


def _per_call(rp: R.Replayed) -> list[int]:
    marks = rp.marks["call"]
    return [rp.flops_between(a, b) for a, b in zip(marks, marks[1:])]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_trusted_ops_replay_exactly_like_the_course_code_recorded_op_by_op(dtype):
    tokens, sizes = C.CacheCase(chunks=(5, 3, 1), seed=101, batch=2).plan()
    kw = dict(tokens=tokens, chunks=sizes, dtype=dtype, max_len=sum(sizes) + 3)
    plain, fast = (_replay(_record(S.cached_logits, op_by_op, **kw), [tokens], dtype) for op_by_op in (True, False))
    assert {n for n in fast.op_counts if n.startswith("judge::")} == \
        {f"judge::{n}" for n in ("embedding", "rms_norm", "attention_heads", "merge_heads", "swiglu", "linear")}
    assert not any(n.startswith("judge::") for n in plain.op_counts)
    assert fast.ops < plain.ops / 2.5, (fast.ops, plain.ops)
    assert fast.matmul_flops == plain.matmul_flops and _per_call(fast) == _per_call(plain)
    assert all(torch.equal(a, b) for a, b in zip(fast.result["logits"], plain.result["logits"], strict=True))


def test_an_empty_chunk_replays_like_the_course_code():
    tokens = C.CacheCase(chunks=(3, 1), seed=100).plan()[0][:, :6]
    kw = dict(tokens=tokens, chunks=[3, 0, 3], max_len=6)
    plain, fast = (_replay(_record(S.cached_logits, op_by_op, **kw), [tokens]) for op_by_op in (True, False))
    assert [tuple(t.shape) for t in fast.result["logits"]] == [(1, 3, 30), (1, 0, 30), (1, 3, 30)]
    assert _per_call(fast) == _per_call(plain)
    assert all(torch.equal(a, b) for a, b in zip(fast.result["logits"], plain.result["logits"], strict=True))


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_with_trusted_ops_gives_the_same_tokens_and_flops(use_cache):
    batches = [[p for p in C.likesworld.make_prompts(30, 4) if len(p) == n][:3] for n in (15, 19)]
    kw = dict(batches=batches, max_new_tokens=5, use_cache=use_cache)
    xs = [torch.tensor(b) for b in batches]
    plain, fast = (_replay(_record(S.generate, op_by_op, **kw), xs) for op_by_op in (True, False))
    assert fast.ops < plain.ops / 2
    assert fast.matmul_flops == plain.matmul_flops and _per_call(fast) == _per_call(plain)
    assert all(torch.equal(a, b) for a, b in zip(fast.result, plain.result, strict=True))


def _args(name: str, dtype=torch.float32, rows=(2, 3)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    return {"linear": lambda: [r(*rows, 64), r(30, 64)],
            "rms_norm": lambda: [r(*rows, 64), r(64)],
            "swiglu": lambda: [r(*rows, 64), r(128, 64), r(128, 64), r(64, 128)],
            "embedding": lambda: [torch.randint(0, 30, rows, generator=g), r(30, 64)],
            "attention_heads": lambda: [r(2, 7, 64), torch.arange(3, 10), r(64, 64), r(64, 64), r(64, 64)],
            "merge_heads": lambda: [r(2, 4, 7, 16), r(64, 64)]}[name]()


COURSE = {"linear": F.linear, "rms_norm": lambda x, w: tt.rms_norm(x, w, 1e-5), "swiglu": tt.swiglu,
          "embedding": F.embedding,
          "attention_heads": lambda x, p, wq, wk, wv: tt.attention_heads(x, p, wq, wk, wv, 4, 10000.0),
          "merge_heads": tt.merge_heads}


@pytest.mark.parametrize("name", sorted(C.TRUSTED))
def test_each_trusted_op_counts_the_flops_of_its_recorded_ops_and_computes_the_course_function(name):
    args = _args(name)
    recorded = R.record_and_replay(COURSE[name], *args)
    sizes, flops = C.TRUSTED[name].cost(args)
    assert flops == recorded.matmul_flops
    assert sizes and all(s > 0 for s in sizes)
    got, want = C.TRUSTED[name](*args), COURSE[name](*args)
    assert all(torch.equal(a, b) for a, b in zip(R.tree_flatten(got)[0], R.tree_flatten(want)[0], strict=True))


def _forged(op: list, inputs: int = 1, named: list | None = None) -> dict:
    """A record with one op (what a hostile worker could send)."""
    return {"inputs": inputs, "ops": [op], "constants": [], "named": named or [], "marks": {},
            "result": ["$t", 100]}


W_LM = [[1, "param:lm_head.weight"]]  # ref 1: the judge's own lm_head weight (30, 64)


@pytest.mark.parametrize("op,x,why", [
    (["judge::linear", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(2, 3, 65), "shape"),
    (["judge::linear", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(2, 3, 64).double(), "float"),
    (["judge::linear", [["$t", 0], ["$t", 1], 2.5], {}, ["$t", 100]], torch.randn(3, 64), "tensor arguments"),
    (["judge::linear", [["$t", 0], ["$t", 1]], {"bias": 1.0}, ["$t", 100]], torch.randn(3, 64), "keyword"),
    (["judge::linear", [["$t", 0], ["$t", 1]], {}, [["$t", 100], ["$t", 101]]], torch.randn(3, 64), "number"),
    (["judge::linear", [["$t", 0], ["$t", 0]], {}, ["$t", 100]], torch.randn(2, 3, 64), "matrix"),
    (["judge::rms_norm", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(3, 64), "vector"),
    (["judge::rope", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(1, 1, 3, 64), "does not compute"),
    (["judge::merge_heads", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(1, 4, 3, 8), "weight"),
    (["judge::attention_heads", [["$t", 0], ["$t", 0], ["$t", 1], ["$t", 1], ["$t", 1]], {}, [["$t", 100],
      ["$t", 101], ["$t", 102]]], torch.randn(1, 3, 64), "positions"),
    (["judge::embedding", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.tensor([[3, 30]]), "outside"),
    (["judge::embedding", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.tensor([[-1]]), "outside"),
    (["judge::forward", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(3, 64), "does not compute"),
    (["judge::attention", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], torch.randn(3, 64), "does not compute"),
])
def test_a_forged_judge_op_on_other_arguments_is_refused(op, x, why):
    with pytest.raises(R.ReplayRefused, match=why) as err:
        _replay(_forged(op, named=W_LM), [x])
    assert err.value.kind == "malformed"


def test_a_judge_op_is_refused_where_the_test_gives_the_judge_no_function_for_it():
    rec = _forged(["judge::linear", [["$t", 0], ["$t", 1]], {}, ["$t", 100]], named=W_LM)
    x = torch.randn(3, 64)
    assert torch.equal(_replay(rec, [x]).result, F.linear(x, C.model().lm_head.weight))
    with pytest.raises(R.ReplayRefused, match="does not compute"):
        R.replay(rec, [x], part=5, named=C.named_weights(C.model()))  # no trusted= (e.g. another part)


def test_an_oversized_judge_op_is_refused_before_it_runs():
    """An expand to 2^20 rows (a view: no memory, within the bound of views) into the FFN: its (2^20, 128)
    temporaries would take 1 GiB each, above the judge's bound of one tensor."""
    x = torch.randn(1, 64)
    huge = [1 << 20, 64]
    named = [[1 + i, f"param:blocks.0.ffn.{w}.weight"] for i, w in enumerate(("w1", "w3", "w2"))]
    rec = {"inputs": 1, "constants": [], "named": named, "marks": {}, "result": ["$t", 101],
           "ops": [["aten::expand.default", [["$t", 0], huge], {}, ["$t", 100, huge, [0, 1], "float32"]],
                   ["judge::swiglu", [["$t", 100], ["$t", 1], ["$t", 2], ["$t", 3]], {}, ["$t", 101]]]}
    start = time.perf_counter()
    with pytest.raises(R.ReplayRefused, match="bytes") as err:
        _replay(rec, [x])
    assert err.value.kind == "budget" and time.perf_counter() - start < 1.0


def test_the_worker_records_arguments_outside_the_judges_signature_op_by_op():
    model = S._model("float32")
    rec = Recorder()
    attn = model.blocks[0].attn
    with S._course_ops_trusted(rec, model), rec:
        attn.heads(torch.randn(1, 3, 64), torch.arange(3).double())  # float positions: op by op
        model.lm_head(torch.randn(2, 64))
        attn.merge(torch.randn(1, 3, 4, 16), 1, 3)  # heads not where the course puts them: op by op
        attn.heads(torch.randn(1, 3, 64), torch.arange(3))
    names = [op[0] for op in rec.ops]
    assert "aten::cos.default" in names and "aten::mm.default" in names and "aten::transpose.int" in names
    assert [n for n in names if n.startswith("judge::")] == ["judge::linear",
                                                             "judge::linear",  # merge's own wo, still trusted
                                                             "judge::attention_heads"]
    assert rec.ops[-1][3][0][2] == [1, 4, 3, 16], "q, k, v (B, H, T, d): one op with three outputs"
    assert "forward" not in vars(model.lm_head) and "heads" not in vars(attn), "removed after the call"


def test_a_recompute_pays_for_every_token_through_the_trusted_ops():
    """recompute_no_cache's forward_with_cache (the whole sequence through the course model every call):
    its projections are judge:: ops only (no recorded mm), and their FLOPs alone break the per-call bound."""
    class Recompute:
        KVCache = kv.KVCache

        @staticmethod
        @torch.no_grad()
        def forward_with_cache(model, tokens, cache, attention=None):
            cache.seen = tokens if not hasattr(cache, "seen") else torch.cat([cache.seen, tokens], 1)
            cache.lengths = [cache.seen.shape[1]] * cache.n_layers
            return model(cache.seen)[:, -tokens.shape[1]:]

    student = StandIn(Recompute)
    case = C.CacheCase(chunks=(5, 1), seed=100)
    tokens, sizes = case.plan()
    record = student.scenario("part5.cached_logits", tokens=tokens, chunks=sizes, max_len=sum(sizes))
    rp = _replay(record, [tokens])
    trusted = sum(f for n, f in rp.flops_by_op.items() if n.startswith("judge::"))
    assert "aten::mm" not in rp.op_counts and trusted > 0.9 * rp.matmul_flops
    assert trusted > C.call_flops_bound(sum(sizes), sum(sizes)) * len(sizes) / 3
    with pytest.raises(CheckFailure, match="no recompute"):
        C.check_cached_logits(student, case)


def test_the_example_streams_give_the_lists_first_examples():
    """example_tokens and twin_prompts read examples one at a time (likesworld.iter_examples): the same
    examples, in the same order, as the fixed lists they used to draw whole."""
    assert C.likesworld.examples("test", 40, seed=9) == [e for e, _ in zip(C.likesworld.iter_examples("test", 9), range(40))]
    for seed, batch, min_len in ((100, 1, 8), (203, 3, 6), (302, 2, 12), (305, 5, 12), (0, 1, 25), (7, 4, 30)):
        exs = C.test_examples(seed)
        first = next(t for t in exs if len(t) >= min_len)
        want = [t for t in exs if len(t) == len(first)][:batch]
        if len(want) == batch:
            assert C.example_tokens(seed, batch, min_len).tolist() == [list(t) for t in want]
    shapes = ((3, 11), (2, 19), (1, 27))
    for draw in range(1, 6):  # twin_prompts: the first draw whose batches are all far from a tie
        exs = C.test_examples(R.twin_seed(2 * 1000 + draw))
        batches = [tuple([e[:t0] for e in exs if len(e) > t0][:b]) for b, t0 in shapes]
        if all(len(x) == b for x, (b, _) in zip(batches, shapes)) and \
                all(C.greedy_reference(x, 8, "float32")[1] >= C.MIN_MARGIN for x in batches):
            break
    assert C.twin_prompts(shapes, 8, "float32", 2) == tuple(batches)


def test_a_cache_that_writes_the_blocks_itself_from_the_models_modules_passes():
    """A legal variant: forward_with_cache without block(...), from attn_norm, wq/wk/wv, rope, wo and ffn
    (some of them trusted ops, rope and its own attention op by op)."""
    class OwnBlocks:
        KVCache = kv.KVCache

        @staticmethod
        @torch.no_grad()
        def forward_with_cache(model, tokens, cache, attention=None):
            cfg = model.config
            B, T = tokens.shape
            positions = torch.arange(cache.length, cache.length + T)
            x = model.tok_emb(tokens)
            for i, blk in enumerate(model.blocks):
                h = blk.attn_norm(x)
                a = blk.attn
                q, k, v = (w(h).view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2) for w in (a.wq, a.wk, a.wv))
                k, v = cache.update(i, tt.rope(k, positions, cfg.rope_base), v)
                o = tt.standard_attention(tt.rope(q, positions, cfg.rope_base), k, v, True)
                x = x + a.wo(o.transpose(1, 2).reshape(B, T, -1))
                x = x + blk.ffn(blk.ffn_norm(x))
            return model.lm_head(model.norm(x))

    for case in (C.CacheCase(chunks=(5, 3, 1), seed=101), C.CacheCase(chunks=(4, 5, 1), seed=205, dtype="float64",
                                                                       batch=2)):
        C.check_cached_logits(StandIn(OwnBlocks), case)
