"""Engine self-tests: student code runs in a worker, and hostile code costs only its own test.

A tiny two-part "probe" assignment (rubric + judge tests) and submissions are written to a temp
folder, then graded through autograder.engine.grade exactly as the real assignment is. Hostile
submissions are built there from strings: a conftest.py under tests/ would be loaded by this very
test run.
"""
from __future__ import annotations

import ast
import pickle
import textwrap
from pathlib import Path

import pytest

from autograder.engine import grade
from autograder.engine.runner import hidden_verdict

REPO = Path(__file__).resolve().parent.parent

RUBRIC = """
[limits]
call_timeout_s = 2
max_losses = 99
memory_mb = 3072

[[part]]
number = 1
name = "Probe"
points = 10
marker = "part1"
files = ["probe.py"]
numpy_allowed = true

[[part]]
number = 2
name = "Other"
points = 10
marker = "part2"
files = ["other.py"]
"""

PUBLIC_TESTS = '''
import pytest, torch
from autograder.engine import check_close, check
pytestmark = pytest.mark.part1

HOSTILE = ["exit_", "osexit", "loop", "bigalloc", "segv", "flood", "fdwrite", "eq", "subfloat", "subtuple",
           "subtensor", "ok", "raise_", "numpy_file", "ok"]

@pytest.mark.parametrize("fn", HOSTILE)
def test_call(student, fn):
    out = student.call(f"probe.{fn}")
    check(out == 1.5 or (fn == "numpy_file" and "site-packages" in out), what=f"probe.{fn}() returns 1.5",
          detail=f"got {out!r}")

def test_add(student):
    x = torch.arange(6.0).reshape(2, 3)
    check_close(student.call("probe.add", x, 1.0), x.double() + 1, what="add(x, 1)", inputs={"x": x},
                hint="add one")
'''

PART2_TESTS = '''
import pytest
from autograder.engine import check
pytestmark = pytest.mark.part2

@pytest.mark.parametrize("n", [1, 2])
def test_other(student, n):
    check(student.call("other.double", n) == 2 * n, what="double(n)")
'''

HIDDEN_ONLY_TESTS = '''
from autograder.engine.cases import cases

@cases()  # hidden cases only
def test_hidden_add(student, case):
    """add(x, 1) on a hidden input."""
    x = torch.full((3,), float(case))
    check_close(student.call("probe.add", x, 1.0), x.double() + 2, what="add(x, 1) on a hidden input",
                inputs={"x": x}, hint="add one")

@cases()
def test_hidden_leak(student, case):
    """leak(x, how) returns."""
    student.call("probe.leak", torch.full((2,), 41.0), case)
'''

HIDDEN_CASES = '''
HIDDEN = {"test_hidden_add": [41, 43], "test_hidden_leak": ["raise", "exit"]}
'''

HOSTILE_PROBE = '''
import os, sys, torch

def exit_():
    sys.exit(3)

def osexit():
    os._exit(7)

def loop():
    while True:
        pass

def bigalloc():
    x = torch.empty(10 * 2**30, dtype=torch.uint8)
    x.fill_(1)
    return 1.5

def segv():
    c = __import__("c" + "types")  # dodges the static check on purpose: the worker must survive it
    c.string_at(0)

def flood():
    for _ in range(50):
        print("x" * (1 << 20))
    return 1.5

def fdwrite():
    os.write(1, b"garbage on fd 1 must not reach the protocol\\n")
    os.write(2, b"and fd 2 neither\\n")
    return 1.5

class Eq:
    def __eq__(self, other):
        return True

def eq():
    return Eq()

class F(float):
    def __eq__(self, other):
        return True

def subfloat():
    return F(2.0)

class T(tuple):
    def __eq__(self, other):
        return True

def subtuple():
    return T((1,))

class Liar(torch.Tensor):
    def __eq__(self, other):
        return True

def subtensor():
    return torch.zeros(3).as_subclass(Liar)

def ok():
    print("hello from ok")
    return 1.5

def raise_():
    raise ValueError("bad thing\\nsecond line")

def numpy_file():
    import numpy
    return numpy.__file__

def add(x, c):
    print("secret input", x.tolist())
    return x + c
'''

