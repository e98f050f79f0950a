"""bubblewrap's fork server (instructor/sandbox.py Sandbox.fork_server, autograder/engine/zygote.py):
one per submission, inside the sandbox; its workers are forked with torch imported, and nothing one
worker writes reaches the next, nor another submission.

A probe assignment (one part, public and hidden tests, written to a temp folder) grades a probe
submission through autograder.engine.grade with a bubblewrap Sandbox as worker_prefix. The judge
tests run in this process, so they hand what the workers reported to the test below through files.
"""
from __future__ import annotations

import json
import os
import select
import signal
import textwrap
from pathlib import Path

import pytest

from autograder.engine import grade, processes
from autograder.engine import zygote as zygote_module
from instructor import sandbox
from instructor.sandbox import SERVER_SCRATCH, detect

RUBRIC = """
[limits]
call_timeout_s = 20
max_losses = 99

[[part]]
number = 1
name = "Probe"
points = 10
marker = "part1"
files = ["probe.py"]
"""

# {out} is replaced by a folder of this test: each judge test saves what its worker said there
TESTS = '''
import json
from pathlib import Path

import pytest

from autograder.engine.cases import cases

pytestmark = pytest.mark.part1
OUT = Path({out!r})


def save(name, value):
    (OUT / f"{{name}}.json").write_text(json.dumps(value))


def test_public_writes(student):
    save("public_where", student.call("probe.where"))
    save("public_write", student.call("probe.write", "public"))
    save("public_look_same_worker", student.call("probe.look"))  # the look finds what is there


def diagnose(student):  # runs before the hidden tests (in the public worker), as hidden failures' diagnosis
    save("diagnosis_where", student.call("probe.where"))
    save("diagnosis", student.call("probe.look"))
    return None


@cases(diagnosis=diagnose)
def test_hidden(student, case):
    if case == "write_and_die":
        student.call("probe.write_and_die", "hidden")  # the worker exits (replaced); the test fails
    else:
        save(case + "_where", student.call("probe.where"))
        save(case, student.call("probe.look"))
'''

# the diagnosis looks first (in the public worker, before any hidden test); the first hidden worker
# looks (for the public worker's files), writes everywhere it can, dies; the next one looks
HIDDEN = 'HIDDEN = {"test_hidden": ["look_first", "write_and_die", "look_after"]}\n'

PROBE = '''
import os

MARK = "fbmark"
KEY = 0x5EED
SHALLOW = ["/", "/dev", "/var"]  # listed, not walked (/usr is below /)
DEEP = ["/scratch", "/tmp", "/dev/shm", "/var/tmp", "/run"]


def _libc():
    c = __import__("c" + "types")  # dodges the static check on purpose: this probe is the attacker
    return c.CDLL(None, use_errno=True)


def _places():
    return {"scratch": os.environ.get("TMPDIR", "/tmp"), "home": os.environ.get("HOME", "/"),
            "scratch_root": "/scratch", "tmp": "/tmp", "dev_shm": "/dev/shm", "root": "/", "dev": "/dev",
            "var_tmp": "/var/tmp", "cwd": os.getcwd()}


def where():
    with open("/proc/1/cmdline", "rb") as f:
        init = f.read().decode(errors="replace")
    with open("/proc/1/stat") as f:
        started = f.read().rsplit(")", 1)[1].split()[19]  # PID 1's start time: which server, or sandbox
    return {"ppid": os.getppid(), "init": init, "scratch": os.environ.get("TMPDIR"), "cwd": os.getcwd(),
            "server": started}


def write(tag):
    done = {}
    for name, d in _places().items():
        try:
            with open(os.path.join(d, f"{MARK}-{tag}-{name}"), "w") as f:
                f.write(tag)
            done[name] = True
        except OSError:
            done[name] = False
    try:
        os.makedirs(os.path.join(_places()["scratch"], "deep", "er"))
        with open(os.path.join(_places()["scratch"], "deep", "er", f"{MARK}-{tag}-deep"), "w") as f:
            f.write(tag)
        os.chmod(os.path.join(_places()["scratch"], "deep"), 0)  # closed even to its owner
    except OSError:
        pass
    libc = _libc()
    done["msgget"] = libc.msgget(KEY, 0o1666) >= 0  # IPC_CREAT: a queue outlives its process
    done["semget"] = libc.semget(KEY + 1, 1, 0o1666) >= 0
    return done


def write_and_die(tag):
    write(tag)
    os._exit(3)


def look():
    found = []
    for top in SHALLOW:
        try:
            found += [os.path.join(top, n) for n in os.listdir(top) if MARK in n]
        except OSError:
            pass
    tops = DEEP + [_places()["scratch"], _places()["home"], os.getcwd()]
    for top in tops:
        for dirpath, dirs, files in os.walk(top):
            found += [os.path.join(dirpath, n) for n in dirs + files if MARK in n]
            if dirpath.count("/") > 12:
                dirs[:] = []
    libc = _libc()
    if libc.msgget(KEY, 0) >= 0:
        found.append("msg queue")
    if libc.semget(KEY + 1, 1, 0) >= 0:
        found.append("semaphore")
    return sorted(set(found))
'''


