"""Part 5 reference solution (solutions/kv_cache.py) and its grading checks (autograder/tests/cases_part5.py).

The checks run here in-process against a stand-in `student` that calls the scenario functions
directly (the engine's own tests cover the worker). The same checks must pass on the solution and
fail, naming the bug, on the mutated solutions of the catalogue: that proves the tests can fail.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import torch

from autograder.engine.checks import CheckFailure
from autograder.scenarios import part5 as scenarios
from autograder.tests import cases_part5 as C
from course import likesworld
from course.tiny_transformer import greedy_generate, load_checkpoint
from solutions import kv_cache as kv

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model():
    return load_checkpoint()


# ---------------------------------------------------------------------------------------------------
# the solution itself


def _cached_step_logits(model, tokens, chunks, forward=kv.forward_with_cache):
    cache = kv.KVCache(model.config.n_layers, tokens.shape[0], model.config.n_heads, tokens.shape[1],
                       model.config.head_dim)
    out, s = [], 0
    for c in chunks:
        out.append(forward(model, tokens[:, s:s + c], cache))
        s += c
    return torch.cat(out, 1), cache


@pytest.mark.parametrize("chunks", [[5] + [1] * 20, [5, 3, 2] + [1] * 15, [2] + [1] * 23, [1] * 25])
def test_cached_logits_equal_recompute_at_every_step(model, chunks):
    tokens = C.example_tokens(seed=0, min_len=25)[:, : sum(chunks)]          # a test-split example
    assert tokens.shape[1] == sum(chunks) == 25
    got, cache = _cached_step_logits(model, tokens, chunks)
    want = model(tokens)                                            # no cache, positions 0..T-1
    # float32: the cache's matmuls have other shapes than the full recompute, so other summation
    # orders; measured <= 3.5e-5 on logits of size ~30 (see cases_part5.py), the bug >= 4e-2.
    assert (got - want).abs().max() < 1e-4
    assert cache.length == sum(chunks)


def test_the_layer0_length_bug_is_caught_by_the_same_comparison(model):
    """The §8.2 regression: prefill exact, later steps off — the comparison above must fail."""
    src = (ROOT / "solutions" / "kv_cache.py").read_text()
    edit = tomllib.loads((ROOT / "instructor/mutations/kv_cache_layer0_length.toml").read_text())["edit"][0]
    buggy = _module_from_source(src.replace(edit["old"], edit["new"]), "kv_cache_layer0_bug")
    tokens = C.example_tokens(seed=0, min_len=25)
    chunks = [5] + [1] * (tokens.shape[1] - 5)
    got, _ = _cached_step_logits(model, tokens, chunks, forward=buggy.forward_with_cache)
    want = model(tokens)
    assert (got[:, :5] - want[:, :5]).abs().max() < 1e-4, "prefill is exact (RoPE is relative within one call)"
    assert (got[:, 5:] - want[:, 5:]).abs().max() > 1e-2, "decode steps are off"
    one_token = tokens[:, :8]
    got1, _ = _cached_step_logits(model, one_token, [1] * 8, forward=buggy.forward_with_cache)
    assert (got1 - model(one_token)).abs().max() < 1e-4, "invisible with a 1-token prompt and 1-token steps"


def test_generate_60_prompts_identical(model):
    prompts = likesworld.make_prompts(60)
    want = [greedy_generate(model, torch.tensor([p]), 8)[0].tolist() for p in prompts]  # no cache
    same = sum(kv.generate(model, torch.tensor([p]), 8)[0].tolist() == list(w) for p, w in zip(prompts, want))
    assert same == 60, f"{same}/60 identical generations"
    for p, w in list(zip(prompts, want))[:10]:
        assert kv.generate(model, torch.tensor([p]), 8, use_cache=False)[0].tolist() == list(w)
    batch = torch.tensor([p for p in prompts if len(p) == 19][:4])
    assert torch.equal(kv.generate(model, batch, 5), greedy_generate(model, batch, 5)), "batch > 1"
    assert torch.equal(kv.generate(model, batch, 0), batch)


def test_kv_cache_buffers_views_and_errors():
    cache = kv.KVCache(2, 2, 3, 8, 4)
    k1, v1 = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    ka, va = cache.update(0, k1, v1)
    assert cache.length == 5 and ka.shape == (2, 3, 5, 4) and torch.equal(ka, k1) and torch.equal(va, v1)
    assert ka.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr(), "a view of the buffer"
    cache.update(1, k1, v1)
    assert cache.length == 5, "length follows layer 0"
    k2 = torch.randn(2, 3, 3, 4)
    ka, _ = cache.update(0, k2, k2)
    assert torch.equal(ka, torch.cat([k1, k2], 2)) and cache.length == 8
    for bad, match in ((lambda: cache.update(0, k2[:, :, :1], k2[:, :, :1]), "overflow.*larger max_len"),
                       (lambda: cache.update(1, torch.zeros(2, 3, 1, 5), torch.zeros(2, 3, 1, 5)), "head_dim=4"),
                       (lambda: cache.update(1, torch.zeros(2, 3, 2, 4), torch.zeros(2, 3, 1, 4)), "must both be"),
                       (lambda: cache.update(2, k2, k2), "out of range")):
        with pytest.raises(ValueError, match=match) as err:
            bad()
        assert "\n" not in str(err.value), "one-line message"


# ---------------------------------------------------------------------------------------------------
# the grading checks, with a stand-in student


def _module_from_source(source: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    sys.modules.setdefault(name, module)
    return module


class StandIn:
    """What the engine gives a test as `student`, in-process: scenarios run right here."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def module(self, name: str) -> ModuleType:
        assert name == "kv_cache"
        return self._module

    def scenario(self, target: str, **kwargs):
        part, _, name = target.partition(".")
        assert part == "part5"
        return getattr(scenarios, name)(self, **kwargs)


