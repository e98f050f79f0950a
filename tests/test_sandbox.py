"""The sandbox (instructor/sandbox.py): the unprivileged-uid mode for where bubblewrap cannot run,
failing closed, symlinked venvs, and the bounds on file-backed and shared memory.

Each probe is a short Python program started through the sandbox prefix exactly as a worker is;
it reports what it could do as a dict on its last line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from instructor import sandbox
from instructor.sandbox import ROOT, SandboxError, detect, require

PROBE = r"""
import ctypes, json, os, resource, socket, sys
cfg = json.loads(sys.argv[1])
r = {"uid": os.getuid(), "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
def can(f):
    try:
        f(); return True
    except OSError:
        return False
r["read"] = {p: can(lambda p=p: os.listdir(p) if os.path.isdir(p) else open(p, "rb").close()) for p in cfg["read"]}
r["write"] = {p: can(lambda p=p: open(os.path.join(p, "probe-%d" % os.getpid()), "w").close()) for p in cfg["write"]}
r["scratch"] = can(lambda: open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "x"), "w").write("x"))
r["memfd"] = can(lambda: os.close(os.memfd_create("m")))
libc = ctypes.CDLL(None, use_errno=True)
r["shmget"] = libc.shmget(0, 1 << 20, 0o1600) >= 0  # IPC_PRIVATE | IPC_CREAT
r["msgget"] = libc.msgget(0, 0o1600) >= 0  # System V and POSIX IPC objects outlive their process
r["semget"] = libc.semget(0, 1, 0o1600) >= 0
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    r["mq_open"] = rt.mq_open(b"/sandbox-probe", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
except OSError:
    r["mq_open"] = False
r["inet"] = can(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
r["unix"] = can(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
r["fork"] = can(fork)
r["kill_init"] = can(lambda: os.kill(1, 0))
# another process's limits and scheduling (the parent, same uid or root: the launcher or bwrap), each set
# to what it already is, so that a call that goes through changes nothing; then the worker's own
other = os.getppid()
r["prlimit_other"] = can(lambda: resource.prlimit(other, resource.RLIMIT_CORE, resource.prlimit(other, resource.RLIMIT_CORE)))
r["nice_other"] = can(lambda: os.setpriority(os.PRIO_PROCESS, other, os.getpriority(os.PRIO_PROCESS, other)))
r["nice_user"] = can(lambda: os.setpriority(os.PRIO_USER, 0, 0))
r["nice_group"] = can(lambda: os.setpriority(os.PRIO_PGRP, 0, 0))
r["affinity_other"] = can(lambda: os.sched_setaffinity(other, os.sched_getaffinity(other)))
r["scheduler_other"] = can(lambda: os.sched_setscheduler(other, os.sched_getscheduler(other), os.sched_getparam(other)))
r["param_other"] = can(lambda: os.sched_setparam(other, os.sched_getparam(other)))
r["own"] = [can(lambda: resource.setrlimit(resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE))),
            can(lambda: resource.prlimit(0, resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE))),
            can(lambda: os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 1)),
            can(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
            can(lambda: os.sched_setscheduler(0, os.sched_getscheduler(0), os.sched_getparam(0)))]
print(json.dumps(r))
"""


def _uid_box():
    box = detect("uid")
    if box.kind != "uid":
        pytest.skip(f"the unprivileged-uid sandbox is not available here: {box.mode}")
    return box.with_uid(64097)


def _probe(box, read: list[str], write: list[str]) -> dict:
    d = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    os.chmod(d, 0o755)
    try:
        argv = box.prefix([str(d), str(ROOT / "course"), sys.prefix, sys.base_prefix]) + [
            sys.executable, "-I", "-S", "-c", PROBE, json.dumps({"read": read, "write": [*write, str(d)]})]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        box.sweep()
        shutil.rmtree(d, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_uid_mode_hides_the_instructor_files_and_bounds_the_worker():
    box = _uid_box()
    secrets = [str(p) for p in sandbox.secret_paths()]
    shared = ["/tmp", "/dev/shm", "/var/tmp"]
    judge_cmdline = f"/proc/{os.getpid()}/cmdline"  # another process's: e.g. the batch's paths
    r = _probe(box, read=[*secrets, str(ROOT / "course"), judge_cmdline, "/proc/self/status"],
               write=[str(ROOT / "course"), str(ROOT), "/root", *shared])
    assert r["uid"] == 64097
    assert not any(r["read"][p] for p in secrets), r["read"]
    assert r["read"][str(ROOT / "course")] and r["read"]["/proc/self/status"]  # what it imports, its own /proc
    assert not any(v for p, v in r["write"].items() if p not in shared), r["write"]
    if box.landlock_abi:  # without Landlock, what the uid leaves in /tmp is swept after each submission
        assert not any(r["write"][p] for p in shared), r["write"]
        assert not r["read"][judge_cmdline]
    assert not r["scratch"]  # its scratch folder (HOME, TMPDIR) is on disk without a quota: not writable
    assert (r["memfd"], r["shmget"], r["inet"], r["fork"], r["kill_init"]) == (False,) * 5, r
    assert r["unix"]
    assert r["nofile"] <= sandbox.SandboxLimits().nofile


def test_what_the_uid_leaves_behind_is_swept(tmp_path):
    box = _uid_box()
    left = Path("/tmp") / f"left-behind-{os.getpid()}"
    left.write_text("x")
    os.chown(left, box.uid, box.uid)
    assert str(left) in box.sweep() and not left.exists()


def test_every_mode_refuses_memfd_and_shm():
    """File-backed (memfd) and SysV shared memory escape RLIMIT_AS, and message queues and semaphores
    outlive the worker (a note for the next one): refused in every mode."""
    for box in (detect(), detect("rlimits")):
        if not box.seccomp:
            pytest.skip("no seccomp filter for this architecture")
        r = _probe(box.with_uid(64097), read=[], write=[])
        assert (r["memfd"], r["shmget"], r["fork"]) == (False, False, False), (box.mode, r)
        assert (r["msgget"], r["semget"], r["mq_open"]) == (False, False, False), (box.mode, r)


def test_every_mode_refuses_changing_another_processs_limits_or_scheduling():
    """prlimit64, setpriority, sched_set* and ioprio_set need only the same uid (no ptrace check): a
    worker could lower the limits of the fork server it shares a uid with (bubblewrap), and every later
    submission's workers, forked with those limits, would fail. Refused on any process but the
    caller's own (pid 0), in every mode; a worker's own limits and priority it may still change."""
    for box in (detect(), detect("rlimits")):
        if not box.seccomp:
            pytest.skip("no seccomp filter for this architecture")
        r = _probe(box.with_uid(64097), read=[], write=[])
        other = {k: v for k, v in r.items() if k.endswith(("_other", "_user", "_group"))}
        assert len(other) == 7 and not any(other.values()), (box.mode, other)
        assert r["own"] == [True] * 5, (box.mode, r["own"])


def _cli(args: list[str], **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=e)


def test_a_mode_that_is_not_available_refuses_in_one_line(tmp_path):
    """bubblewrap asked for where it cannot run (here: a bwrap that fails as in Docker): one line,
    non-zero, nothing graded; with --allow-weak-sandbox the batch grades and records the mode."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    subs = tmp_path / "subs"
    subs.mkdir()
    r = _cli(["-m", "instructor.batch", str(subs), "--out", str(tmp_path / "out"), "--sandbox", "bubblewrap",
              "--quiet"], GRADER_BWRAP=str(fake))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refusing to grade"), r.stderr
    assert "Operation not permitted" in lines[0] and "--allow-weak-sandbox" in lines[0]
    assert not (tmp_path / "out").exists()
    r = _cli(["-m", "instructor.sandbox", "--mode", "bubblewrap"], GRADER_BWRAP=str(fake))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    r = _cli(["-m", "instructor.batch", str(subs), "--out", str(tmp_path / "out"), "--sandbox", "bubblewrap",
              "--allow-weak-sandbox", "--quiet"], GRADER_BWRAP=str(fake))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    uid = detect("uid")  # accepted weaker: the strongest mode there is, not straight to rlimits-only
    if uid.isolating:
        assert summary["sandbox"] == uid.mode, summary["sandbox"]
    else:
        assert summary["sandbox"].startswith("rlimits-only") and "bwrap failed its self-test" in summary["sandbox"]


def test_the_uid_mode_without_landlock_is_weak_and_refused(monkeypatch):
    """File permissions alone leave the world-readable to the worker's uid (other submissions, other
    processes' command lines): that mode isolates nothing a channel promises, so channels refuse it."""
    from dataclasses import replace

    from instructor.gradescope.__main__ import WEAK_OK, sandbox_refusal

    box = sandbox.Sandbox("unprivileged-uid (file permissions only)", kind="uid", landlock_abi=0)
    assert not box.isolating and replace(box, landlock_abi=1).isolating
    monkeypatch.delenv(WEAK_OK, raising=False)
    assert "refuses to grade without isolation" in sandbox_refusal(box)
    assert sandbox_refusal(replace(box, landlock_abi=7)) is None


@pytest.mark.skipif(os.geteuid() != 0 or not sandbox.no_fork_filter(), reason="the uid mode needs root and seccomp")
def test_a_uid_mode_whose_paths_cannot_be_set_up_fails_its_self_test_in_one_line(monkeypatch):
    """As root in a user namespace (a rootless container) chown to the sandbox's gid fails with EINVAL:
    the mode is then unavailable, with its reason (so the channel refuses or falls back), not a crash."""
    def unmapped(self, paths):
        raise OSError(22, "Invalid argument", "/tmp/sandbox-probe-x")

    monkeypatch.setattr(sandbox.Sandbox, "confinement", unmapped)
    box, why = sandbox._try_uid(sandbox.no_fork_filter(), sandbox.SandboxLimits())
    assert box is None and why.startswith("the unprivileged-uid sandbox failed its self-test: could not set up")
    assert "Invalid argument" in why and "\n" not in why


def test_hiding_the_instructor_files_on_a_read_only_file_system_does_not_raise(tmp_path, monkeypatch):
    secret = tmp_path / "hidden_tests"
    secret.mkdir(mode=0o755)

    def read_only(*_a, **_k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "chmod", read_only)
    assert sandbox.hide_instructor_files([secret]) == []  # the self-test then decides


def test_require_fails_closed():
    with pytest.raises(SandboxError, match="refusing to grade: sandbox mode 'rlimits' isolates nothing.*"
                                           "--allow-weak-sandbox"):
        require("rlimits")
    assert require("rlimits", allow_weak=True).kind == "rlimits"
    box = detect()
    if box.isolating:
        assert require() is box


def test_a_symlinked_venv_passes_the_self_test(tmp_path):
    """The worker is started through the unresolved path (sys.executable of a symlinked .venv): the
    self-test must pass there too, in the strongest mode this machine has."""
    box = detect()
    if not box.isolating:
        pytest.skip(f"no isolating sandbox here: {box.mode}")
    link = Path(tempfile.mkdtemp(prefix="venv-link-"))
    try:
        os.chmod(link, 0o755)
        (link / ".venv").symlink_to(Path(sys.prefix).resolve())
        python = link / ".venv" / "bin" / Path(sys.executable).name
        r = subprocess.run([str(python), "-m", "instructor.sandbox", "--mode", box.kind], capture_output=True,
                           text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        shutil.rmtree(link, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sandbox_kind"] == box.kind


def test_the_uid_mode_never_regroups_the_instructors_tree_even_under_the_temp_dir(monkeypatch):
    """A checkout (or CI clone) under /tmp: giving the worker's group the engine's private copies must
    not reach course/ or the venv through the binds (it once made course/ unreadable to other slots)."""
    import tempfile

    from instructor import sandbox as sb

    course = sb.ROOT / "course"
    before = {p: (p.stat().st_mode, p.stat().st_gid) for p in (course, course / "__init__.py")}
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(sb.ROOT.parent))  # the repository now counts as "in tmp"
    sb._make_traversable(course, 64123)
    assert {p: (p.stat().st_mode, p.stat().st_gid) for p in before} == before


_CLAIM = ("import sys, time; sys.path.insert(0, sys.argv[1]); from instructor.sandbox import claim_uid; "
          "print(claim_uid(int(sys.argv[2])), flush=True); time.sleep(float(sys.argv[3]))")


def _claim(preferred: int, hold: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CLAIM, str(ROOT), str(preferred), str(hold)],
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are root's to hand out")
def test_two_grading_processes_at_once_never_share_a_sandbox_uid():
    """Two batches at once (two shards in two terminals) must not run workers as one uid: one's sweep would
    delete the other's files and a worker of one could reach what a worker of the other left. A uid is held
    while its process lives (an flock), and free again when it ends, however it ends."""
    preferred = 64700
    holder = _claim(preferred, hold=60)
    try:
        first = int(holder.stdout.readline())
        second = _claim(preferred)
        got = int(second.communicate(timeout=60)[0])
        assert got != first and (got - preferred) % sandbox.UID_STRIDE == 0, (first, got)
    finally:
        holder.kill()
        holder.wait()
    again = _claim(first)
    assert int(again.communicate(timeout=60)[0]) == first, "a dead process's uid is free again"


def test_machine_wide_counters_are_hidden_in_both_sandboxes():
    """/proc/stat (forks since boot, context switches), /proc/meminfo, /proc/loadavg and /proc/vmstat are no
    namespace's: one worker could move them and a later one read them (a hidden test's worker leaving its
    inputs for a shown one). Unreadable in both sandboxes; what torch reads of the CPUs stays readable."""
    boxes = [b for b in (detect("bubblewrap"), detect("uid")) if b.kind in ("bubblewrap", "uid")]
    if not boxes:
        pytest.skip("neither sandbox is available here")
    for box in boxes:
        r = _probe(box.with_uid(64097), read=[*sandbox.HIDDEN_PROC, "/proc/cpuinfo"], write=[])
        assert not any(r["read"][p] for p in sandbox.HIDDEN_PROC), (box.mode, r["read"])
        assert r["read"]["/proc/cpuinfo"], box.mode


def test_a_refusal_names_what_a_weaker_mode_would_be_and_who_asked(monkeypatch):
    """An outside instructor: the refusal said '--allow-weak-sandbox to grade with resource limits only' where
    the flag would grade in the uid mode, and blamed the channel's 'auto' where GRADER_SANDBOX had asked for
    rlimits. It names the weaker mode the flag would give, and the environment variable."""
    monkeypatch.setenv(sandbox.ENV_MODE, "rlimits")
    with pytest.raises(SandboxError, match="set by GRADER_SANDBOX=rlimits: unset it"):
        require("auto")
    monkeypatch.delenv(sandbox.ENV_MODE)
    monkeypatch.setenv(sandbox.ENV_BWRAP, "/nonexistent/bwrap")
    sandbox._detect.cache_clear()
    best = detect("uid")
    with pytest.raises(SandboxError) as e:
        require("bubblewrap")
    said = str(e.value)
    assert "bwrap not found" in said
    assert (f"strongest mode this machine has, {best.mode}" in said) if best.isolating else \
        ("resource limits only" in said)
    sandbox._detect.cache_clear()


def test_auto_says_why_bubblewrap_was_not_used(monkeypatch):
    """An outside instructor: with bubblewrap missing, `auto` graded in the uid mode and recorded that mode,
    but not why bubblewrap was passed over. The box (and so every summary and result) keeps the reason."""
    monkeypatch.delenv(sandbox.ENV_MODE, raising=False)
    monkeypatch.setenv(sandbox.ENV_BWRAP, "/nonexistent/bwrap")
    sandbox._detect.cache_clear()
    try:
        box = detect("auto")
        if box.kind != "uid":
            pytest.skip(f"no uid sandbox here ({box.mode})")
        assert box.passed_over.startswith("bubblewrap: ") and "bwrap not found" in box.passed_over
        assert box.describe()["passed_over"] == box.passed_over
        assert box.with_uid(64011).passed_over == box.passed_over  # each judge's copy keeps it
        assert "passed_over" not in detect("uid").describe()  # asked for by name: nothing was passed over
    finally:
        sandbox._detect.cache_clear()