WORKERS = ("public_where", "look_first_where", "look_after_where")  # one per worker


def _bubblewrap():
    box = detect("bubblewrap")
    if box.kind != "bubblewrap":
        pytest.skip(f"bubblewrap is not available here: {box.mode}")
    return box


@pytest.fixture(scope="module")
def assignment(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("forkprobe")
    (root / "rubric.toml").write_text(RUBRIC)
    (root / "hidden").mkdir()
    (root / "hidden" / "part1_probe.py").write_text(HIDDEN)
    (root / "impl").mkdir()
    (root / "impl" / "probe.py").write_text(textwrap.dedent(PROBE))
    return {"root": root}


def _grade(assignment: dict, name: str, box, **kw) -> tuple[dict, dict]:
    """Grade the probe with `box`; returns (report, {saved name: what the worker said})."""
    out = assignment["root"] / name
    out.mkdir()
    tests = assignment["root"] / f"tests-{name}"
    tests.mkdir()
    (tests / "test_part1_probe.py").write_text(TESTS.format(out=str(out)))
    report = grade(assignment["root"] / "impl", rubric=assignment["root"] / "rubric.toml", tests_dir=tests,
                   hidden_dir=assignment["root"] / "hidden", test_sets=("public", "hidden"), worker_prefix=box,
                   **kw)
    return report, {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.fixture(scope="module")
def forked(assignment) -> dict:
    box = _bubblewrap().with_uid(64090)
    killed: list[int] = []
    saved = processes._kill_group
    processes._kill_group = lambda pid: (killed.append(pid), saved(pid))  # the judge's own kills
    try:
        report, said = _grade(assignment, "forked", box)
    finally:
        processes._kill_group = saved
    return {"box": box, "report": report, "said": said, "killed": killed}


def test_bubblewrap_workers_are_forked_from_a_server_inside_the_sandbox(forked):
    report, said = forked["report"], forked["said"]
    assert report["timing"]["worker_starts"] == 3  # public (then the diagnoses), first hidden, its replacement
    for name in WORKERS:
        where = said[name]
        assert where["ppid"] == 1 and "zygote.main()" in where["init"], where  # the server is PID 1
        assert where["scratch"].startswith(SERVER_SCRATCH + "/") and where["cwd"] == where["scratch"], where
    assert len({said[n]["scratch"] for n in WORKERS}) == 3  # a fresh scratch folder per worker
    # the diagnoses go on in the public worker, before any hidden test; one server for all of them
    assert said["diagnosis_where"] == said["public_where"]
    assert len({said[n]["server"] for n in WORKERS}) == 1
    assert forked["box"].mode_used() == "bubblewrap (workers forked from a fork server inside the sandbox)"
    # the judge never signals a forked worker by its number: that is a PID of the sandbox's namespace
    assert forked["killed"] == []


def test_a_forked_worker_can_write_only_its_scratch_and_no_ipc(forked):
    wrote = forked["said"]["public_write"]
    mine = ("scratch", "home", "cwd", "scratch_root")  # its folder on the scratch tmpfs, and that tmpfs
    assert all(wrote[k] for k in mine), wrote
    assert not any(v for k, v in wrote.items() if k not in mine), wrote  # / /tmp /dev/shm /dev, IPC objects
    # the look itself works: it finds what its own worker wrote
    assert any("fbmark-public-scratch" in p for p in forked["said"]["public_look_same_worker"])


def test_nothing_a_worker_writes_reaches_the_next_one(forked):
    said, report = forked["said"], forked["report"]
    assert said["look_first"] == []  # the public worker's files are gone before a hidden worker starts
    assert said["look_after"] == []  # and the hidden worker's (it wrote, then exited) before its replacement
    assert not any("hidden" in p for p in said["diagnosis"])  # the diagnosis, whose hint is shown, ran before
    outcomes = [(t["set"], t["outcome"]) for t in report["tests"]]
    assert outcomes == [("public", "passed"), ("hidden", "passed"), ("hidden", "failed"), ("hidden", "passed")]


def test_another_submission_gets_another_server(forked, assignment):
    """Two submissions never share a fork server: the second sees nothing of the first (whose
    public worker wrote its scratch, and whose server is gone with its sandbox)."""
    report, said = _grade(assignment, "second", _bubblewrap().with_uid(64091))
    assert said["look_first"] == [] and said["look_after"] == []
    assert not any("hidden" in p for p in said["diagnosis"])
    first = {forked["said"][n]["scratch"] for n in WORKERS}
    assert not first & {said[n]["scratch"] for n in WORKERS}
    assert not {forked["said"][n]["server"] for n in WORKERS} & {said[n]["server"] for n in WORKERS}


def test_a_server_that_fails_its_self_check_falls_back_to_direct_workers(assignment, monkeypatch):
    """Fail closed: a fork server whose sandbox leaves / writable refuses to serve; the submission's
    workers are then started directly, each in a sandbox of its own (today's bubblewrap workers),
    and the report's mode says so."""
    real = sandbox.Sandbox._bwrap_argv

    def leaky(self, paths, server=False):
        argv = real(self, paths, server)
        if server:
            i = next(i for i in range(len(argv)) if argv[i:i + 2] == ["--remount-ro", "/"])
            del argv[i:i + 2]
        return argv

    monkeypatch.setattr(sandbox.Sandbox, "_bwrap_argv", leaky)
    box = _bubblewrap().with_uid(64092)
    report, said = _grade(assignment, "fallback", box)
    assert box.mode_used().startswith("bubblewrap (workers started directly: the fork server failed its "
                                      "self-check: / is writable"), box.mode_used()
    for name in WORKERS:
        assert "zygote" not in said[name]["init"], said[name]  # bwrap's own init: a direct worker
    assert said["look_first"] == [] and said["look_after"] == []
    assert not any("hidden" in p for p in said["diagnosis"])  # the diagnosis ran before, in the public worker
    assert report["timing"]["worker_starts"] == 3


def test_the_wipe_empties_what_a_dead_worker_left_and_follows_no_link(tmp_path):
    top, outside = tmp_path / "scratch", tmp_path / "outside"
    top.mkdir()
    outside.mkdir()
    (outside / "keep").write_text("x")
    deep = top / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (top / "link").symlink_to(outside)
    (top / "a" / "link").symlink_to(outside / "keep")
    os.mkfifo(top / "fifo")
    os.chmod(top / "a" / "b", 0)
    os.chmod(top / "a", 0o100)
    assert zygote_module._wipe(str(top)) is None
    assert os.listdir(top) == [] and (outside / "keep").read_text() == "x"
    for i in range(5):
        (top / f"f{i}").write_text("x")
    assert "more than 3 files" in zygote_module._wipe(str(top), budget=3)  # the server then refuses to fork


def test_closing_a_submission_ends_its_sandbox_even_when_its_server_is_stuck(tmp_path):
    """The server is PID 1 of its sandbox under another uid, so bwrap's --die-with-parent does not
    reach it; the engine kills it by a pidfd (from bwrap's --info-fd), which ends every process
    of the sandbox, whether or not the server still reads its socket."""
    from autograder.engine.limits import Limits
    from autograder.engine.submission import prepare_submission

    box = _bubblewrap().with_uid(64093)
    sub = prepare_submission(sandbox.ROOT / "solutions", ["online_softmax.py"], tmp_path / "sub")
    pool = processes.WorkerPool(sub, ["online_softmax"], Limits(), box)
    try:
        pool.start()
        pool._worker.ready()
        server = pool._server
        assert server is not None and pool._worker.in_sandbox_server and server._pidfd is not None
        with open(f"/proc/self/fdinfo/{server._pidfd}") as f:
            pid = int(next(ln.split()[1] for ln in f if ln.startswith("Pid:")))
        watch = os.pidfd_open(pid)
        os.kill(pid, signal.SIGSTOP)  # a server that answers nothing any more
        pool._worker = None  # (its worker goes with the sandbox)
        server.close()
        assert select.select([watch], [], [], 30)[0] == [watch]  # it ended (a pidfd is readable then)
        os.close(watch)
    finally:
        pool.close()
        sub.cleanup()
