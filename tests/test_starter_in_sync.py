"""starter/ is exactly what instructor.make_starter generates from solutions/, and the generator
keeps hints, keeps indentation, and refuses regions that are not whole statement blocks."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from instructor import make_starter as ms

REPO = Path(__file__).resolve().parent.parent


def test_starter_matches_solutions():
    diffs = ms.differences(REPO / "solutions", REPO / "starter")
    assert not diffs, "starter/ is out of date, run `make starter`:\n" + "\n".join(diffs)


def test_starter_has_no_solution_code_and_imports():
    for path in sorted((REPO / "starter").glob("*.py")):
        text = path.read_text()
        assert "### BEGIN SOLUTION" not in text and "### END SOLUTION" not in text, path.name
        assert text.startswith(ms.header(path.name)), path.name
        assert "solutions" not in text, f"{path.name}: the student's files do not name the instructor's folder"
        ast.parse(text)


SOURCE = '''\
import torch


# §4.3 hint: keep the running max m and the sum l.
def f(x: torch.Tensor) -> torch.Tensor:
    """Doc."""
    check(x)
    ### BEGIN SOLUTION
    m = x.max()
    return x - m
    ### END SOLUTION


class C:
    def g(self, y):
        if y:
            # inner hint
            ### BEGIN SOLUTION
            return y
            ### END SOLUTION
        return 0
'''


def test_regions_become_raise_with_the_same_indentation_and_hints_stay():
    out = ms.stub_source(SOURCE, "demo.py")
    assert out.startswith(ms.header("demo.py"))  # a file of no part: the package header
    assert ms.stub_source(SOURCE, "flash_forward.py").startswith(
        "# Part 2 of the assignment: your implementation."), "a graded file's header names its part"
    assert "docs/handout/part2_flash_forward.md" in ms.header("flash_forward.py")
    assert "    check(x)\n    raise NotImplementedError\n" in out
    assert "            # inner hint\n            raise NotImplementedError\n        return 0\n" in out
    assert "# §4.3 hint: keep the running max m and the sum l." in out
    assert "m = x.max()" not in out and "return y" not in out
    ast.parse(out)


@pytest.mark.parametrize("source,line,what", [
    ("def f():\n    x = 1\n    ### BEGIN SOLUTION\n    if x:\n        y = 2\n    ### END SOLUTION\n    else:\n        y = 3\n",
     3, "not a whole statement block"),
    ("def f(a):\n    ### BEGIN SOLUTION\n    return g(a,\n    ### END SOLUTION\n        1)\n", 2, "crosses a marker"),
    ("def f():\n    ### BEGIN SOLUTION\n    pass\n", 2, "never closed"),
    ("def f():\n    ### END SOLUTION\n    pass\n", 2, "without"),
    ("def f():\n    ### BEGIN SOLUTION\n    pass\n  ### END SOLUTION\n", 4, "indented differently"),
    ("def f():\n    ### BEGIN SOLUTION\n    # only a comment\n    ### END SOLUTION\n    pass\n", 2, "no statement"),
    ("def f():\n    ### BEGIN  SOLUTION\n    pass\n", 2, "malformed marker"),
])
def test_bad_regions_name_file_and_line(source, line, what):
    with pytest.raises(ms.RegionError) as info:
        ms.stub_source(source, "bad.py")
    assert str(info.value).startswith(f"bad.py:{line}:") and what in str(info.value)


def test_check_mode_reports_drift(tmp_path):
    sol, st = tmp_path / "solutions", tmp_path / "starter"
    sol.mkdir()
    (sol / "a.py").write_text(textwrap.dedent(SOURCE))
    assert ms.main(["--solutions", str(sol), "--starter", str(st), "--check"]) == 1
    assert ms.main(["--solutions", str(sol), "--starter", str(st)]) == 0
    assert ms.main(["--solutions", str(sol), "--starter", str(st), "--check"]) == 0
    (st / "a.py").write_text((st / "a.py").read_text() + "# edited by hand\n")
    (st / "stale.py").write_text("")
    assert ms.differences(sol, st) == ["a.py: differs from what solutions/a.py generates",
                                       "stale.py: in starter/ but not generated from solutions/"]
