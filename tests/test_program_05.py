"""code/lecture05/05_inference.py (§8): runs, and prints the section's figures (with --buggy-cache)."""

from __future__ import annotations

import re

import pytest

from lecture_programs import run_program



@pytest.fixture(scope="module")
def output() -> str:
    return run_program("05_inference.py", "--buggy-cache")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("│┃").split("│")]


def _rows(output: str, section: str) -> list[list[str]]:
    """Table rows (cells) printed after the rule line that contains `section`, up to the next rule."""
    text = output.split(section, 1)[1].split("Demo ", 1)[0]
    return [_cells(line) for line in text.splitlines() if line.startswith("│")]


def test_prints_every_demo(output):
    for n in range(1, 5):
        assert f"Demo {n}" in output, f"demo {n} missing from the output"


def test_cache_equals_recompute(output):
    demo1 = output.split("Demo 1", 1)[1].split("--buggy-cache", 1)[0]
    assert "identical generations: 60/60" in demo1
    diff = float(re.search(r"max \|logit difference\| over all steps: ([\d.e+-]+)", demo1)[1])
    assert 0 < diff < 1e-4, "float32 rounding only: ~2e-5"
    assert re.search(r"60 prompts \(mean 19\.0 tokens\), 8 new tokens each", demo1)


def test_compute_saved(output):
    """Σ_t (L + t) against L + 7 token-forwards for 8 new tokens: ≈ 6.9× at L ≈ 19 (§8.2)."""
    row = next(r for r in _rows(output, "Demo 1") if r[0] == "token-forwards")
    assert row[3] == "6.9×"
    recompute, cached = (int(c.replace(",", "")) for c in row[1:3])
    assert (recompute, cached) == (60 * (8 * 19 + 28), 60 * (19 + 7)), "mean prompt 19 tokens"
    flops = next(r for r in _rows(output, "Demo 1") if r[0].startswith("matmul FLOPs"))
    assert 6.0 < float(flops[3].rstrip("×")) < 8.0


def test_buggy_cache_changes_generations(output):
    """The first version's layer-0 cache-length bug: the same comparison catches it."""
    bug = output.split("--buggy-cache", 1)[1]
    same = int(re.search(r"identical generations: (\d+)/60", bug)[1])
    assert same < 60, "the bug must change some generations"
    diff = float(re.search(r"before the first differing token: ([\d.e+-]+)", bug)[1])
    assert diff > 1e-2


def test_prefill_decode_table(output):
    rows = _rows(output, "Demo 2")
    share = {(r[0], r[1]): r[6] for r in rows if len(r) > 6}
    assert share[("decode", "1")] == "8%" and share[("decode", "128")] == "91%", "§8.3: 8% at batch 1, 91% at 128"


def test_flash_decoding_identical(output):
    rows = {r[0]: r for r in _rows(output, "Demo 3")}
    for s in ("2", "4", "7"):
        assert rows[s][1] == "60/60", f"{s} splits"
        assert float(rows[s][2]) < 1e-4


def test_split_estimate(output):
    rows = {r[0]: r for r in _rows(output, "Demo 4")}
    assert rows["4"][4] == "169 µs" and rows["5"][4] == "268 µs" and rows["5"][2] == "2", "§8.4: two waves at S = 5"
