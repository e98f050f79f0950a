"""code/lecture05/02_softmax.py (§4): runs, and prints the section's figures."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lecture_programs import load_program, run_program



pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def program():
    return load_program("02_softmax.py")


@pytest.fixture(scope="module")
def output() -> str:
    # Run as a student would (from the repo root, no PYTHONPATH): the program must find its imports.
    return run_program("02_softmax.py", timeout=120)


def test_prints_every_demo(output):
    for n in range(1, 5):
        assert f"Demo {n}" in output, f"demo {n} missing from the output"


def test_overflow_thresholds(program, output):
    thr = program.overflow_thresholds()
    assert round(thr["float32"], 1) == 88.7 and round(thr["float16"], 2) == 11.09, "§4.1: 88.7 (fp32), 11.09 (fp16)"
    assert "88.72" in output and "11.09" in output, "the thresholds are printed"
    demo = program.naive_nan_demo()
    assert math.isnan(demo["naive"][1]) and not any(math.isnan(p) for p in demo["safe"]), "naive NaN, safe fine"


def test_passes_and_rebases(program, output):
    pc = program.pass_counts()
    assert (pc["naive"], pc["safe"], pc["online"]) == (2, 3, 2), "§4.2–§4.3: passes 2 / 3 / 2"
    assert round(pc["expected_rebases"], 1) == 7.9, "§4.3: expected rebases Σ_{k=2}^{4096} 1/k ≈ 7.9"
    assert 1 <= pc["rebases"] <= 20, "rebases on 4,096 random values are O(ln N), not O(N)"
    assert f"online rebases: {pc['rebases']} " in output and "7.90" in output, "rebases and expectation printed"


def test_merge_orders_agree_in_float64(output):
    diffs = [float(x) for x in re.findall(r"│\s*(?:left to right|7 uneven|pairwise tree|7 blocks, shuffled)[^│]*│[^│]*│\s*([0-9.e+-]+)", output)]
    assert len(diffs) == 4, f"four merge orders printed, found {len(diffs)}"
    # float64 logsumexp of 10,000 values ~20: a few ulps (4e-15 each) of accumulated rounding.
    assert max(diffs) < 1e-13, f"§4.4: merge orders agree with torch.logsumexp to ~1e-15, got {max(diffs)}"
    assert "pairwise tree (14 levels)" in output, "10,000 leaves need 14 levels"
    fp32 = float(re.search(r"differ by ([0-9.e+-]+)", output).group(1))
    assert 1e-7 < fp32 < 1e-4, "§4.4: float32 merge orders differ in the last digits (notes: 7.6e-6)"


def test_online_trace(program, output):
    tr = program.online_trace()
    assert len(tr["steps"]) == 4, "four K/V blocks"
    assert tr["max_diff"] < 1e-14, "§4.5: the final o / ℓ equals standard attention to ~1e-16"
    # Each row of the trace must be the (m, ℓ, o) of the keys seen so far, computed here at once
    # from the scores (no ⊕): after block b, m = max of the prefix, ℓ = Σ exp(s - m), o = Σ exp(s - m) v,
    # and ℓ_b = rescale·ℓ_(b-1) + Σ_(block b) exp(s - m_b) (the rescale factor is the one applied).
    s, v = torch.tensor(tr["scores"], dtype=torch.float64), torch.tensor(tr["values"], dtype=torch.float64)
    blocks = torch.arange(len(s)).chunk(4)
    prev = None
    for st, idx in zip(tr["steps"], blocks):
        seen = s[: int(idx[-1]) + 1]
        m = seen.max()
        p = torch.exp(seen - m)
        assert st["m"] == m.item(), f"block {st['block']}: m must be the max of the scores seen so far"
        assert math.isclose(st["l"], p.sum().item(), rel_tol=1e-13), f"block {st['block']}: ℓ = Σ exp(s - m) so far"
        o = torch.tensor(st["o"], dtype=torch.float64)
        assert torch.allclose(o, p @ v[: len(seen)], atol=1e-13), f"block {st['block']}: o = Σ exp(s - m) v so far"
        if prev is not None:
            fresh = torch.exp(s[idx] - m).sum().item()
            assert math.isclose(st["l"], st["rescale"] * prev["l"] + fresh, rel_tol=1e-13), (
                f"block {st['block']}: the printed rescale factor is not the one that updates ℓ (§4.5)"
            )
        prev = st
    assert any(st["rescale"] < 1 for st in tr["steps"][1:]), "this seed shows at least one rebase"
    assert f"max |diff| = {tr['max_diff']:.1e}" in output, "the final comparison is printed"
