"""The five lecture programs in the student release: on the starter (no crash, one line per part
that is not implemented yet, the other demos run) and on the solutions copied in (every demo runs,
the figures come out)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from instructor.release import build
from lecture_programs import run_program

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ["01_attention.py", "02_softmax.py", "03_flash_on_gpusim.py", "04_backward.py", "05_inference.py"]
FIGURES = ["owner_head.png", "lookup_head.png", "roofline.png"]
MISSING = re.compile(r"^part (\d) is not implemented yet: make grade PART=\1$", re.M)
# The parts each program reaches first on the starter (the first call of each demo that fails).
FIRST_MISSING = {"01_attention.py": {2}, "02_softmax.py": {1}, "03_flash_on_gpusim.py": {3},
                 "04_backward.py": {2, 4}, "05_inference.py": {5}}
DEMOS = {"01_attention.py": 4, "02_softmax.py": 4, "03_flash_on_gpusim.py": 4, "04_backward.py": 5, "05_inference.py": 4}


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release-programs") / "student-repo"
    build(out)
    for f in FIGURES:
        (out / "code" / "lecture05" / "figures" / f).unlink(missing_ok=True)  # the runs must write them
    return out


@pytest.mark.parametrize("program", PROGRAMS)
def test_on_the_starter_each_missing_part_is_one_line_and_the_program_goes_on(release, program):
    out = run_program(program, root=release)  # no --impl: the release's default is starter/
    assert out.startswith("implementation: starter/"), out[:200]
    lines = MISSING.findall(out)
    assert len(lines) == len(set(lines)), f"one line per missing part: {lines}"
    assert {int(p) for p in lines} == FIRST_MISSING[program], out[-2000:]
    assert "Traceback" not in out and "NotImplementedError" not in out
    for n in range(1, DEMOS[program] + 1):
        assert f"Demo {n}" in out, f"demo {n}'s heading is printed (the demos that need no student code run)"


@pytest.mark.parametrize("program", PROGRAMS)
def test_on_the_solutions_every_demo_runs(release, program):
    mine = release / "mine"
    if not mine.is_dir():
        mine.mkdir()
        for f in (ROOT / "solutions").glob("*.py"):
            shutil.copy(f, mine / f.name)
    # 05 takes the folder from the environment, the others from the flag: both ways are used
    out = (run_program(program, root=release, env={"LECTURE_IMPL": "mine"}) if program == "05_inference.py"
           else run_program(program, "--impl", "mine", root=release))
    assert out.startswith("implementation: mine/"), out[:200]
    assert not MISSING.findall(out), out[-2000:]
    for n in range(1, DEMOS[program] + 1):
        assert f"Demo {n}" in out
    if program == "03_flash_on_gpusim.py":  # the last program that writes a figure: all are there
        for f in FIGURES:
            png = release / "code" / "lecture05" / "figures" / f
            assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f


def test_a_folder_that_is_not_there_is_one_line(release):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "code/lecture05/02_softmax.py", "--impl", "nowhere"], cwd=release,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]
    assert "nowhere is not a folder" in proc.stderr
