"""Red team: every attack of instructor/redteam graded in ONE sandboxed batch with honest submissions.

The batch is the real one (instructor.batch: intake, judges, engine, sandbox). To keep it within
the test budget it grades part 1 only, with the small test module of autograder_minitests.py (three
tests calling naive_softmax and merge_partial through the engine's `student` proxy) instead of the
full public suite: the attacks hook every part-1 function, so any test that calls one triggers
them, and what is under test is the isolation, not the test coverage.
Limits are small (2 s per call, 1 GiB, one loss per part) so that hostile submissions end quickly.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from instructor import redteam
from instructor.batch import Options, run_batch
from instructor.sandbox import detect
from autograder_minitests import write_mini_tests

ROOT = Path(__file__).resolve().parent.parent
LIMITS = {"call_timeout_s": 2, "memory_mb": 1024, "max_losses": 1, "startup_timeout_s": 60}
HONEST = ("honest_solutions", "honest_starter", "honest_wrong")
LISTEN_PORT = 47613  # the network attack tries this local port (see instructor/redteam/network)



def _snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file of the instructor's tree that grading must never touch."""
    out = {}
    for top in ("solutions", "starter", "autograder", "course", "docs", "code", "tests", "instructor"):
        for f in sorted((root / top).rglob("*")) if (root / top).exists() else []:
            if f.is_file() and "__pycache__" not in f.parts and f.stat().st_size < 50 << 20:
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    for f in ("Makefile", "README.md", "pyproject.toml", "requirements.txt"):
        if (root / f).is_file():
            out[f] = hashlib.sha256((root / f).read_bytes()).hexdigest()
    return out


class _Listener:
    """Counts connections to 127.0.0.1:LISTEN_PORT while the batch runs (the network attack's target)."""

    def __init__(self) -> None:
        self.connections = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("127.0.0.1", LISTEN_PORT))
        except OSError:
            self.sock.close()
            self.sock = None
            return
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        if self.sock:
            self.stop = True
            self.thread.join(2)
            self.sock.close()


# The corpus is graded in the strongest sandbox of this machine and, where that is bubblewrap, again
# with bubblewrap made unavailable (the unprivileged-uid sandbox of Gradescope and CI containers):
# every test below must hold in both.
MODES = ["auto"] + (["uid"] if detect().kind == "bubblewrap" else [])


@pytest.fixture(scope="module", params=MODES)
def red(request, tmp_path_factory):
    mode = request.param
    base = tmp_path_factory.mktemp(f"redteam-{mode}")
    subs = base / "submissions"
    corpus = redteam.assemble(subs)
    for name, spec in list(corpus.items()):  # attacks on parts 2-6 need their part's real tests (test_redteam_kernel.py, test_redteam_measurement.py)
        if spec["kind"] == "attack" and spec.get("part") != 1:
            shutil.rmtree(subs / name)
            corpus.pop(name)
    box = detect(mode)
    # "needs = bubblewrap" in an ATTACK.toml: the defence needs an isolating sandbox (bubblewrap or
    # the unprivileged-uid one)
    have = {"bubblewrap": box.isolating, "process_limit": "seccomp" in box.process_limit or box.uid is not None}
    skipped = {}
    for name, spec in list(corpus.items()):
        if spec.get("suite") == "measurement":  # graded with the real tests: tests/test_redteam_measurement.py
            shutil.rmtree(subs / name)
            corpus.pop(name)
            continue
        if not have.get(spec.get("needs", ""), True):
            # undefended here (e.g. rlimits-only: no private file system, no network namespace): the
            # attack would succeed, and some would scribble on this machine, so it is not run
            shutil.rmtree(subs / name)
            skipped[name] = corpus.pop(name)
    tests_dir = write_mini_tests(base / "tests")
    options = dict(parts=[1], test_sets=("public",), limits=LIMITS, tests_dir=str(tests_dir))
    before = _snapshot(ROOT)
    listener = _Listener()
    try:
        summary = run_batch(subs, base / "out", jobs=2, options=Options(**options), progress=False, sandbox=mode,
                            allow_weak=True)
    finally:
        listener.close()
    after = _snapshot(ROOT)
    alone_subs = base / "alone-submissions"
    alone_subs.mkdir()
    for name in HONEST:
        shutil.copytree(subs / name, alone_subs / name)
    # graded alone, in this process (jobs=0): the same engine, sandbox and limits, no other submission
    alone = run_batch(alone_subs, base / "alone", jobs=0, options=Options(**options), progress=False, sandbox=mode,
                      allow_weak=True)

    def view(out: str, name: str) -> dict:
        return json.loads((base / out / name / "feedback.json").read_text())

    return {"base": base, "corpus": corpus, "skipped": skipped, "summary": summary, "alone": alone, "box": box,
            "before": before, "after": after, "listener": listener,
            "views": {n: view("out", n) for n in corpus}, "alone_views": {n: view("alone", n) for n in HONEST}}


def _points(v: dict) -> dict[int, float]:
    return {p["part"]: p["points"] for p in v["parts"]}


def test_the_batch_completes_with_every_submission(red):
    s = red["summary"]
    assert s["submissions"] == len(red["corpus"])
    rlimits_only = s["sandbox"].startswith("rlimits-only")
    for name, v in red["views"].items():
        # with bubblewrap every submission is graded; without it an attack may kill its own judge
        # (kill_judge), which the batch survives and records as "failed to grade" with 0 points
        allowed = {"graded"} if (not rlimits_only or name in HONEST) else {"graded", "failed to grade"}
        assert v["status"] in allowed, (name, v["status"])


