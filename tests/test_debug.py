"""`make debug` (autograder/debug.py): the first failing public test, run in the student's process,
so that breakpoint() stops and print shows; labelled as not a grade."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _debug(impl: Path, part: int, stdin: str = "", *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "autograder.debug", "--impl", str(impl), "--part", str(part), *extra],
                          cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=600, env=env)


def test_breakpoint_in_a_stub_stops_and_print_works(tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(ROOT / "starter", mine)
    src = (mine / "flash_forward.py").read_text()
    stub = "    raise NotImplementedError\n"
    assert src.count(stub) == 1
    (mine / "flash_forward.py").write_text(src.replace(stub, "    print('q is', tuple(q.shape))\n    breakpoint()\n" + stub))
    r = _debug(mine, 2, "p q.dtype\nc\n")
    out = r.stdout
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NOT A GRADE" in out
    assert "q is (1, 8)" in out, "print in student code shows (the first failing case: N = 1, d = 8)"
    assert "(Pdb)" in out and "torch.float32" in out, "breakpoint() stopped and pdb evaluated a command"
    here = out.split("case:", 1)[1]  # after the grader's run (where breakpoint() does end in BdbQuit)
    assert "BdbQuit" not in here + r.stderr
    assert "mine/flash_forward.py" in out, "the traceback goes through the student's own file"


def test_a_wrong_result_shows_the_check_and_a_passing_part_has_nothing_to_debug(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    for f in (ROOT / "solutions").glob("*.py"):
        shutil.copy(f, mine / f.name)
    r = _debug(mine, 1)
    assert r.returncode == 0 and "every public test passes" in r.stdout, r.stdout[-2000:]
    src = (mine / "online_softmax.py").read_text()
    # a classic bug: the naive softmax divides by the max instead of the sum
    broken = src.replace("### BEGIN SOLUTION\n    e = torch.exp(x)\n", "### BEGIN SOLUTION\n    e = torch.exp(x) * 2\n", 1)
    if broken == src:  # the solution's exact text differs: break the safe softmax through its call
        broken = src.replace("def naive_softmax(x: torch.Tensor) -> torch.Tensor:\n",
                             "def naive_softmax(x: torch.Tensor) -> torch.Tensor:\n    return x\n", 1)
    assert broken != src
    (mine / "online_softmax.py").write_text(broken)
    r = _debug(mine, 1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the check fails here too" in r.stdout and "NOT A GRADE" in r.stdout, r.stdout[-2000:]


def test_a_bad_part_is_one_line():
    r = _debug(ROOT / "starter", 9)
    assert r.returncode == 2 and r.stderr.strip() == "error: there is no part 9; parts: 1, 2, 3, 4, 5, 6"
