"""A small part-1 test module for the instructor-side tests (red team, nbgrader channel).

Those tests check isolation and channels, not test coverage, so they grade with these three tests
(naive_softmax twice, merge_partial once, through the engine's `student` proxy and check_close)
instead of the full suites: the same engine, judge, worker and sandbox, a fraction of the time.
The real public and hidden suites run through the Gradescope test and `make grade`.
"""
from __future__ import annotations

from pathlib import Path

MINI_TESTS = '''
"""Part-1 checks through the engine (written by tests/autograder_minitests.py)."""
import pytest
import torch

from autograder.engine.checks import check_close, unpack

pytestmark = pytest.mark.part1


def _x(seed, shape=(4, 33)):
    return 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [0, 1])
def test_naive_softmax(student, seed):
    x = _x(seed)
    out = student.call("online_softmax.naive_softmax", x)
    check_close(out, torch.softmax(x.double(), -1), what="naive_softmax(x)", inputs={"x": x},
                plain=torch.softmax(x, -1))


def _summary(s, v):
    m = s.amax(-1)
    p = torch.exp(s - m[:, None])
    return m, p.sum(-1), p @ v


def test_merge_partial(student):
    s, v = _x(2), _x(3, (33, 8))
    a, b = _summary(s[:, :10], v[:10]), _summary(s[:, 10:], v[10:])
    m, l, o = unpack(student.call("online_softmax.merge_partial", a, b), 3, what="merge_partial returns (m, l, o)")
    whole, plain = _summary(s.double(), v.double()), _summary(s, v)
    check_close(l, whole[1], what="l of merge_partial", inputs={"s": s}, plain=plain[1])
    check_close(o, whole[2], what="o of merge_partial", inputs={"s": s, "v": v}, plain=plain[2])
'''

# An honest mistake in part 1 (appended to the solution): merge_partial adds the outputs without
# rescaling them to the common max. It fails test_merge_partial and nothing else above.
MERGE_BUG = '''

def merge_partial(a, b):  # an honest mistake: the outputs are added without rescaling
    (ma, la, oa), (mb, lb, ob) = a, b
    return torch.maximum(ma, mb), la + lb, oa + ob
'''


def write_mini_tests(folder: Path) -> Path:
    """A tests folder holding MINI_TESTS (public cases only); pass it as the engine's tests_dir."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_part1_minitests.py").write_text(MINI_TESTS)
    return folder
