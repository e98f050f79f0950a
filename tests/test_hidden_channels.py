"""Hidden tests stay hidden: a probe submission spells each hidden input in every string it can
choose (exception class name and message, qualname, file name, line number, the type name of a
non-plain return value, sys.exit's argument, a signal, an exit status, printed output) and fails
each hidden case in another way, and none of it reaches the report, the feedback or results.json:
every hidden failure reads the same (runner.hidden_verdict). The same probe graded with redaction
off shows that each channel carries the input, so the test can fail."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autograder.engine import grade
from autograder.engine.runner import HIDDEN_ERROR_PREFIX, hidden_verdict, student_view

SECRET = 7130  # hidden case k passes the input SECRET + k; the probe spells it as ZQX7130+k

TESTS = '''
import pytest
import torch

from autograder.engine.cases import cases
from autograder.engine.checks import check_close

pytestmark = pytest.mark.part1


@cases(0)
def test_probe(student, case):
    """naive_softmax(x) against float64 softmax."""
    x = torch.full((2, 3), float(case))
    out = student.call("online_softmax.naive_softmax", x)
    check_close(out, torch.softmax(x.double(), -1), what="naive_softmax(x)", inputs={"x": x},
                plain=torch.softmax(x, -1))
'''

HIDDEN = f"HIDDEN = {{'test_probe': [{SECRET} + k for k in range(10)]}}\n"

PROBE = '''
import os, signal, sys
import torch


def naive_softmax(x):
    s = int(x.flatten()[0].item())
    if s == 0:
        return torch.softmax(x, -1)  # the public case passes
    mode, tag = s % 10, f"ZQX{s}"
    print(tag, file=sys.stderr)
    if mode == 0:
        raise type(tag, (Exception,), {})(f"{tag} in /tmp/{tag}.py")  # class name, message, a path
    if mode == 1:
        def f():
            raise ValueError("x")
        f.__code__ = f.__code__.replace(co_qualname=tag, co_name=tag)  # qualname
        f()
    if mode == 2:
        exec(compile("raise RuntimeError('x')", f"/leak/{tag}.py", "exec"), globals())  # file name
    if mode == 3:
        exec(compile("\\n" * s + "raise RuntimeError('x')", "f.py", "exec"), globals())  # line number
    if mode == 4:
        return type(tag, (), {})()  # the type name of a value that is not plain data
    if mode == 5:
        raise MemoryError(tag)
    if mode == 6:
        sys.exit(tag)
    if mode == 7:
        return tag  # a returned string (the check describes what it got)
    if mode == 8:
        os.kill(os.getpid(), signal.SIGUSR1 if s % 2 else signal.SIGUSR2)  # a signal number
    os._exit(s % 256)  # an exit status
'''


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    (root / "tests").mkdir()
    (root / "tests" / "test_part1_probe.py").write_text(TESTS)
    (root / "hidden").mkdir()
    (root / "hidden" / "part1_probe.py").write_text(HIDDEN)
    (root / "impl").mkdir()
    (root / "impl" / "online_softmax.py").write_text(PROBE)
    kw = dict(parts=[1], test_sets=("public", "hidden"), tests_dir=root / "tests", hidden_dir=root / "hidden",
              limits={"max_losses": 4, "call_timeout_s": 20})
    return {"redacted": grade(root / "impl", **kw), "open": grade(root / "impl", redact_sets=(), **kw)}


def _hidden(report: dict) -> list[dict]:
    return [t for t in report["tests"] if t["set"] == "hidden"]


def test_the_probe_really_spells_the_inputs_when_nothing_is_redacted(graded):
    tests = _hidden(graded["open"])
    assert len(tests) == 10 and not any(t["outcome"] == "passed" for t in tests)
    text = json.dumps(tests)
    leaked = set(re.findall(r"ZQX(\d+)", text))
    assert len(leaked) >= 6, text  # class name, qualname, file name, type name, exit, returned string ...
    assert "signal" in text and "status" in text


def test_a_hidden_failure_shows_only_text_the_judge_wrote(graded):
    report = graded["redacted"]
    tests = _hidden(report)
    assert len(tests) == 10 and all(t["outcome"] != "passed" for t in tests)
    uniform = hidden_verdict("naive_softmax(x) against float64 softmax.", None)
    for t in tests:
        assert t["message"] == uniform["message"] and t["outcome"] == "failed", t
        assert "output" not in t
    dumped = json.dumps(report)
    assert "ZQX" not in dumped and "SIGUSR" not in dumped and "signal" not in dumped
    first = report["parts"][0]["first_failure"]
    assert first["set"] == "hidden" and "function" not in first and "ZQX" not in json.dumps(first)
    assert {k: first[k] for k in ("kind", "what", "hint", "message")} == uniform


def test_how_a_hidden_test_failed_is_not_shown(graded):
    """Ten hidden cases, ten ways to fail (exceptions, a wrong type, exit, signals, a timeout's kin):
    a submission that chose among them by its inputs would send bits out. The student's view tells
    them apart by nothing but the test's number, and says nothing of hidden tests that could not run."""
    view = student_view(graded["redacted"])
    tests = _hidden(view)
    # one entry for the test function: which of its cases failed is not shown, only how many
    assert len(tests) == 1 and tests[0]["cases"] == 10 and tests[0]["passed"] == 0, tests
    assert "[" not in tests[0]["id"] and tests[0]["message"] == _hidden(graded["redacted"])[0]["message"]
    assert "[" not in view["parts"][0]["first_failure"]["test"]
    assert view["parts"][0]["status"] == "failed"
    assert not any(e.startswith(HIDDEN_ERROR_PREFIX) or "hidden" in e for e in view["errors"]), view["errors"]
    open_kinds = {t["message"].splitlines()[0] for t in _hidden(graded["open"])}
    assert len(open_kinds) >= 5, open_kinds  # unredacted, the ways differ: the test can fail


def test_the_channels_render_no_hidden_input(graded):
    from instructor import intake
    from instructor.grading import Options, feedback_markdown, result
    from instructor.gradescope.results import results_json

    sub = intake.Submission(name="probe", source="probe", files={"online_softmax.py": "0" * 64})
    g = result(sub, graded["redacted"], None, Options(parts=[1]))
    md = feedback_markdown(g)
    res = results_json(g.view, notes=g.view["intake"]["notes"])
    shown = md + res["output"] + json.dumps([t["output"] for t in res["tests"]])
    assert "ZQX" not in shown and not re.search(str(SECRET)[:3], shown)


def test_every_graded_test_says_what_it_checks():
    """A hidden failure shows its test's docstring as what was checked: every test function has one."""
    import ast

    tests_dir = Path(__file__).resolve().parents[1] / "autograder" / "tests"
    missing = [f"{path.name}::{node.name}" for path in sorted(tests_dir.glob("test_part*.py"))
               for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and not ast.get_docstring(node)]
    assert missing == []


DIAGNOSED_TESTS = '''
import pytest
import torch

from autograder.engine.cases import cases
from autograder.engine.checks import check_close

pytestmark = pytest.mark.part1


def diagnosis(student):
    x = torch.zeros(2, 3)  # a fixed probe input of the judge
    out = student.call("online_softmax.naive_softmax", x)
    return "the probe is right" if torch.allclose(out, torch.softmax(x, -1)) else "the probe is wrong"


@cases(0, diagnosis=diagnosis)
def test_probe(student, case):
    """naive_softmax(x) against float64 softmax."""
    x = torch.full((2, 3), float(case))
    check_close(student.call("online_softmax.naive_softmax", x), torch.softmax(x.double(), -1),
                what="naive_softmax(x)", plain=torch.softmax(x, -1))
'''

CRASH_OR_WRONG = '''
import os
import torch

HOW = {how!r}


def naive_softmax(x):
    s = int(x.flatten()[0].item())
    if s == 0:
        return torch.softmax(x, -1)
    if HOW == "crash":
        os._exit(9)  # every hidden call: the part runs out of losses
    return torch.zeros_like(x)
'''


@pytest.mark.parametrize("how", ["crash", "wrong"])
def test_crashing_hidden_calls_do_not_change_the_diagnosis(tmp_path, how):
    """The diagnoses run before the hidden tests, with a loss budget of their own: a submission that
    crashes hidden calls on purpose (or not) cannot make a diagnosis give up, which would be one more
    bit chosen on hidden inputs."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_part1_probe.py").write_text(DIAGNOSED_TESTS)
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "part1_probe.py").write_text("HIDDEN = {'test_probe': [1, 2, 3, 4]}\n")
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "online_softmax.py").write_text(CRASH_OR_WRONG.format(how=how))
    report = grade(tmp_path / "impl", parts=[1], test_sets=("public", "hidden"), tests_dir=tmp_path / "tests",
                   hidden_dir=tmp_path / "hidden", limits={"max_losses": 3})
    hidden = _hidden(student_view(report))
    assert [(t["outcome"], t["cases"], t["passed"]) for t in hidden] == [("failed", 4, 0)]
    assert {t["message"] for t in hidden} == {hidden_verdict("naive_softmax(x) against float64 softmax.",
                                                             "the probe is right")["message"]}


def test_the_starter_with_hidden_tests_is_not_implemented():
    """The status comes from the tests that show their kind (public); hidden ones only must not pass."""
    root = Path(__file__).resolve().parents[1]
    report = grade(root / "starter", parts=[1], test_sets=("public", "hidden"))
    assert report["parts"][0]["status"] == "not_implemented", report["parts"][0]


def test_an_edited_hidden_cases_file_is_read_again(tmp_path):
    """Hidden cases are loaded once per version of their file, not once per process."""
    import os

    from autograder.engine.cases import hidden_cases

    f = tmp_path / "part1_probe.py"
    f.write_text("HIDDEN = {'test_probe': [1]}\n")
    assert hidden_cases(f) == {"test_probe": [1]}
    f.write_text("HIDDEN = {'test_probe': [1, 2]}\n")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert hidden_cases(f) == {"test_probe": [1, 2]}
    assert hidden_cases(tmp_path / "missing.py") == {}


def _sandboxes() -> list[str]:
    from instructor.sandbox import detect

    box = detect()
    return ["none"] + ([box.kind] + (["uid"] if box.kind == "bubblewrap" else []) if box.isolating else [])


@pytest.mark.parametrize("mode", _sandboxes())
def test_the_view_is_the_same_whatever_the_hidden_inputs(mode, tmp_path):
    """Graded twice, with the real hidden cases and with every hidden Nq one larger, a submission that
    carries what it saw from a hidden worker to later workers (SysV IPC, files, the fork server) must
    show the same view, with no sandbox and in each instructor sandbox: its hidden inputs never reach
    it. The attack of instructor/redteam/leak_hidden_via_sysv_ipc does exactly that."""
    import shutil

    from instructor import redteam
    from instructor.sandbox import detect

    redteam.assemble(tmp_path / "corpus")
    sub = tmp_path / "corpus" / "leak_hidden_via_sysv_ipc"
    real = Path(__file__).resolve().parents[1] / "instructor" / "hidden_tests"
    shifted = tmp_path / "shifted"
    shutil.copytree(real, shifted)
    with (shifted / "part2_flash_forward.py").open("a") as f:
        f.write("\nimport dataclasses as _dc\nHIDDEN = {name: [_dc.replace(c, nq=c.nq + 1) for c in cases] "
                "for name, cases in HIDDEN.items()}\n")
    views = []
    for hidden in (real, shifted):
        box = detect(mode).with_uid(None) if mode != "none" else None
        report = grade(sub, parts=[2], test_sets=("public", "hidden"), hidden_dir=hidden, worker_prefix=box)
        views.append([{k: t[k] for k in ("id", "outcome", "message")} for t in _hidden(student_view(report))])
        sweep = getattr(box, "sweep", None)
        if callable(sweep):
            sweep()
    assert views[0] and all(t["outcome"] == "failed" for t in views[0])
    assert views[0] == views[1]


def test_every_diagnosis_finds_nothing_in_the_solutions(monkeypatch):
    """The diagnoses run on every grade with hidden tests; on the solutions each must run and find no
    failing probe (a ladder that cannot call the student would name a bug that is not there)."""
    from autograder.engine import runner
    from autograder.tests import probes

    seen: dict = {}
    real = runner.GradingPlugin.run_diagnoses

    def spy(self):
        real(self)
        seen.update(self.hints)

    monkeypatch.setattr(runner.GradingPlugin, "run_diagnoses", spy)
    report = grade(Path(__file__).resolve().parents[1] / "solutions", test_sets=("public", "hidden"))
    assert report["total"] == report["max_total"]
    assert len(seen) >= 13 and all(h and h.startswith(probes.NEUTRAL) for h in seen.values()), seen