# the same names, all well-behaved: for tests about something else than hostile calls
BENIGN_PROBE = "\n".join(f"def {n}():\n    return 1.5\n" for n in (
    "exit_", "osexit", "loop", "bigalloc", "segv", "flood", "fdwrite", "eq", "subfloat", "subtuple", "subtensor",
    "ok", "raise_")) + '''
def numpy_file():
    import numpy
    return numpy.__file__

def add(x, c):
    print("secret input", x.tolist())
    return x + c

def leak(x, how):
    import sys
    if how == "exit":
        sys.exit(f"the input was {x.tolist()}")
    raise ValueError(f"the input was {x.tolist()}")
'''

OTHER_OK = '''
def double(n):
    return 2 * n
'''


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("probe")
    write(root, {"rubric.toml": RUBRIC})
    write(root / "tests", {"test_part1_probe.py": PUBLIC_TESTS + HIDDEN_ONLY_TESTS, "test_part2_other.py": PART2_TESTS})
    write(root / "hidden", {"part1_probe.py": HIDDEN_CASES})
    return {"root": root, "rubric": root / "rubric.toml", "tests": root / "tests", "hidden": root / "hidden"}


def run(probe: dict, sub: Path, **kw) -> dict:
    return grade(sub, rubric=probe["rubric"], tests_dir=probe["tests"], hidden_dir=probe["hidden"], **kw)


def by_name(report: dict) -> dict[str, dict]:
    return {t["id"].split("::", 1)[1]: t for t in report["tests"]}


@pytest.fixture(scope="module")
def hostile_report(probe, tmp_path_factory) -> dict:
    sub = write(tmp_path_factory.mktemp("hostile"), {"probe.py": HOSTILE_PROBE, "other.py": OTHER_OK})
    return run(probe, sub)