def _attacks(red) -> dict[str, dict]:
    out = {n: s for n, s in red["corpus"].items() if s["kind"] == "attack"}
    isolation = {n for n, s in redteam.attacks().items() if s.get("suite") != "measurement" and s.get("part") == 1}
    assert len(out) + len(red["skipped"]) == len(isolation) >= 16
    return out


def test_each_attack_scores_no_more_than_the_honest_starter(red):
    starter = _points(red["views"]["honest_starter"])
    for name, spec in _attacks(red).items():
        got = _points(red["views"][name])
        for part, points in got.items():
            assert points <= starter[part], f"{name} got {points} on part {part}, the starter {starter[part]}"


def test_each_attack_gets_a_clear_reason(red):
    for name, spec in _attacks(red).items():
        v = red["views"][name]
        part = next(p for p in v["parts"] if p["part"] == spec["part"])
        text = " ".join([json.dumps(part["first_failure"]), *v["intake"]["notes"],
                         *(t["message"] for t in v["tests"] if t["part"] == spec["part"])]).lower()
        assert any(e.lower() in text for e in spec["expect"]), f"{name}: none of {spec['expect']} in {text[:400]}"


def test_honest_grades_are_the_same_as_graded_alone(red):
    for name in HONEST:
        assert _points(red["views"][name]) == _points(red["alone_views"][name]), name
    full = red["views"]["honest_solutions"]
    assert full["total"] == full["max_total"] > 0
    # the honest wrong answer loses merge_partial's test only (1 of 3 tests), so the comparison above
    # is made on a grade strictly between 0 and full marks
    wrong = red["views"]["honest_wrong"]["total"]
    assert 0 < wrong < full["max_total"]


def test_the_instructor_files_are_untouched(red):
    changed = sorted(k for k in set(red["before"]) | set(red["after"]) if red["before"].get(k) != red["after"].get(k))
    assert changed == []
    strays = [p for top in (ROOT, red["base"]) for p in top.rglob("pwned-redteam*") if ".venv" not in p.parts]
    assert strays == []
    for f in (red["base"] / "out").rglob("*"):  # what write_outside appends to every file it can open
        if f.is_file():
            assert "# pwned-redteam" not in f.read_text(errors="replace"), f


def _strings(x) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def test_nothing_secret_reaches_any_feedback(red):
    from instructor.release import canaries, solution_regions

    tests = ROOT / "autograder" / "tests"
    public = {" ".join(ln.split()) for f in [*(ROOT / "course").rglob("*.py"), *tests.rglob("*.py")]
              if "hidden" not in f.relative_to(ROOT).parts for ln in f.read_text().splitlines()}
    secrets = {" ".join(ln.split()) for f in sorted((tests / "hidden").glob("*.py")) for ln in f.read_text().splitlines()}
    secrets |= {ln for _, lines in solution_regions() for ln in lines}
    secrets = {s for s in secrets if len(s) >= 40 and s not in public} | set(canaries())
    assert secrets, "nothing to look for: no hidden tests or solution regions found"
    for f in sorted((red["base"] / "out").rglob("*")):
        if not f.is_file():
            continue
        raw = f.read_text(errors="replace")
        for text in _strings(json.loads(raw)) if f.suffix == ".json" else [raw]:
            flat = " ".join(text.split())
            leaked = [s for s in secrets if s in flat]
            assert not leaked, f"{f}: {leaked[:2]}"


def test_no_network_connection_left_the_sandbox(red):
    if not red["box"].isolating:
        pytest.skip(f"no network defence without an isolating sandbox ({red['box'].mode})")
    if red["listener"].sock is None:
        pytest.skip(f"port {LISTEN_PORT} busy: cannot observe the attack's connection attempts")
    assert red["listener"].connections == 0


def test_every_attack_ran_or_is_reported_undefended(red):
    if red["skipped"]:
        pytest.skip(f"not defended without bubblewrap ({red['box'].mode}), not run: {sorted(red['skipped'])}")
    # the isolation attacks (part 1); measurement attacks and other parts have their own tests
    isolation = [n for n, s in redteam.attacks().items() if s.get("part") == 1 and s.get("suite") != "measurement"]
    assert len(_attacks(red)) == len(isolation)


def test_call_time_limits_were_scaled_from_the_reference(red):
    limits = red["summary"]["call_time_limits"]
    assert limits["scaled"] is True and limits["targets"] >= 2, limits
    loop = red["views"].get("infinite_loop")
    if loop:  # the configured 2 s is below the floor: the smaller limit holds
        assert any("timed out after 2 s" in t["message"] for t in loop["tests"]), loop["tests"]


def test_every_result_says_which_sandbox_it_ran_in(red):
    mode = red["summary"]["sandbox"]
    assert mode == red["box"].mode and (mode == "bubblewrap" or mode.startswith(("unprivileged-uid (", "rlimits-only (")))
    for name, v in red["views"].items():
        if mode != "bubblewrap":
            assert v["sandbox"] == mode
        elif name == "honest_solutions":  # the reference's files: every part taken from the batch's store
            assert v["sandbox"] == "bubblewrap", v["sandbox"]  # (seeded by the calibration): no worker started
        elif name in HONEST:  # bubblewrap says how the workers started: forked inside the sandbox
            assert v["sandbox"] == "bubblewrap (workers forked from a fork server inside the sandbox)", v["sandbox"]
        else:  # or, where an attack broke its fork server, started directly (the same sandbox per worker)
            assert v["sandbox"] == "bubblewrap" or v["sandbox"].startswith("bubblewrap ("), v["sandbox"]
