"""bubblewrap's fork servers (instructor/sandbox.py Sandbox.fork_server, autograder/engine/zygote.py,
kept by autograder/engine/processes.py SandboxServers): inside the sandbox, kept by a judge across the
submissions it grades, one for the shown test sets and one for the hidden ones; its workers are forked
with torch imported, their graded files written into their scratch, and nothing one worker writes
reaches the next, nor another submission.

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
    save("public_look_before", student.call("probe.look"))
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
import re

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
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    return {"ppid": os.getppid(), "init": init, "scratch": os.environ.get("TMPDIR"), "cwd": os.getcwd(),
            "server": started, "module": __file__, "mounts": mounts}


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
    try:  # its own module: a forked worker's copy in its scratch; the judge's copy, bound read-only, otherwise
        with open(__file__, "a") as f:
            f.write(f"\\n# {MARK}-{tag}-own\\n")
        done["own"] = True
    except OSError:
        done["own"] = False
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
    with open(__file__) as f:  # what an earlier worker appended to its copy of this file
        found += [f"own file: {m}" for m in re.findall(MARK + r"-\\w+-own", f.read())]
    libc = _libc()
    if libc.msgget(KEY, 0) >= 0:
        found.append("msg queue")
    if libc.semget(KEY + 1, 1, 0) >= 0:
        found.append("semaphore")
    return sorted(set(found))


def poison():
    """Lower the fork server's (PID 1's) file-size limit and raise its nice value: every worker forked
    after that would get them, in every later submission (hence the filter, and the server's check)."""
    import resource

    done = {}
    for name, change in (("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))),
                         ("nice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))):
        try:
            change()
            done[name] = True
        except OSError:
            done[name] = False
    return done
'''

# a public test that tries to change its server's limits (probe.poison)
POISON_TESTS = '''
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.part1
OUT = Path({out!r})


def test_public_poisons(student):
    (OUT / "poison.json").write_text(json.dumps(student.call("probe.poison")))
    (OUT / "poison_where.json").write_text(json.dumps(student.call("probe.where")))
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


def _grade(assignment: dict, name: str, box, tests_text: str = TESTS, sets: tuple = ("public", "hidden"),
           **kw) -> tuple[dict, dict]:
    """Grade the probe with `box`; returns (report, {saved name: what the worker said})."""
    out = assignment["root"] / name
    out.mkdir()
    tests = assignment["root"] / f"tests-{name}"
    tests.mkdir()
    (tests / "test_part1_probe.py").write_text(tests_text.format(out=str(out)))
    report = grade(assignment["root"] / "impl", rubric=assignment["root"] / "rubric.toml", tests_dir=tests,
                   hidden_dir=assignment["root"] / "hidden", test_sets=sets, worker_prefix=box, **kw)
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
    # its folder on the scratch tmpfs, that tmpfs, and its own copy of its files (the next worker gets a
    # fresh one: test_nothing_a_worker_writes_reaches_the_next_one)
    mine = ("scratch", "home", "cwd", "scratch_root", "own")
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


def test_the_sandbox_binds_no_submission_its_files_come_with_each_worker(forked):
    """The servers outlive a submission, so no submission is bound into their sandbox: each worker
    imports its graded files from its own folder on the scratch, written by the server from the
    descriptors the judge sent with the spawn request."""
    for name in WORKERS:
        where = forked["said"][name]
        folder = os.path.dirname(os.path.dirname(where["module"]))  # <scratch>/code-<hex>/<package>/probe.py
        assert os.path.dirname(folder) == SERVER_SCRATCH and os.path.basename(folder).startswith("code-"), where
        assert not any(os.path.basename(m).startswith("grade-") and "sandbox-lib" not in m
                       for m in where["mounts"]), where["mounts"]  # no grade's temp folder (its copy) is bound


def test_later_submissions_share_the_servers_by_role_and_see_nothing_of_earlier_ones(assignment):
    """A judge keeps its servers across submissions (each starts by importing torch): the hidden
    tests' server forks every submission's hidden workers; the shown sets' workers (public tests,
    diagnoses) come from a server that never forked a hidden worker, in any submission. The first
    submission's server forks its public and then its hidden workers (it becomes the hidden server);
    the second starts the shown server that every later submission's public workers share. No
    submission sees anything an earlier one wrote, in its public, diagnosis or hidden workers."""
    boxes = [_bubblewrap().with_uid(64094) for _ in range(3)]  # one per submission, as a batch judge's
    runs = [_grade(assignment, f"shared{i}", box) for i, box in enumerate(boxes)]
    servers = [{n: said[n]["server"] for n in WORKERS} for _, said in runs]
    hidden = {s[n] for s in servers for n in ("look_first_where", "look_after_where")}
    shown = [s["public_where"] for s in servers]
    assert len(hidden) == 1 and hidden == {shown[0]}  # the first public worker's server became the hidden one
    assert shown[1] == shown[2] and shown[1] not in hidden  # later public workers: one server, never a hidden one
    for report, said in runs:
        assert said["look_first"] == [] and said["look_after"] == [], said
        assert said["public_look_before"] == []  # nothing of an earlier submission's public worker either
        assert not any("hidden" in p for p in said["diagnosis"])  # (it goes on in the public worker)
        assert said["diagnosis_where"] == said["public_where"]  # the diagnoses go on in the public worker
        assert [t["outcome"] for t in report["tests"]] == ["passed", "passed", "failed", "passed"]
    scratch = [said[n]["scratch"] for _, said in runs for n in WORKERS]
    assert len(set(scratch)) == len(scratch)  # a fresh scratch folder per worker
    assert all(r["timing"]["worker_starts"] == 3 for r, _ in runs)
    assert all(b.mode_used() == "bubblewrap (workers forked from a fork server inside the sandbox)" for b in boxes)


def test_a_server_that_died_between_submissions_is_replaced(assignment):
    """A kept server may die between two submissions (the machine's OOM killer, say): the next
    submission's workers come from a fresh one, not directly nor from the dead one."""
    first_box, second_box = (_bubblewrap().with_uid(64095) for _ in range(2))
    _, first = _grade(assignment, "before-death", first_box)
    for _, server in list(processes.SANDBOX_SERVERS._servers.values()):
        signal.pidfd_send_signal(server._sandbox_pidfd(), signal.SIGKILL)  # the server, PID 1 of its sandbox
        server.proc.wait(timeout=30)  # bwrap and the launcher end with it
    report, second = _grade(assignment, "after-death", second_box)
    assert second_box.mode_used() == "bubblewrap (workers forked from a fork server inside the sandbox)"
    assert not {first[n]["server"] for n in WORKERS} & {second[n]["server"] for n in WORKERS}
    assert [t["outcome"] for t in report["tests"]] == ["passed", "passed", "failed", "passed"]


def test_a_worker_cannot_change_the_limits_of_the_server_it_shares_a_uid_with(assignment):
    """The server forks the next submissions' workers with its own limits and scheduling, and a worker
    has its uid (non-dumpable stops ptrace, not prlimit or setpriority): the seccomp filter refuses those
    calls on another process, so the server is kept, and the next submission is graded as usual."""
    _, attacker = _grade(assignment, "poison-refused", _bubblewrap().with_uid(64091), POISON_TESTS, ("public",))
    assert attacker["poison"] == {"prlimit": False, "nice": False}
    report, honest = _grade(assignment, "after-poison-refused", _bubblewrap().with_uid(64091))
    assert honest["public_where"]["server"] == attacker["poison_where"]["server"]  # the same server, kept
    assert [t["outcome"] for t in report["tests"]] == ["passed", "passed", "failed", "passed"]


def test_a_server_whose_limits_a_worker_changed_forks_no_more(assignment):
    """Should a call slip past the filter (here: a box without one), the server finds its own limits or
    scheduling changed before its next fork, refuses it and exits: that submission's next workers start
    directly, and the next submission's come from a fresh server, with the limits they should have."""
    unfiltered = _bubblewrap().with_uid(64096)
    unfiltered.seccomp = None
    _, attacker = _grade(assignment, "poison-unfiltered", unfiltered, POISON_TESTS, ("public",))
    assert attacker["poison"] == {"prlimit": True, "nice": True}
    box = _bubblewrap().with_uid(64096)  # the same sandbox (the servers' key), with the filter
    report, honest = _grade(assignment, "after-poison", box)
    assert box.mode_used() == ("bubblewrap (workers started directly: the fork server's limits or scheduling "
                               "are not what they were when it started)"), box.mode_used()
    assert [t["outcome"] for t in report["tests"]] == ["passed", "passed", "failed", "passed"]
    report, later = _grade(assignment, "after-poison-later", _bubblewrap().with_uid(64096))
    assert later["public_where"]["ppid"] == 1 and "zygote" in later["public_where"]["init"]  # forked again
    assert later["public_where"]["server"] != attacker["poison_where"]["server"]  # by a fresh server
    assert [t["outcome"] for t in report["tests"]] == ["passed", "passed", "failed", "passed"]


def test_a_spawn_request_installs_only_plain_files_in_a_fresh_folder_of_the_scratch(tmp_path, monkeypatch):
    """zygote._install writes what the judge's descriptors hold, nowhere but a new code-<hex> folder
    directly below the scratch; anything else in the request is refused, and the server then forks
    nothing (the worker is started directly)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(zygote_module, "_SANDBOX", {"scratch": str(scratch)})
    src = tmp_path / "probe.py"
    src.write_text("x = 1\n")

    def install(root, names, package="_graded_submission"):
        fds = [os.open(src, os.O_RDONLY) for _ in names]
        try:
            return zygote_module._install({"root": root, "package": package, "files": names}, fds)
        finally:
            for fd in fds:
                os.close(fd)

    assert install(f"{scratch}/code-{'a' * 16}", ["probe.py", "__init__.py"]) is None
    assert (scratch / f"code-{'a' * 16}" / "_graded_submission" / "probe.py").read_text() == "x = 1\n"
    for root, names, package in [(f"{scratch}/code-{'a' * 16}", ["probe.py"], "_graded_submission"),  # exists
                                 (f"{scratch}/../code-{'b' * 16}", ["probe.py"], "_graded_submission"),
                                 (f"{tmp_path}/code-{'c' * 16}", ["probe.py"], "_graded_submission"),
                                 (f"{scratch}/code-{'d' * 16}", ["../probe.py"], "_graded_submission"),
                                 (f"{scratch}/code-{'e' * 16}", ["probe.py", "probe.py"], "_graded_submission"),
                                 (f"{scratch}/code-{'f' * 16}", ["probe.py"], "../up")]:
        assert install(root, names, package) is not None, (root, names, package)
    assert sorted(os.listdir(scratch)) == [f"code-{'a' * 16}"] and sorted(os.listdir(tmp_path)) == ["probe.py", "scratch"]
    monkeypatch.setattr(zygote_module, "_CODE_BYTES", 3)
    assert "larger than" in install(f"{scratch}/code-{'9' * 16}", ["probe.py"])


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
        server = pool._worker.proc.zygote
        assert pool._worker.in_sandbox_server and server._pidfd is not None
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