EXPECTED = {
    "test_call[exit_]": "exit_ called sys.exit(3)",
    "test_call[osexit]": "worker exited with status 7 during probe.osexit",
    "test_call[loop]": "timed out after 2 s in probe.loop",
    "test_call[bigalloc]": "ran out of memory while allocating 10.0 GiB",
    "test_call[segv]": "worker crashed (signal 11, SIGSEGV) during probe.segv",
    "test_call[flood]": "printed more than 4 MB of output during probe.flood",
    "test_call[eq]": "not plain data",
    "test_call[subfloat]": "not plain data",
    "test_call[subtuple]": "not plain data",
    "test_call[subtensor]": "not plain data",
    "test_call[raise_]": "raise_ raised ValueError: bad thing (probe.py:",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_call_fails_with_a_one_line_reason(hostile_report, name):
    t = by_name(hostile_report)[name]
    assert t["outcome"] == "failed" and t["score"] == 0
    assert EXPECTED[name] in t["message"], t["message"]
    assert "\n" not in t["message"]


def test_hostile_calls_cost_only_their_own_test(hostile_report):
    tests = by_name(hostile_report)
    # the worker was replaced after each loss: every honest call after them still passes
    for name in ("test_call[ok0]", "test_call[ok1]", "test_call[fdwrite]", "test_add", "test_other[1]",
                 "test_other[2]", "test_call[numpy_file]"):
        assert tests[name]["outcome"] == "passed", (name, tests[name]["message"])
    assert hostile_report["errors"] == []
    assert hostile_report["timing"]["worker_starts"] >= 5  # osexit, loop, segv, flood each cost one worker


def test_output_is_captured_per_test_and_capped(hostile_report):
    tests = by_name(hostile_report)
    assert tests["test_call[ok0]"]["output"] == "hello from ok\n"
    assert "garbage on fd 1" in tests["test_call[fdwrite]"]["output"]  # fd-level writes land in the output
    assert len(tests["test_call[flood]"]["output"]) == 10_000  # rubric's output_keep_bytes


def test_submission_extras_are_ignored(probe, tmp_path):
    """conftest.py forcing passes, pytest.ini, sitecustomize.py, numpy.py, an __init__.py that exits:
    none of it is copied, imported or read, so the wrong answer still fails and numpy is the real one."""
    wrong = BENIGN_PROBE.replace("return x + c", "return x + c + 1")
    sub = write(tmp_path / "sub", {
        "probe.py": wrong, "other.py": OTHER_OK,
        "conftest.py": """
            import pytest
            @pytest.hookimpl(hookwrapper=True)
            def pytest_runtest_makereport(item, call):
                out = yield
                out.get_result().outcome = "passed"
        """,
        "pytest.ini": "[pytest]\naddopts = -p no:python\n",
        "sitecustomize.py": "import os; os._exit(9)\n",
        "usercustomize.py": "import os; os._exit(9)\n",
        "numpy.py": "import os; os._exit(9)\n",
        "__init__.py": "import os; os._exit(9)\n",
    })
    report = run(probe, sub, parts=[1])
    tests = by_name(report)
    assert tests["test_add"]["outcome"] == "failed"
    assert "add(x, 1)" in tests["test_add"]["message"] and "max abs error 1" in tests["test_add"]["message"]
    assert tests["test_call[numpy_file]"]["outcome"] == "passed"
    assert tests["test_call[ok0]"]["outcome"] == "passed"


def test_exit_at_import_costs_only_that_part(probe, tmp_path):
    sub = write(tmp_path / "sub", {"probe.py": BENIGN_PROBE, "other.py": "import os\nos._exit(5)\n"})
    report = run(probe, sub)
    parts = {p["part"]: p for p in report["parts"]}
    assert parts[2]["points"] == 0 and "worker exited with status 5" in parts[2]["first_failure"]["message"]
    assert by_name(report)["test_add"]["outcome"] == "passed"


def test_syntax_error_and_missing_file_are_one_line(probe, tmp_path):
    sub = write(tmp_path / "sub", {"probe.py": "def add(x, c)\n    return x\n"})
    report = run(probe, sub)
    tests = by_name(report)
    assert "importing probe.py failed: SyntaxError" in tests["test_add"]["message"]
    assert "(probe.py, line 1)" in tests["test_add"]["message"]  # no temp paths
    assert tests["test_other[1]"]["message"] == "other.py is missing from the submission"


def test_hidden_failures_are_named_but_not_revealed(probe, tmp_path):
    wrong = BENIGN_PROBE.replace("return x + c", "return x + c + 7")
    sub = write(tmp_path / "sub", {"probe.py": wrong, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], test_sets=("public", "hidden"))
    hidden = [t for t in report["tests"] if t["set"] == "hidden"]
    assert [t["id"] for t in hidden] == ["hidden/test_part1_probe.py::test_hidden_add[0]",
                                         "hidden/test_part1_probe.py::test_hidden_add[1]",
                                         "hidden/test_part1_probe.py::test_hidden_leak[0]",
                                         "hidden/test_part1_probe.py::test_hidden_leak[1]"]
    # only text the judge wrote, the same however each failed: no exception name or message, qualname,
    # file name, line, exit status, nor which check failed
    assert hidden[2]["message"] == hidden[3]["message"] == hidden_verdict("leak(x, how) returns.", None)["message"]
    assert hidden[0]["message"] == hidden[1]["message"] == hidden_verdict("add(x, 1) on a hidden input.", None)["message"]
    text = repr(hidden)
    for secret in ("41", "43", "secret", "(3,)"):
        assert secret not in text, secret
    assert all("output" not in t for t in hidden)  # the student printed the input
    assert "hint: add one" not in hidden[0]["message"]  # the check's own hint would tell the checks apart
    # unredacted for the instructor
    full = run(probe, sub, parts=[1], test_sets=("hidden",), redact_sets=())
    assert "hidden-41" in full["tests"][0]["id"] and "max abs error" in full["tests"][0]["message"]
    assert "the input was [41.0, 41.0]" in full["tests"][2]["message"]


def test_judge_never_unpickles(probe, tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the judge unpickled something")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    sub = write(tmp_path / "sub", {"probe.py": BENIGN_PROBE, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1])
    assert by_name(report)["test_add"]["outcome"] == "passed"
    engine = Path(__file__).resolve().parent.parent / "autograder" / "engine"
    for path in engine.glob("*.py"):  # no deserialiser that can run code is even imported
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])}
        assert not imported & {"pickle", "marshal", "dill", "cloudpickle", "shelve"}, path.name


