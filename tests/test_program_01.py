"""code/lecture05/01_attention.py (§2–§3): runs, and prints the sections' figures."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from course import likesworld

from lecture_programs import run_program

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "code" / "lecture05" / "figures"


@pytest.fixture(scope="module")
def run() -> tuple[str, float]:
    started = time.time()
    return run_program("01_attention.py"), started


@pytest.fixture(scope="module")
def output(run) -> str:
    return run[0]


def _row(output: str, first_cell: str, section: str = "") -> list[str]:
    """The cells of the first table row whose first cell is `first_cell`, after `section`."""
    for line in output.split(section, 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r}")


def _pct(cell: str) -> float:
    return float(cell.rstrip("%")) / 100


def test_prints_every_demo(output):
    for n in range(1, 5):
        assert f"Demo {n}" in output, f"demo {n} missing from the output"


def test_accuracy_and_baseline(output):
    m = re.search(r"test accuracy \(held-out worlds, (\d+) questions\): ([\d.]+)%", output)
    assert m and int(m[1]) == sum(len(e.answer_at) for e in likesworld.examples("test"))
    assert m[2] == "100.0", "the checkpoint answers every held-out question"
    base = likesworld.random_item_baseline("test")
    assert f"random item from the context: {base:.1%}" in output, "the baseline is computed from the data"


def test_head_roles(output):
    owner = re.search(r"owner head: L(\d)H(\d) puts (\d+)% of each item's attention on its owner", output)
    assert owner and owner[1] == "0" and int(owner[3]) >= 80, "a layer-0 head points items at their owners"
    assert int(_row(output, f"L0H{owner[2]}", "Demo 2")[1].rstrip("%")) == int(owner[3])
    lookups = [_pct(_row(output, f"L1H{h}", "Demo 2")[3]) for h in range(4)]
    assert max(lookups) >= 0.8, f"a layer-1 head looks the item up: {lookups}"


def test_ablation_tells_the_story(output):
    owner = re.search(r"owner head: L(\d)H(\d)", output)
    single = {f"L{l}H{h}": _pct(_row(output, f"L{l}H{h}", "Demo 3")[1]) for l in range(2) for h in range(4)}
    owner_acc = single[f"L{owner[1]}H{owner[2]}"]
    assert owner_acc == min(single.values()), f"removing the owner head hurts most: {single}"
    base = likesworld.random_item_baseline("test")
    assert _pct(_row(output, "all of layer 1", "Demo 3")[1]) < base, "without layer 1 nothing looks the item up"
    assert sum(a >= 0.99 for a in single.values()) >= 1, "some heads are not needed for this task"


def test_heatmaps_saved(run):
    _, started = run
    for name in ("owner_head.png", "lookup_head.png"):
        path = FIGURES / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is a PNG"
        assert path.stat().st_mtime >= started - 1, f"{name} was written by this run"


def test_7b_layer_figures(output):
    """§3.1–§3.2: attention 73% of the layer at 128K; S = 64 GiB (86% of 80 GB) and ~82 ms of
    traffic against ~18 ms of matmul at 32K."""
    assert _row(output, "128K", "Demo 4")[3] == "73%"
    assert _row(output, "32K", "Demo 4")[4] == "64 GiB"
    traffic = [line for line in output.splitlines() if "ms" in line and "32K" in line]
    assert traffic, "the 32K traffic row"
    cells = [c.strip() for c in traffic[0].strip().strip("│").split("│")]
    assert round(float(cells[2].split()[0])) == 82 and round(float(cells[3].split()[0])) == 18 and cells[4] == "86%"
