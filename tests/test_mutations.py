"""The mutation catalogue (instructor/mutations/*.toml): every known bug is caught in its part,
with its hint in that part's feedback, and costs no other part any points.

Each mutation grades only its declared part: a part that cannot reach an edited file
(autograder/engine/deps.py) runs exactly the code it runs for the solutions, which score 100/100
(test_grade_solutions_and_starter.py); a part that imports the edited file may lose points by
design (`python -m instructor.catalogue --full` grades those too). Grading is fail-fast,
so a caught bug costs the tests up to its first failure; the catalogue is graded in 2 judge
processes at once (AUTOGRADER_MUTATION_JOBS), each forking its workers from a pre-imported server.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from instructor import catalogue as cat

MUTATIONS = cat.all_mutations()
MUTATIONS2 = cat.all_mutations(cat.MUTATIONS2_DIR)  # new bugs, not tuned to the diagnosis: caught in their part

# the module fixture grades a lot at once; on a loaded shared machine it can pass the default 300 s
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    jobs = max(1, int(os.environ.get("AUTOGRADER_MUTATION_JOBS", "2")))
    paths = MUTATIONS + MUTATIONS2
    if jobs == 1:
        return {str(p): cat.verdict_dict(p) for p in paths}
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return {str(p): v for p, v in zip(paths, pool.map(cat.verdict_dict, paths))}


def test_the_catalogue_exists():
    assert len(MUTATIONS) >= 5 and len(MUTATIONS2) >= 25
    assert {p.stem for p in MUTATIONS} >= {"softmax_no_rescale", "softmax_merge_nan"}


@pytest.mark.parametrize("path", MUTATIONS, ids=lambda p: p.stem)
def test_mutation_is_caught_in_its_part(path: Path, verdicts):
    v = verdicts[str(path)]
    assert v["ok"], f"{path.name} ({v['description']}):\n" + "\n".join(v["problems"])


@pytest.mark.parametrize("path", MUTATIONS2, ids=lambda p: p.stem)
def test_new_bug_is_caught_in_its_part(path: Path, verdicts):
    """The second catalogue measures naming (python -m instructor.catalogue --rates); here every bug must be
    caught in its own part and cost no other part anything."""
    v = verdicts[str(path)]
    problems = [p for p in v["problems"] if not p.startswith("caught, but the hint")]
    assert not problems, f"{path.name} ({v['description']}):\n" + "\n".join(problems)


def test_a_stale_edit_fails_loudly(tmp_path):
    bad = tmp_path / "stale.toml"
    bad.write_text('part = 1\ndescription = "x"\nhint = "y"\n[[edit]]\nfile = "online_softmax.py"\n'
                   'old = "this text is not in the file"\nnew = ""\n')
    with pytest.raises(cat.MutationError, match="occurs 0 times"):
        cat.apply(cat.load_mutation(bad), tmp_path / "sub")
    twice = tmp_path / "twice.toml"
    twice.write_text('part = 1\ndescription = "x"\nhint = "y"\n[[edit]]\nfile = "online_softmax.py"\n'
                     'old = "torch"\nnew = "torch"\n')
    with pytest.raises(cat.MutationError, match="must be exactly once"):
        cat.apply(cat.load_mutation(twice), tmp_path / "sub2")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('part = 1\ndescription = "x"\nhint = "y"\nbogus = 1\n[[edit]]\nfile = "a.py"\nold = "a"\nnew = "b"\n')
    with pytest.raises(cat.MutationError, match="unknown keys"):
        cat.load_mutation(unknown)


def test_a_harmless_edit_is_reported_as_not_caught(tmp_path):
    """The harness itself can fail: a mutation that changes nothing is 'not caught'."""
    noop = tmp_path / "noop.toml"
    noop.write_text('part = 1\ndescription = "a comment changes"\nhint = "anything"\n[[edit]]\n'
                    'file = "online_softmax.py"\nold = "# §4.1: exp, sum, divide."\nnew = "# §4.1: exp, sum and divide."\n')
    verdict = cat.run(cat.load_mutation(noop))
    assert not verdict.ok and any("not caught" in p for p in verdict.problems)
    assert verdict.graded_parts == [1] or 1 in verdict.graded_parts
