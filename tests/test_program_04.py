"""code/lecture05/04_backward.py (§7): runs, and prints the section's figures."""

from __future__ import annotations

import re

import pytest
import torch

from course.reference import causal_mask

from lecture_programs import load_program, run_program



pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def program():
    return load_program("04_backward.py")


@pytest.fixture(scope="module")
def output() -> str:
    return run_program("04_backward.py")


def test_prints_every_demo(output):
    for n in range(1, 6):
        assert f"Demo {n}" in output, f"demo {n} missing from the output"
    assert "skipped" not in output, "demo 5 must run (the tiny transformer is part of the course package)"


def test_gradients_match_autograd_in_float64(output):
    rows = re.findall(r"│ (none|causal)\s*│ ([0-9.e+-]+)\s*│ ([0-9.e+-]+)\s*│ ([0-9.e+-]+)", output)
    assert [r[0] for r in rows] == ["none", "causal"], "both masks are shown"
    worst = max(float(x) for r in rows for x in r[1:])
    assert worst < 1e-13, f"§7.4: dQ, dK, dV within ~1e-15 of autograd in float64 (N=300, d=32), got {worst}"
    d_diff = float(re.search(r"dO_i · O_i: max \|diff\| = ([0-9.e+-]+)", output).group(1))
    assert d_diff < 1e-13, "§7.3: D_i identity holds to rounding"


def test_dq_atomic_adds_counted(program, output):
    counted = program.count_dq_adds()
    assert counted["counted"] == 67_200 == 7 * 300 * 32, "§7.4: 67,200 dQ atomic adds at N=300, d=32, B_c=48"
    assert "67,200 elements" in output
    # Causal: each computed (K/V block, Q block) tile adds rows x d elements into dQ; whole blocks
    # above the diagonal add nothing. Expected count from the reference mask, tile by tile:
    allowed = causal_mask(300, 300)
    expected = sum(allowed[i0:i0 + 64, j0:j0 + 48].shape[0] * 32
                   for j0 in range(0, 300, 48) for i0 in range(0, 300, 64) if allowed[i0:i0 + 64, j0:j0 + 48].any())
    assert program.count_dq_adds(causal=True)["counted"] == expected, "causal: skipped tiles add nothing to dQ"


def test_storage_and_estimate_figures(output):
    assert re.search(r"│ 65,536\s*│ 256 GiB\s*│ 8 MiB\s*│ 32,768", output), "§7.1/§7.2: P 256 GiB vs L 8 MiB at 64K"
    assert "(+25%)" in output and "traffic 1/29" in output and "speedup 3.3x" in output, "§7.5 figures"
    v100 = re.search(r"│ V100[^\n]*│ (\d+)\s*│\n", output)
    assert v100 and v100.group(1) == "139", "§7.6: V100 crossover at d > 139"


def test_function_saves_no_n_by_n(program):
    shapes = program.saved_by_function()
    assert len(shapes) == 5 and all(torch.Size(s).numel() < 256 * 256 for s in shapes), "q, k, v, o, lse only"


def test_training_with_flash_matches_standard(output):
    m = re.search(r"max loss diff ([0-9.e+-]+); max parameter diff ([0-9.e+-]+)", output)
    assert m, "demo 5 prints the loss and parameter differences"
    loss_diff, param_diff = float(m.group(1)), float(m.group(2))
    # float32 training, same init and data: only the summation order differs (notes: 4.8e-7 and
    # 1.7e-6). A wrong gradient would move the loss by >1e-3 within a few steps.
    assert loss_diff < 1e-5 and param_diff < 1e-4, f"§7.7: flash training drifts: {loss_diff}, {param_diff}"
