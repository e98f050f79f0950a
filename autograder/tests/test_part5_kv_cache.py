"""Part 5 public tests: the KV cache against recomputing the whole sequence (cases in cases_part5.py)."""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part5 as C
from autograder.tests import diagnose as dg

pytestmark = pytest.mark.part5

# >= 2 layers (the committed model) and prompts of >= 2 tokens: the §8.2 layer-0 regression is
# invisible with a 1-token prompt and only ~1e-2 on logits, so logits are compared at every call.
CACHE = [
    C.CacheCase(chunks=(5, 1), seed=100),                 # prefill 5, then 1-token decode steps
    C.CacheCase(chunks=(5, 3, 2), seed=101),              # multi-token chunks
    C.CacheCase(chunks=(2, 1), seed=102),                 # shortest prompt that exposes the regression
    C.CacheCase(chunks=(7, 1), seed=103, dtype="float64"),
]
UNIT = C.UnitCase()
FULL = C.UnitCase(steps=(3, 2, 3), seed=1)  # fills max_len = 8 exactly: that fits


# The cache on its own first, then the model through it: a bug of update shows where it is (the
# integration tests would report its symptoms: logits off, or update's own overflow error).
@cases(UNIT, FULL, diagnosis=dg.hidden_cache)
def test_cache_update_and_length(student, case):
    """KVCache.update appends to one layer and returns its filled prefix as views of one preallocated buffer; length follows layer 0 (§8.2)."""
    C.check_cache_unit(student, case)


@cases(dict(unit=UNIT, prefill=6, names=("overflow", "wrong_head_dim", "k_v_mismatch", "layer_past_the_last",
                                        "negative_layer")))
def test_cache_errors(student, case):
    """KVCache.update raises ValueError, with a one-line message, on overflow, a wrong head_dim, k and v of different shapes, or a layer outside 0..n_layers-1 (a negative one too); the rejected update changes nothing: the next one that fits succeeds."""
    C.check_cache_errors(student, case["unit"], prefill=case["prefill"], names=case["names"])


@cases(*CACHE, diagnosis=dg.hidden_cache)
def test_cached_logits_every_step(student, case):
    """forward_with_cache's logits at every call equal the model's uncached logits, with no recompute of cached tokens (§8.2)."""
    C.check_cached_logits(student, case)


@cases(dict(seed=2, n=60, max_new_tokens=8), diagnosis=dg.hidden_cache)
def test_generate_60_prompts_cached(student, case):
    """generate(use_cache=True) gives the greedy tokens of the uncached model on every prompt, with the cache's FLOPs (§8.1)."""
    C.check_generate(student, **case, use_cache=True)


@cases(dict(seed=2, n=60, max_new_tokens=8), diagnosis=dg.hidden_cache)
def test_generate_60_prompts_recompute(student, case):
    """generate(use_cache=False) gives the greedy tokens of the uncached model on every prompt (§8.1)."""
    C.check_generate(student, **case, use_cache=False)


@cases(dict(seed=3, n=2, max_new_tokens=4, dtype="float64"), diagnosis=dg.hidden_cache)  # a float64 model needs a float64 cache
def test_generate_float64_model(student, case):
    """generate with a float64 model: the cache takes the model's dtype (§8.1)."""
    C.check_generate(student, **case, use_cache=True)


@cases(diagnosis=dg.hidden_cache)  # hidden cases only: more prompts
def test_generate_other_prompts(student, case):
    """generate(use_cache=True) on other prompts: the greedy tokens of the uncached model (§8.1)."""
    C.check_generate(student, **case, use_cache=True)


@cases(diagnosis=dg.hidden_cache)  # hidden cases only: a batch of prompts of different lengths
def test_generate_batched(student, case):
    """generate on a batch of prompts: each row's greedy tokens as if generated alone (§8.1)."""
    C.check_generate_batched(student, **case)