def test_worker_prefix_is_used(probe, tmp_path):
    seen = []

    def prefix(paths: list[str]) -> list[str]:
        seen.append(paths)
        return ["env"]  # a real sandbox (bubblewrap) would bind these paths read-only

    sub = write(tmp_path / "sub", {"probe.py": BENIGN_PROBE, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[2], worker_prefix=prefix)
    assert report["total"] == 10
    assert seen and any(p.endswith("course") for p in seen[0])


# every graded name allocates 10 GiB: RLIMIT_AS (3 GiB in RUBRIC) refuses it at once with MemoryError
MEMORY_BOMB_PROBE = "\n".join(f"def {n}(*args):\n    import torch\n    torch.empty(10 * 2**30, dtype=torch.uint8)\n"
                              f"    return 1.5\n" for n in (
    "exit_", "osexit", "loop", "bigalloc", "segv", "flood", "fdwrite", "eq", "subfloat", "subtuple", "subtensor",
    "ok", "raise_", "numpy_file", "add"))


def test_memory_bomb_in_every_call_costs_at_most_max_losses_calls(probe, tmp_path):
    """Out of memory is a loss like a timeout: after max_losses of them the part's remaining calls are
    not made, and no worker is started after the last loss (the direct-start path, as in the sandbox,
    starts the spare eagerly, so a wasted start would show in worker_starts)."""
    sub = write(tmp_path / "sub", {"probe.py": MEMORY_BOMB_PROBE, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], limits={"max_losses": 2}, worker_prefix=["env"])
    tests = [t for t in report["tests"] if t["part"] == 1]
    assert len(tests) == 16  # 15 test_call + test_add, each one call
    assert report["timing"]["calls"] == 2  # calls actually sent to a worker
    assert report["timing"]["worker_starts"] == 2  # the first worker and one spare; none after the 2nd loss
    assert all(t["outcome"] == "failed" and "\n" not in t["message"] for t in tests)
    assert all("ran out of memory" in t["message"] for t in tests[:2]), [t["message"] for t in tests[:2]]
    assert all(t["message"] == "not run: in part 1, 2 earlier calls were lost (ran out of memory 2×)"
               for t in tests[2:]), {t["message"] for t in tests[2:]}
    assert report["errors"] == []


def test_memory_bomb_at_import_counts_as_a_loss(probe, tmp_path):
    """A graded file whose import runs out of memory is re-imported by every call: a loss too."""
    sub = write(tmp_path / "sub", {"probe.py": "import torch\n_hog = torch.empty(10 * 2**30, dtype=torch.uint8)\n",
                                   "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], limits={"max_losses": 2})
    assert report["timing"]["calls"] == 2
    tests = [t for t in report["tests"] if t["part"] == 1]
    assert tests[0]["message"].startswith("importing probe.py failed: ran out of memory while allocating 10.0 GiB"), \
        tests[0]["message"]
    assert tests[-1]["message"] == "not run: in part 1, 2 earlier calls were lost (ran out of memory 2×)", \
        tests[-1]["message"]


def test_a_reply_larger_than_the_cap_costs_the_call_unread(probe, tmp_path):
    """The judge refuses a reply over limits.reply_cap_mb from its length prefix, before reading it:
    two large replies once raised the judge from 0.26 GB to 4.4 GB."""
    big = BENIGN_PROBE.replace("def ok():\n    return 1.5\n", "def ok():\n    return 'x' * (3 << 20)\n")
    sub = write(tmp_path / "sub", {"probe.py": big, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], limits={"reply_cap_mb": 1})
    oks = [t for name, t in by_name(report).items() if name.startswith("test_call[ok")]
    assert oks and all(t["outcome"] == "failed" for t in oks), oks
    message = oks[0]["message"]
    assert "probe.ok returned 3 MB of data; a reply may hold at most 1 MB" in message and "\n" not in message
    assert by_name(report)["test_add"]["outcome"] == "passed"  # the next call gets a fresh worker


def test_a_call_time_limit_from_call_timeouts(probe, tmp_path):
    """limits.call_timeouts (the batch scales them from the reference's own time) bounds one target's
    calls below call_timeout_s: a hanging call then costs a fraction of the default limit."""
    hang = BENIGN_PROBE.replace("def loop():\n    return 1.5\n", "def loop():\n    while True:\n        pass\n")
    sub = write(tmp_path / "sub", {"probe.py": hang, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], limits={"call_timeouts": {"probe.loop": 0.5}})
    assert "timed out after 0.5 s in probe.loop" in by_name(report)["test_call[loop]"]["message"]
    assert by_name(report)["test_call[eq]"]["outcome"] == "passed"


class _SweepingPrefix:
    """A worker prefix (no confinement) that counts the sandbox's sweeps."""

    def __init__(self) -> None:
        self.sweeps = 0

    def __call__(self, paths) -> list[str]:
        return []

    def sweep(self) -> list[str]:
        self.sweeps += 1
        return []


def test_the_sandbox_is_swept_when_the_worker_changes_test_set(probe, tmp_path):
    """What a worker left in shared folders (uid mode: /tmp, /dev/shm, its scratch) is cleared before
    a worker of another test set starts: a hidden worker's files never reach a later worker."""
    sub = write(tmp_path / "sub", {"probe.py": BENIGN_PROBE, "other.py": OTHER_OK})
    prefix = _SweepingPrefix()
    report = run(probe, sub, parts=[1], test_sets=("public", "hidden"), worker_prefix=prefix)
    assert report["parts"][0]["total"] > 0
    assert prefix.sweeps >= 1


def test_unseeded_random_numbers_are_the_same_in_every_grading(probe, tmp_path):
    """Every request starts from the same random streams (torch, random, numpy), so a submission that
    draws unseeded numbers gets one grade, however often it is graded. Here add() is right only when
    its draws come out as after seed 0 (torch.rand() = 0.496..., random.random() = 0.844...)."""
    drawing = BENIGN_PROBE.replace("    return x + c", "    import random\n"
                                   "    return x + c + (float(torch.rand(())) > 0.5) + (random.random() < 0.5)")
    sub = write(tmp_path / "sub", {"probe.py": "import torch\n" + drawing, "other.py": OTHER_OK})
    outcomes = {by_name(run(probe, sub, parts=[1]))["test_add"]["outcome"] for _ in range(3)}
    assert outcomes == {"passed"}


def _solutions_with_a_hanging_online_summary(sub: Path) -> Path:
    """The solutions, with an online_summary that never returns (every other function correct)."""
    sub.mkdir()
    for f in (REPO / "solutions").glob("*.py"):
        (sub / f.name).write_text(f.read_text())
    src = (sub / "online_softmax.py").read_text()
    hang = src.replace('    m = torch.full(x.shape[:-1]', '    while True:\n        pass\n    m = torch.full(x.shape[:-1]', 1)
    assert hang != src
    (sub / "online_softmax.py").write_text(hang)
    return sub


def test_a_recorded_call_is_named_and_limited_by_the_students_function(tmp_path):
    """Recorded calls all go through the scenario tracing.call: their messages and their scaled time
    limits (Limits.call_timeouts, keyed by processes.call_label) name the student's function, so a
    hanging online_summary times out under its own limit and says so; the part's later calls say
    how the earlier ones were lost."""
    sub = _solutions_with_a_hanging_online_summary(tmp_path / "sub")
    report = grade(sub, parts=[1], limits={"call_timeouts": {"online_softmax.online_summary": 0.5},
                                                "max_losses": 2})
    msgs = [t["message"] for t in report["tests"] if "test_online_summary" in t["id"]]
    assert msgs[0] == "timed out after 0.5 s in online_softmax.online_summary", msgs[0]
    later = [t["message"] for t in report["tests"] if "test_online_softmax[" in t["id"]]
    assert later and all(m == "not run: in part 1, 2 earlier calls were lost (timed out 2×)" for m in later), later


def test_the_grade_budget_bounds_the_whole_grade(tmp_path):
    """Limits.grade_budget_s (Gradescope sets it inside its own timeout): no call runs past it, and
    the calls after it are not run, with that reason, so the report is always written in time."""
    import time

    sub = _solutions_with_a_hanging_online_summary(tmp_path / "sub")
    t0 = time.perf_counter()
    report = grade(sub, parts=[1, 6], limits={"grade_budget_s": 4.0})
    assert time.perf_counter() - t0 < 4.0 + 3.0  # the budget, plus start-up and the report
    by_test = {t["id"]: t for t in report["tests"]}
    summary = [t for i, t in by_test.items() if "test_online_summary[" in i]
    assert summary[0]["message"].startswith("timed out after "), summary[0]["message"]
    later = [t for i, t in by_test.items() if "test_part6" in i]
    assert later and all(t["message"] == "not run: the grade's time budget of 4 s is spent (earlier calls took it)"
                         for t in later), {t["message"] for t in later}


def test_a_part_budget_bounds_a_part_whose_calls_each_stay_under_their_limit(tmp_path):
    """An outside hostile student: every call slept just under its time limit, no call was lost, and part 1
    alone took 1233 s of the batch (the reference: 10 s). Limits.part_budgets bounds a part's tests,
    diagnoses and checks together: the calls after it are not run, with that reason, and other parts
    keep their own budgets; the report gives each part's own time (what the batch scales it from)."""
    import time

    sub = tmp_path / "sub"
    sub.mkdir()
    for f in (REPO / "solutions").glob("*.py"):
        (sub / f.name).write_text(f.read_text())
    src = (sub / "online_softmax.py").read_text()
    slow = src.replace("def safe_softmax(x: torch.Tensor) -> torch.Tensor:",
                       "def safe_softmax(x: torch.Tensor) -> torch.Tensor:\n    import time; time.sleep(0.4)", 1)
    assert slow != src
    (sub / "online_softmax.py").write_text(slow)
    t0 = time.perf_counter()
    report = grade(sub, parts=[1, 6], limits={"part_budgets": {"1": 3.0, "6": 60.0}})
    assert time.perf_counter() - t0 < 30
    tests = report["tests"]
    spent = [t for t in tests if t["part"] == 1 and "time budget of 3 s is spent" in t["message"]]
    assert spent and not any(t["outcome"] == "passed" for t in spent)
    assert all(t["outcome"] == "passed" for t in tests if t["part"] == 6), "part 6 keeps its own budget"
    assert set(report["timing"]["part_s"]) == {"1", "6"} and report["timing"]["part_s"]["1"] < 3.0 + 20


def test_a_reply_of_many_small_values_is_refused_before_it_is_parsed(probe, tmp_path):
    """The cap bounds a reply's bytes; json.loads makes up to ~50 bytes of Python objects per byte of
    nested brackets (a worker that padded its replies' headers to 64 MiB of them took the judge to
    5 GB). The judge counts the header's values first (protocol.json_values) and refuses a reply of
    more than the cap's worth (BYTES_PER_VALUE each), unparsed."""
    from autograder.engine import protocol

    with pytest.raises(protocol.TooManyValues):
        protocol.parse_body(b'{"pad":' + b"[" * 5000 + b"]" * 5000 + b"}", b"", max_values=1000)
    assert protocol.parse_body(b'{"x":[[],[]],"buffers":[]}', b"", max_values=10)[0]["x"] == [[], []]
    nested = BENIGN_PROBE.replace("def ok():\n    return 1.5\n", "def ok():\n    return [[[]]] * 4000\n")
    sub = write(tmp_path / "sub", {"probe.py": nested, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1], limits={"reply_cap_mb": 1})  # 8192 values at most
    oks = [t for name, t in by_name(report).items() if name.startswith("test_call[ok")]
    assert oks and all(t["outcome"] == "failed" for t in oks), oks
    message = oks[0]["message"]
    assert "more than the 8,192 a reply may hold" in message and "\n" not in message, message
    assert by_name(report)["test_add"]["outcome"] == "passed"  # the next call gets a fresh worker


def test_a_worker_starts_no_thread_once_student_code_can_run(probe, tmp_path):
    """Starting threads moves machine-wide counters (the next PID, the kernel's count of forks in /proc/stat)
    that a later worker can read: an outside attacker's hidden-test worker encoded the hidden inputs'
    shapes in how many threads it started, and a shown worker of the next submission printed them. The
    worker refuses new threads before any student code runs (confine.refuse_threads); the scenarios that
    run student code in a thread take one of the spares it made first (scenarios/threads.py)."""
    threads = BENIGN_PROBE.replace("def ok():\n    return 1.5\n", textwrap.dedent("""
        def ok():
            import threading
            try:
                threading.Thread(target=lambda: None).start()
            except RuntimeError:
                return 1.5  # refused
            return 0.0
        """))
    sub = write(tmp_path / "sub", {"probe.py": threads, "other.py": OTHER_OK})
    report = run(probe, sub, parts=[1])
    oks = [t for name, t in by_name(report).items() if name.startswith("test_call[ok")]
    assert oks and all(t["outcome"] == "passed" for t in oks), oks


def test_spare_threads_run_jobs_and_refuse_when_all_are_busy():
    import threading

    from autograder.scenarios import threads

    old = threads._jobs, threads._idle
    try:
        threads._jobs, threads._idle = None, 0
        threads.start(1)
        done, hold = threading.Event(), threading.Event()
        threads.run(done.set)
        assert done.wait(5)
        threads.run(hold.wait)  # a job that keeps its thread ...
        with pytest.raises(RuntimeError, match="every spare thread"):
            threads.run(done.set)  # ... leaves none for the next
        hold.set()
    finally:
        threads._jobs, threads._idle = old


def test_seccomp_active_tells_a_sandboxed_process_from_a_bare_one():
    """A worker whose kernel takes no thread filter fails only where a sandbox's filter is already there
    (worker.main): seccomp_active reads that from /proc/self/status."""
    import subprocess
    import sys

    from autograder.engine import confine

    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc")
    code = ("from autograder.engine import confine; a = confine.seccomp_active(); "
            "ok = confine.refuse_threads(); print(a, ok and confine.seccomp_active())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(confine.__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-500:]
    before, after = out.stdout.split()
    assert before == str(confine.seccomp_active()) and after == "True"


def test_the_thread_filter_covers_the_spare_threads_made_before_it():
    """An outside instructor found the spare threads (where part 1's counted student code runs) could still
    start threads: prctl's filter is the calling thread's alone. refuse_threads installs it on every
    thread of the process (seccomp's TSYNC)."""
    import subprocess
    import sys

    code = textwrap.dedent("""
        import threading, time
        from autograder.scenarios import threads
        from autograder.engine import confine
        threads.start(2)
        if not confine.refuse_threads():
            print("no-filter"); raise SystemExit
        said = {}
        def job():
            try:
                threading.Thread(target=lambda: None).start(); said["spare"] = "started"
            except RuntimeError:
                said["spare"] = "refused"
        threads.run(job)
        for _ in range(100):
            if "spare" in said:
                break
            time.sleep(0.05)
        print(said.get("spare"))
        """)
    from autograder.engine import confine

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(Path(confine.__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr[-500:]
    if out.stdout.strip() == "no-filter":
        pytest.skip("no syscall table for this machine")
    assert out.stdout.strip() == "refused", out.stdout
