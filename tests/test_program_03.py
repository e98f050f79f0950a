"""code/lecture05/03_flash_on_gpusim.py (§5.3–§6.3): runs as a student would, prints the figures.

The figures are computed by the program (simulator counters and course.cost_model); these tests
check that the printed values are the lecture's and that the closed-form rows say "yes"."""

from __future__ import annotations

import re

import pytest

from lecture_programs import run_program



@pytest.fixture(scope="module")
def output() -> str:
    return run_program("03_flash_on_gpusim.py")


def row(output: str, label: str) -> str:
    [line] = [ln for ln in output.splitlines() if label in ln]
    return line


def test_every_demo_is_printed(output):
    for head in ("Demo 1 (§5.3)", "Demo 2 (§5.5)", "Demo 3 (§6.1)", "§6.2", "Demo 4 (§6.3)"):
        assert head in output, f"{head} missing from the output"


def test_counts_table(output):
    assert re.search(r"shared wavefronts\s*│ 616,448\s*│ 71,680", output), "§5.3 footnote: 616,448 vs 71,680"
    assert re.search(r"global buffers\s*│ Q K S P V O\s*│ Q K V O L ", output), "S and P absent from flash"
    assert "S and P never appear there" in output
    errs = [float(x) for x in re.findall(r"(\d\.\de-0[67])", row(output, "max |o - float64 reference|"))]
    assert len(errs) == 2 and all(e < 1e-6 for e in errs), "both ~4e-7: float32 rounding"


def test_closed_forms_match_the_counters(output):
    for label, value in (("standard, ideal cache", "1,310,720"), ("flash, no cache", "656,384"),
                         ("flash, ideal cache", "263,168")):
        line = row(output, label)
        assert line.count(value) == 2 and "yes" in line, line
    assert "= 5.0x" in output, "§5.3: 5.0x less DRAM traffic with an ideal cache"


def test_h100_estimate(output):
    assert re.search(r"standard total \(3 kernels\).*1,334", output), "§5.5: standard ~1,334 µs"
    assert re.search(r"flash, K/V from L2.*282 .*4\.7x", output), "§5.5: flash ~282 µs, 4.7x"
    assert re.search(r"flash, K/V from HBM.*2\.0x", output), "§5.5: 2.0x with K/V re-read from HBM"


def test_block_sizes(output):
    assert re.search(r"128 │ 160 KiB\s*│ yes", output), "§6.1: B = 128 at d = 128 fits an H100 SM (160 KiB)"
    assert re.search(r"256 │ 320 KiB\s*│ no", output), "§6.1: B = 256 does not (320 KiB)"


def test_causal_skipping(output):
    assert re.search(r"10 of 16\s*│ 10\s*│ 327,680\s*│ 524,288", output), "§6.2: 10 of 16 pairs, 327,680 B"
    assert re.search(r"528 of 1024\s*│ 528 .*51\.6%", output), "§6.2: T = 32 computes 51.6% of the block pairs"


def test_fa1_against_fa2(output):
    assert "51.9 M" in output and "34.6 M" in output and "2.1 M" in output, "§6.3: 51.9 M, 34.6 M, 2.1 M elements"
    assert re.search(r"FA1 \(K/V outer\).*│ 32 ", output), "§6.3: FA1 has 32 thread blocks"
    assert re.search(r"FA2 \(Q outer\).*│ 1,024 ", output), "§6.3: FA2 has 1,024 thread blocks"
    for name in ("FA1    │", "FA2    │"):
        assert "yes" in row(output, name), "measured traffic equals the formula"
