"""The equivalence catalogue (instructor/equivalents/*.toml): every correct but different implementation
scores full points in every part that can reach it (public + hidden), so no legal algorithm loses points.

The mirror of tests/test_mutations.py. An entry with `blocked_by` names a known false failure that
another branch fixes; it is xfail(strict=True), so that it shows up the day it passes (then remove
the mark from its toml).
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from instructor import catalogue as cat

EQUIVALENTS = sorted(cat.EQUIVALENTS_DIR.glob("*.toml"))

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    jobs = max(1, int(os.environ.get("AUTOGRADER_MUTATION_JOBS", "2")))
    if jobs == 1:
        return {p.stem: cat.equivalent_dict(p) for p in EQUIVALENTS}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return {p.stem: v for p, v in zip(EQUIVALENTS, pool.map(cat.equivalent_dict, EQUIVALENTS))}


def _param(path: Path):
    eq = cat.load_equivalent(path)
    marks = [pytest.mark.xfail(strict=True, reason=f"blocked by {eq.blocked_by}")] if eq.blocked_by else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_the_catalogue_covers_the_variants():
    names = {p.stem for p in EQUIVALENTS}
    assert len(names) >= 15
    for needed in ("einsum", "where", "outer", "tight", "per_key", "float64", "views", "import_module"):
        assert any(needed in n for n in names), needed


@pytest.mark.parametrize("path", [_param(p) for p in EQUIVALENTS])
def test_equivalent_scores_full_points(path: Path, verdicts):
    v = verdicts[path.stem]
    assert v["graded"], f"{path.name}: no part reaches {v}"
    assert v["ok"], f"{path.name} ({v['description']}):\n" + "\n".join(v["problems"])


def test_an_equivalent_that_is_a_bug_is_reported(tmp_path):
    """The harness itself can fail: a 'correct' edit that breaks the code loses points."""
    bad = tmp_path / "bad.toml"
    bad.write_text('description = "x"\n[[edit]]\nfile = "flash_decoding.py"\n'
                   'old = "    lse = torch.logsumexp(lse_all, dim=0)"\nnew = "    lse = lse_all.amax(dim=0)"\n')
    v = cat.run_equivalent(cat.load_equivalent(bad))
    assert not v["ok"] and v["graded"] == [6]


def test_part4_gets_a_correct_forward_whatever_the_import_style(tmp_path):
    """flash_backward.py importing the forward as a module (`from . import flash_forward as f`) with a part-2 bug
    in flash_forward: part 4 still runs its Function with a known-good forward and keeps full points."""
    from autograder.engine.runner import grade

    style = cat.load_equivalent(cat.EQUIVALENTS_DIR / "backward_import_module.toml")
    bug = cat.load_mutation(cat.MUTATIONS_DIR / "forward_no_rescale.toml")
    cat.apply(style, tmp_path / "sub")
    cat.apply_edits(bug, tmp_path / "sub")
    report = grade(tmp_path / "sub", parts=[2, 4], test_sets=("public",), fail_fast=True)
    points = {p["part"]: (p["points"], p["max_points"]) for p in report["parts"]}
    assert points[2][0] < points[2][1], "the forward bug must cost part 2"
    assert points[4][0] == points[4][1], points
