# CANARY-HIDDEN-6ae7ba3699c0 (release leak detector: hidden tests must never reach students)
"""Part 5 hidden cases for the checks of autograder/tests/test_part5_kv_cache.py: more shapes, seeds and edge cases."""
from autograder.tests import cases_part5 as C

CACHE = [
    C.CacheCase(chunks=(3, 1), seed=200),
    C.CacheCase(chunks=(1, 1), seed=201),                     # a 1-token prompt must work too
    C.CacheCase(chunks=(9, 4, 1, 2), seed=202),
    C.CacheCase(chunks=(2, 2), seed=203, batch=3),            # batch > 1
    C.CacheCase(chunks=(6, 1), seed=204, batch=4, extra_len=10),   # a cache longer than needed
    C.CacheCase(chunks=(4, 5, 1), seed=205, dtype="float64", batch=2),
    C.CacheCase(chunks=(11, 3), seed=206),
]
UNITS = [
    C.UnitCase(n_layers=3, batch=1, n_heads=2, max_len=10, head_dim=8, steps=(1, 1, 4, 2), seed=1),
    C.UnitCase(n_layers=2, batch=3, n_heads=4, max_len=6, head_dim=2, steps=(4, 2), dtype="float64", seed=2),
]

HIDDEN = {
    "test_cached_logits_every_step": CACHE,
    "test_generate_other_prompts": [dict(seed=7, n=40, max_new_tokens=10)],
    "test_generate_float64_model": [dict(seed=8, n=3, max_new_tokens=6, dtype="float64")],
    "test_generate_batched": [dict(seed=302, batch=2), dict(seed=305, batch=5)],
    "test_cache_update_and_length": UNITS,
    "test_cache_errors": [dict(unit=UNITS[0], prefill=7, names=("overflow", "overflow_layer1", "wrong_head_dim",
                                                                 "wrong_heads", "k_v_mismatch", "negative_layer"))],
}