def _mutated(name: str) -> StandIn:
    src = (ROOT / "solutions" / "kv_cache.py").read_text()
    mutation = tomllib.loads((ROOT / "instructor" / "mutations" / f"{name}.toml").read_text())
    for e in mutation["edit"]:
        assert src.count(e["old"]) == 1, f"{name}: the edit's old text must occur once"
        src = src.replace(e["old"], e["new"])
    return StandIn(_module_from_source(src, f"kv_cache_{name}"))


PUBLIC_CASES = [C.CacheCase(chunks=(5, 1), seed=100), C.CacheCase(chunks=(5, 3, 2), seed=101),
                C.CacheCase(chunks=(2, 1), seed=102), C.CacheCase(chunks=(4, 5, 1), seed=205, dtype="float64", batch=2)]


def test_checks_pass_on_the_solution():
    student = StandIn(kv)
    for case in PUBLIC_CASES:
        C.check_cached_logits(student, case)
    C.check_generate(student, seed=2, n=60)
    C.check_generate_batched(student, seed=302, batch=2)
    C.check_cache_unit(student, C.UnitCase())
    C.check_cache_errors(student, C.UnitCase(), prefill=6, names=tuple(C.bad_updates(C.UnitCase(), 6)))


@pytest.mark.parametrize("mutation,hint", [("kv_cache_layer0_length", C.HINT_LAYER0),
                                           ("kv_cache_topleft_mask", C.HINT_TOPLEFT)])
def test_checks_name_the_bug(mutation, hint):
    student = _mutated(mutation)
    for case in PUBLIC_CASES:
        with pytest.raises(CheckFailure) as failure:
            C.check_cached_logits(student, case)
        assert failure.value.hint == hint, f"{mutation} on {case.id}: hint {failure.value.hint!r}"
        assert "logits of call" in failure.value.what and failure.value.max_abs > 1e-3


def test_layer0_bug_also_breaks_some_generations():
    with pytest.raises(CheckFailure, match=r"identical"):
        C.check_generate(_mutated("kv_cache_layer0_length"), seed=2, n=60)


def test_the_known_bug_logits_are_those_of_the_buggy_caches():
    """The diagnosis computes a known bug's logits without a cache (cases_part5.bug_logits: no working
    cache ships); they are the logits of the mutated solutions themselves."""
    m32 = C.model("float32")
    for mutation, bug in (("kv_cache_layer0_length", "layer0_length"), ("kv_cache_topleft_mask", "top_left")):
        buggy = _mutated(mutation).module("kv_cache")
        for case in PUBLIC_CASES[:3]:
            tokens, sizes = case.plan()
            got = _cached_step_logits(m32, tokens, sizes, forward=buggy.forward_with_cache)[0]
            want = torch.cat(C.bug_logits(m32, tokens, sizes, bug), 1)
            assert float((got - want).abs().max()) < 1e-4, (mutation, case.id)


def test_concat_cache_fails_the_views_check():
    student = _mutated("kv_cache_concat_copies")
    C.check_cached_logits(student, PUBLIC_CASES[0])            # values are right...
    with pytest.raises(CheckFailure) as failure:
        C.check_cache_unit(student, C.UnitCase())              # ...but nothing is preallocated
    assert failure.value.hint == C.HINT_VIEWS


def test_tolerance_headroom():
    """The float32 bound sits well above a correct cache's error and well below the bug's."""
    m32, m64 = C.model("float32"), C.model("float64")
    for seed, chunks in ((110, (5, 1)), (111, (3, 2)), (112, (9, 4, 1))):
        tokens, sizes = C.CacheCase(chunks=chunks, seed=seed).plan()
        ref, plain = m64(tokens), m32(tokens)
        bound = C.FACTOR * float((plain.double() - ref).abs().max()) + C.ATOL32
        ok = _cached_step_logits(m32, tokens, sizes)[0]  # the solution's cache
        bug = torch.cat(C.bug_logits(m32, tokens, sizes, "layer0_length"), 1)
        assert float((ok.double() - ref).abs().max()) < bound / 2
        assert float((bug.double() - ref).abs().max()) > 10 * bound
