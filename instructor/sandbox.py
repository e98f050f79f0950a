"""The sandbox around the grading engine's worker processes (batch grading, Gradescope, nbgrader).

The engine starts each worker as `prefix + [python, -I, -S, -c, bootstrap]` (or forks it from a fork
server, zygote.py, that applies the same confinement); this module builds that prefix and the
confinement config. The judge (pytest, the references, the verdict) stays outside. Three modes:

"bubblewrap"  (`bwrap`, Debian package bubblewrap): a private file system of read-only binds (the
    Python installation, the venv, the course package, the engine's worker files, the scenarios and
    the submission's private copy), private size-capped tmpfs /tmp and /dev/shm, no network, its own
    PID/IPC/UTS namespaces, a new session, no capabilities, --die-with-parent, and, as root, an
    unprivileged uid (setpriv). Its workers are forked by a fork server inside such a sandbox
    (fork_server; a judge keeps two across the submissions it grades, one for the sets whose results
    are shown and one for the hidden sets: autograder/engine/processes.py SandboxServers), and
    started directly, one sandbox each, where it cannot serve.
"unprivileged-uid"  for where bubblewrap cannot run (an unprivileged container where we are root:
    Gradescope, most CI; Docker's seccomp profile refuses the namespaces bubblewrap needs). The
    worker drops to a dedicated uid (64000 + judge slot) with no groups; Landlock (Linux >= 5.13,
    needs no privilege) lets it read only the trees it imports from and its submission's copy and
    write only a private scratch folder, connect no TCP and signal nothing outside; the instructor's
    secret folders are also closed to "others" by file permissions (instructor/, solutions/,
    autograder/tests/, the repository's .git), and whatever the uid left in /tmp, /var/tmp or
    /dev/shm is removed after each submission (sweep()).
"rlimits-only (<reason>)"  resource limits and the seccomp filter alone; the worker can read what
    the grading user can read. WEAK: require() refuses it unless the instructor allows it.

Every mode adds, in the launcher (autograder/engine/confine.py):
- a seccomp filter that refuses new processes (fork, vfork, clone without CLONE_THREAD; clone3 is
  answered ENOSYS so that glibc falls back to clone for threads), file-backed anonymous memory
  (memfd_create, memfd_secret) and SysV shared memory (shmget), the IPC objects that outlive a
  worker (msgget, semget, mq_open), every socket but AF_UNIX, the kernel interfaces a worker
  never needs (unshare, setns, ptrace, mount, bpf, io_uring, ...), and the calls that change the
  limits or scheduling of a process of the same uid but the caller (prlimit64, setpriority,
  sched_set*, ioprio_set on another pid, process group or user);
- RLIMIT_NPROC / RLIMIT_NOFILE / RLIMIT_CORE / RLIMIT_MEMLOCK. Memory (RLIMIT_AS), CPU time and file
  size are the engine's own per-worker limits (autograder.engine Limits).

`python -m instructor.sandbox [--mode M]` runs the self-test and prints the mode this machine gets;
it exits 1, with one line, when the mode asked for is not available.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import secrets as _secrets
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
# Instructor paths a worker must never see (checked against every bind, in both directions).
SECRET_PATHS = (ROOT / "solutions", ROOT / "instructor", ROOT / "autograder" / "tests")


UID_BASE = 64000  # default unprivileged uid (judge slot i uses UID_BASE + i; see claim_uid)
UID_LOCKS = "/run/flashattention-grader"  # root's 0755 folder of one lock file per uid in use (claim_uid)
UID_STRIDE, UID_TRIES = 100, 50  # a busy uid's next candidate is 100 on (a batch's slots stay apart), 50 tries
# bubblewrap's fork server (Sandbox.fork_server): the one writable folder of its sandbox, a tmpfs that
# the server empties after each worker; each worker gets a fresh folder below it
SERVER_SCRATCH = "/scratch"
ENGINE_DIR = ROOT / "autograder" / "engine"
CONFINE = ENGINE_DIR / "confine.py"  # the launcher (standard library only)
MODES = ("auto", "bubblewrap", "uid", "rlimits")
ENV_MODE = "GRADER_SANDBOX"  # forces a mode for every channel (e.g. uid: bubblewrap made unavailable)
ENV_BWRAP = "GRADER_BWRAP"  # the bwrap program to use (default: bwrap on PATH)


def secret_paths() -> list[Path]:
    """SECRET_PATHS plus the repository's git folder (its history holds the solutions)."""
    out = list(SECRET_PATHS)
    git = ROOT / ".git"
    if git.is_dir():
        out.append(git)
    return out


# /proc files of machine-wide counters that a worker could both move and read (forks since boot and
# context switches in /proc/stat, memory in use): a channel from one worker to a later one, a hidden
# test's worker to a shown one's. Unreadable in both sandboxes; workers start no thread or process.
HIDDEN_PROC = ("/proc/stat", "/proc/meminfo", "/proc/loadavg", "/proc/vmstat")


@dataclass(frozen=True)
class SandboxLimits:
    """What the launcher sets (the engine sets memory, CPU time and file size itself)."""

    nproc: int = 64  # processes + threads of the sandbox uid (the worker uses 1 torch thread)
    nofile: int = 64  # open files: with RLIMIT_FSIZE this bounds what open files can hold
    memlock_bytes: int = 64 << 10
    tmp_bytes: int = 64 << 20  # bubblewrap: size of the private /tmp and /dev/shm, and of the fork server's /scratch


# ---------------------------------------------------------------------------------------------
# seccomp as a classic BPF program (struct sock_filter[]), built here so that no library is
# needed. Syscall numbers per architecture; other architectures get no filter.

_DENY = ("unshare", "setns", "ptrace", "mount", "umount2", "pivot_root", "chroot", "bpf", "perf_event_open",
         "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load", "memfd_create", "shmget",
         "io_uring_setup", "process_vm_writev", "open_by_handle_at",
         # System V message queues and semaphores and POSIX message queues outlive the process that
         # made them (they belong to the IPC namespace): a worker could leave data for the next one
         "msgget", "semget", "mq_open")
_ARCH = {  # machine -> (AUDIT_ARCH_*, {syscall: nr})
    "x86_64": (0xC000003E, dict(fork=57, vfork=58, clone=56, clone3=435, unshare=272, setns=308, ptrace=101,
                                mount=165, umount2=166, pivot_root=155, chroot=161, bpf=321,
                                perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248,
                                request_key=249, kexec_load=246, memfd_create=319, memfd_secret=447,
                                shmget=29, socket=41, io_uring_setup=425, process_vm_writev=311,
                                open_by_handle_at=304, msgget=68, semget=64, mq_open=240,
                                prlimit64=302, sched_setparam=142, sched_setscheduler=144,
                                sched_setaffinity=203, sched_setattr=314, setpriority=141, ioprio_set=251)),
    "aarch64": (0xC00000B7, dict(clone=220, clone3=435, unshare=97, setns=268, ptrace=117, mount=40,
                                 umount2=39, pivot_root=41, chroot=51, bpf=280, perf_event_open=241,
                                 userfaultfd=282, keyctl=219, add_key=217, request_key=218, kexec_load=104,
                                 memfd_create=279, memfd_secret=447, shmget=194, socket=198,
                                 io_uring_setup=425, process_vm_writev=271, open_by_handle_at=265,
                                 msgget=186, semget=190, mq_open=180,
                                 prlimit64=261, sched_setparam=118, sched_setscheduler=119,
                                 sched_setaffinity=122, sched_setattr=274, setpriority=140, ioprio_set=30)),
}
# Calls that change another process's limits or scheduling with nothing but the same uid (no ptrace
# check, so a fork server that is not dumpable is still open to them): allowed on the caller only,
# pid 0 (args[0]). A worker shares its uid with its fork server inside a bubblewrap sandbox, which
# forks the next submissions' workers with the limits it holds (zygote._child).
_OWN_PID_ONLY = ("prlimit64", "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr")
# (which, who): setpriority(PRIO_PROCESS = 0, 0) and ioprio_set(IOPRIO_WHO_PROCESS = 1, 0) only; a
# process group or a user (which) would reach the server too
_OWN_PROCESS_ONLY = {"setpriority": 0, "ioprio_set": 1}
_EPERM, _EAGAIN, _EACCES, _ENOSYS = 1, 11, 13, 38
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_CLONE_THREAD = 0x00010000
_AF_UNIX = 1


def no_fork_filter(machine: str | None = None) -> bytes | None:
    """The BPF program, or None on an architecture this module has no syscall table for."""
    machine = machine or platform.machine()
    if machine not in _ARCH or sys.byteorder != "little":
        return None
    arch, nr = _ARCH[machine]
    ld = lambda off: (0x20, 0, 0, off)  # BPF_LD|BPF_W|BPF_ABS       # noqa: E731
    jeq = lambda k, jt, jf: (0x15, jt, jf, k)  # BPF_JMP|BPF_JEQ|BPF_K   # noqa: E731
    jge = lambda k, jt, jf: (0x35, jt, jf, k)  # noqa: E731
    jset = lambda k, jt, jf: (0x45, jt, jf, k)  # noqa: E731
    ret = lambda k: (0x06, 0, 0, k)  # noqa: E731
    prog = [ld(4), jeq(arch, 1, 0), ret(_RET_ERRNO | _EPERM),  # a foreign ABI (int 0x80): refused
            ld(0)]
    if machine == "x86_64":  # x32 syscalls (nr | 0x40000000) would bypass the table
        prog += [jge(0x40000000, 0, 1), ret(_RET_ERRNO | _EPERM)]
    for name in ("fork", "vfork"):
        if name in nr:
            prog += [jeq(nr[name], 0, 1), ret(_RET_ERRNO | _EAGAIN)]
    prog += [jeq(nr["clone3"], 0, 1), ret(_RET_ERRNO | _ENOSYS)]  # glibc then uses clone
    prog += [jeq(nr["memfd_secret"], 0, 1), ret(_RET_ERRNO | _ENOSYS)]
    for name in _DENY:
        prog += [jeq(nr[name], 0, 1), ret(_RET_ERRNO | _EPERM)]
    # another process's limits or scheduling: refused. Each branch that loads an argument returns, so
    # the accumulator holds the syscall number again wherever the program goes on. (An int argument is
    # the low word of its 64-bit slot: the kernel ignores the high word.)
    for name in _OWN_PID_ONLY:  # pid (args[0]) == 0
        prog += [jeq(nr[name], 0, 4), ld(16), jeq(0, 0, 1), ret(_RET_ALLOW), ret(_RET_ERRNO | _EPERM)]
    for name, own in _OWN_PROCESS_ONLY.items():  # which (args[0]) == own, who (args[1]) == 0
        prog += [jeq(nr[name], 0, 6), ld(16), jeq(own, 0, 3), ld(24), jeq(0, 0, 1), ret(_RET_ALLOW),
                 ret(_RET_ERRNO | _EPERM)]
    # socket: AF_UNIX (domain = args[0], low word at offset 16) only; no network family at all
    prog += [jeq(nr["socket"], 0, 3), ld(16), jeq(_AF_UNIX, 4, 0), ret(_RET_ERRNO | _EACCES)]
    # clone: a thread (CLONE_THREAD in flags = args[0]) is fine, a process not. Both branches above
    # that reload args[0] end here, with the accumulator holding args[0] (socket: AF_UNIX -> allow).
    prog += [jeq(nr["clone"], 0, 4), ld(16), jset(_CLONE_THREAD, 0, 1), ret(_RET_ALLOW), ret(_RET_ERRNO | _EAGAIN)]
    prog.append(ret(_RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# ---------------------------------------------------------------------------------------------


@dataclass
class Sandbox:
    """A worker_prefix factory. `mode` is what every report shows ("bubblewrap", "unprivileged-uid
    (...)" or "rlimits-only (<reason>)"); `kind` is bubblewrap / uid / rlimits."""

    mode: str
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    bwrap: str | None = None
    setpriv: str | None = None
    seccomp: bytes | None = None
    uid: int | None = None  # unprivileged uid for the worker (bubblewrap mode as root; uid mode)
    kind: str = "rlimits"
    landlock_abi: int = 0  # uid mode: the Landlock ABI applied to every worker (0: permissions only)
    spool: str | None = None  # uid mode: parent of the workers' scratch folders (root-owned, 0711)
    # "auto" chose a weaker mode than it tried first: why that one was not used ("bubblewrap: <reason>")
    passed_over: str = ""
    # how this submission's workers started (note_worker, mode_used): with_uid gives each submission its own
    used: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.bwrap and self.kind == "rlimits":
            self.kind = "bubblewrap"

    @property
    def isolating(self) -> bool:
        """True when the worker cannot read the instructor's files nor write where others read. The uid
        mode isolates only under Landlock: file permissions alone leave everything world-readable to
        the worker's uid (other submissions, other processes' command lines, a course folder
        copied elsewhere)."""
        return self.kind == "bubblewrap" or (self.kind == "uid" and self.landlock_abi > 0)

    @property
    def process_limit(self) -> str:
        if self.seccomp:
            return ("seccomp filter: no fork/clone of new processes, no memfd/shm, no network sockets, no change to "
                    "another process's limits or scheduling")
        if self.uid is not None:
            return f"RLIMIT_NPROC={self.limits.nproc} for uid {self.uid}"
        return "none beyond the engine's time limit (no seccomp on this architecture)"

    def describe(self) -> dict:
        workers = {"bubblewrap": "forked from a fork server inside the sandbox (one per judge for the shown "
                                 "test sets, one for the hidden ones); started directly (a sandbox each) "
                                 "where it cannot serve",
                   "uid": "forked from the judge's fork server, each confining itself"}
        return {"sandbox": self.mode, "sandbox_kind": self.kind, "process_limit": self.process_limit,
                "uid": self.uid if self.kind != "rlimits" else None, "landlock_abi": self.landlock_abi,
                "workers": workers.get(self.kind, "forked from the judge's fork server"),
                "limits": self.limits.__dict__, **({"passed_over": self.passed_over} if self.passed_over else {})}

    def with_uid(self, uid: int | None) -> "Sandbox":
        if self.kind == "uid":  # a spool of its own: its sweep() must not touch another slot's workers
            return replace(self, uid=uid if uid is not None else UID_BASE, spool=None, used={})
        return replace(self, uid=uid if (self.bwrap and self.setpriv) else None, used={})

    # the engine calls this with the paths the worker needs (readable), once per worker start
    def __call__(self, paths: Sequence[str]) -> list[str]:
        return self.prefix(paths)

    def _rlimits(self) -> dict:
        rl = {"RLIMIT_NOFILE": self.limits.nofile, "RLIMIT_CORE": 0, "RLIMIT_MEMLOCK": self.limits.memlock_bytes}
        if self.uid is not None or not self.bwrap:
            rl["RLIMIT_NPROC"] = self.limits.nproc
        return rl

    def confinement(self, paths: Sequence[str]) -> dict:
        """The config of autograder/engine/confine.py for one worker that reads `paths` (uid and
        rlimits modes; also what the fork server applies in each forked worker)."""
        cfg = {"rlimits": self._rlimits(), "seccomp": (self.seccomp or b"").hex(), "mode": self.kind}
        if self.kind == "uid":
            binds = _bind_list(paths)
            for b in binds:
                _make_traversable(b, self.uid)
                _check_ancestors(b)
            # The scratch folder (HOME, TMPDIR, the working directory) stays root's: on disk, with no
            # quota, a worker could fill it without bound; the uid mode writes nowhere (bubblewrap
            # gives a size-capped tmpfs instead).
            cfg.update(uid=self.uid, gid=self.uid, scratch=self._new_scratch(), scratch_owner="root")
            if self.landlock_abi:
                cfg["landlock"] = {"abi": self.landlock_abi, "read": [*landlock_read_paths(binds), cfg["scratch"]],
                                   "write": ["/dev/null"], "scratch_write": False}
        return cfg

    def _new_scratch(self) -> str:
        if self.spool is None or not os.path.isdir(self.spool):
            self.spool = tempfile.mkdtemp(prefix="sandbox-scratch-", dir=_scratch_parent())
            os.chmod(self.spool, 0o711)  # traversable, not listable: each scratch name is random
        return os.path.join(self.spool, _secrets.token_hex(12))

    def prefix(self, paths: Sequence[str]) -> list[str]:
        if self.kind == "bubblewrap":
            cfg = {"rlimits": self._rlimits(), "seccomp": (self.seccomp or b"").hex(), "mode": "bwrap"}
            return [sys.executable, "-I", "-S", str(CONFINE), json.dumps(cfg), *self._bwrap_argv(paths)]
        return [sys.executable, "-I", "-S", str(CONFINE), json.dumps(self.confinement(paths))]

    # -- bubblewrap: fork servers inside the sandbox ------------------------------------------
    def fork_server(self, paths: Sequence[str]) -> tuple[list[str], dict]:
        """(argv prefix, server config) of a fork server inside a bubblewrap sandbox that reads
        `paths` (autograder/engine/zygote.py), so that workers are forked with torch already imported.

        The sandbox is a worker's (the same namespaces, uid, and binds but the submission's: each
        worker's graded files come with its spawn request and are written into the scratch) with
        three changes, because it outlives each worker it serves: everything in it is read-only except
        SERVER_SCRATCH, a size-capped tmpfs the server empties after every worker, so no worker can
        leave a file for the next; the server runs as its PID 1, which no signal from inside the
        namespace reaches; and bwrap installs no seccomp filter (the server must fork): each forked
        worker installs it itself, with the rlimits, before its first line of student code
        (forked_confinement). The config lists what the server checks before it serves (zygote.py:
        _self_check)."""
        if self.kind != "bubblewrap" or not self.bwrap:
            raise SandboxError(f"only the bubblewrap sandbox runs a fork server inside it ({self.mode})")
        launcher = {"rlimits": {}, "seccomp": "", "mode": "bwrap"}  # the rlimits are each worker's
        argv = [sys.executable, "-I", "-S", str(CONFINE), json.dumps(launcher), *self._bwrap_argv(paths, server=True)]
        return argv, {"scratch": SERVER_SCRATCH, "probe": self.forked_confinement()}

    def forked_confinement(self) -> dict:
        """confine.py's config for one worker forked by the fork server inside the sandbox: what the
        launcher and bwrap give a directly started worker (rlimits, the seccomp filter) and a fresh
        scratch folder of its own for HOME, TMPDIR and the working directory (a direct worker's are
        its private /tmp)."""
        return {"rlimits": self._rlimits(), "seccomp": (self.seccomp or b"").hex(), "mode": "bwrap-fork",
                "scratch": f"{SERVER_SCRATCH}/{_secrets.token_hex(8)}", "chdir": True}

    def note_worker(self, forked: bool, why: str | None = None) -> None:
        """The engine's note of how one worker of this submission started (read by mode_used):
        forked by the fork server inside the sandbox, or directly (`why` it was not forked)."""
        key = "forked" if forked else "direct"
        self.used[key] = self.used.get(key, 0) + 1
        if why and not forked:
            self.used.setdefault("why", why)

    def mode_used(self) -> str:
        """`mode`, and for bubblewrap how this submission's workers started: what its report shows."""
        forked, direct = self.used.get("forked", 0), self.used.get("direct", 0)
        if self.kind != "bubblewrap" or not (forked or direct):
            return self.mode
        if not direct:
            return f"{self.mode} (workers forked from a fork server inside the sandbox)"
        why = self.used.get("why", "the fork server is off")
        if not forked:
            return f"{self.mode} (workers started directly: {why})"
        return (f"{self.mode} ({forked} worker(s) forked from a fork server inside the sandbox, {direct} started "
                f"directly: {why})")

    def sweep(self) -> list[str]:
        """After a submission (uid mode): remove the workers' scratch folders and every file the
        sandbox uid left in the world-writable folders, so that no later submission reads it.
        Returns what was removed."""
        removed: list[str] = []
        if self.kind != "uid" or self.uid is None:
            return removed
        if self.spool and os.path.isdir(self.spool):
            removed += [os.path.join(self.spool, name) for name in os.listdir(self.spool)]
            shutil.rmtree(self.spool, ignore_errors=True)  # the next worker makes a new one
        self.spool = None
        for top in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
            try:
                entries = list(os.scandir(top))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.stat(follow_symlinks=False).st_uid != self.uid:
                        continue
                    if e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path, ignore_errors=True)
                    else:
                        os.unlink(e.path)
                    removed.append(e.path)
                except OSError:
                    pass
        return removed

    def _bwrap_argv(self, paths: Sequence[str], server: bool = False) -> list[str]:
        """bwrap's argv for one worker, or with `server` for the fork server of a submission (see
        fork_server: read-only but for SERVER_SCRATCH, PID 1, no seccomp filter at this level)."""
        binds = _bind_list(paths)
        argv = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox",
                "--cap-drop", "ALL",
                # the server: PID 1, and bwrap tells the engine its pid out here (@INFO_FD@: a pipe),
                # so that closing it ends the sandbox even though its uid change (setpriv) cleared
                # --die-with-parent's parent-death signal
                *(["--as-pid-1", "--info-fd", "@INFO_FD@"] if server else []),
                # the private /tmp first: binds below it (the engine's copy lives in the temp dir) go on top
                "--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        made: set[str] = {"/", "/tmp"}

        def mkdirs(path: Path) -> None:  # ancestors as fresh 0755 folders (e.g. /root is 0700)
            for anc in reversed(path.parents):
                s = str(anc)
                if s not in made:
                    made.add(s)
                    argv.extend(["--perms", "0755", "--dir", s])

        for src in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
            p = Path(src)
            if p.is_symlink():
                argv.extend(["--symlink", os.readlink(p), src])
            elif p.is_dir():
                argv.extend(["--ro-bind", src, src])
            made.add(src)
        for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
                  "/etc/localtime", "/etc/hosts"):
            if os.path.exists(f):
                mkdirs(Path(f))
                argv.extend(["--ro-bind", f, f])
        for b in binds:
            if any(str(b) == m or str(b).startswith(m.rstrip("/") + "/") for m in ("/usr", "/lib", "/lib64", "/bin")):
                continue  # already visible
            mkdirs(b)
            argv.extend(["--ro-bind", str(b), str(b)])
            made.add(str(b))
        # the unresolved spellings of the binds (a symlinked .venv, sys.executable through it) as
        # symlinks to what was bound: the worker is started, and imports, through them
        bound = [str(b) for b in binds] + ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"]
        for link, target in _link_aliases(paths):
            # a link inside a bound tree is there already; elsewhere (the tmpfs, fresh folders) it is made
            if link not in made and not any(link == b or link.startswith(b + "/") for b in bound):
                mkdirs(Path(link))
                argv.extend(["--symlink", target, link])
                made.add(link)
        argv += ["--proc", "/proc", "--dev", "/dev"]
        # the machine-wide counters of a fresh /proc (forks since boot, context switches, memory in
        # use) are no namespace's: one worker could leave hidden inputs in them for a later one to read
        for counters in HIDDEN_PROC:
            argv += ["--ro-bind", "/dev/null", counters]
        if server:
            # a file left anywhere but the scratch tmpfs would outlive its worker: all else read-only
            # (the remounts last, over everything made above; /dev keeps its device nodes usable)
            argv += ["--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", SERVER_SCRATCH,
                     "--remount-ro", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/",
                     "--setenv", "HOME", SERVER_SCRATCH, "--setenv", "TMPDIR", SERVER_SCRATCH, "--chdir", "/"]
        else:
            argv += ["--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/dev/shm",
                     "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp"]
        if self.seccomp and not server:
            argv += ["--seccomp", "@SECCOMP_FD@"]
        if self.uid is not None:
            # bwrap keeps CAP_SETUID/SETGID only for setpriv, which drops every capability with the uid
            argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                     self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
            for b in binds:
                _make_traversable(b)
        else:
            argv.append("--")
        return argv


def _fs_type(path: str) -> str:
    """The file-system type of the mount that holds `path` (from /proc/self/mounts)."""
    best, kind = "", "?"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2:
                    mnt = fields[1].replace("\\040", " ")
                    if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


def _scratch_parent() -> str:
    """Where the uid mode's scratch folders go: a disk-backed temp folder if there is one. Files on a
    tmpfs are memory that RLIMIT_AS does not count (RLIMIT_FSIZE bounds each file, not their number)."""
    candidates = [str(Path(tempfile.gettempdir()).resolve()), "/var/tmp"]
    for c in candidates:
        if os.path.isdir(c) and _fs_type(c) not in ("tmpfs", "ramfs"):
            return c
    return candidates[0]


def landlock_read_paths(binds: Sequence[Path]) -> list[str]:
    """What a uid-mode worker may read: the binds, the system's libraries and the few files of /etc,
    /proc and /sys that the interpreter and torch read, the devices it opens."""
    system = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
              "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/localtime",
              # of /proc only the worker's own process (the rule is added by the worker itself, so
              # /proc/self is its own folder) and the CPU description: no other process's cmdline, and
              # not the machine-wide counters (HIDDEN_PROC)
              "/proc/self", "/proc/cpuinfo",
              "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/null", "/dev/zero", "/dev/urandom",
              "/dev/random"]
    return [*(str(b) for b in binds), *(p for p in system if os.path.exists(p))]


def _link_aliases(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(unresolved path, its target) for every path whose spelling goes through a symlink, plus
    sys.executable's: the worker is started as sys.executable."""
    out: list[tuple[str, str]] = []
    for p in [*paths, sys.executable]:
        p = os.path.abspath(p)
        cur = "/"
        for part in Path(p).parts[1:]:
            nxt = os.path.join(cur, part)
            if os.path.islink(nxt):
                target = os.path.realpath(nxt)
                if (nxt, target) not in out:
                    out.append((nxt, target))
                cur = target
            else:
                cur = nxt
    return out


def _bind_list(paths: Sequence[str]) -> list[Path]:
    """Resolved, de-duplicated bind sources; refuses any that would expose a secret path."""
    out: list[Path] = []
    for p in paths:
        path = Path(p).resolve()
        if not path.exists():
            continue
        for secret in SECRET_PATHS:
            if path == secret or path.is_relative_to(secret) or secret.is_relative_to(path):
                raise SandboxError(f"refusing to show {path} to a worker: it contains or is inside {secret}")
        out.append(path)
    out.sort(key=lambda x: (len(x.parts), str(x)))
    kept: list[Path] = []
    for path in out:  # a path inside one already bound needs no bind of its own
        if not any(path == k or path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def _make_traversable(path: Path, gid: int | None = None) -> None:
    """Private temp folders (the engine's submission copy) are 0700, and a strict umask makes their
    files 0600; the worker's uid must read them. Only trees under the temp directory that this user
    owns are touched, never made writable: with `gid` (uid mode) they are given to the worker's
    group (g+rX, nothing for others: another judge slot's uid cannot read them); without it
    (bubblewrap mode, nothing else is mounted) they are made world-readable. Anything else must
    already be readable."""
    try:
        st = path.stat()
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    if gid is None and st.st_mode & stat.S_IXOTH and st.st_mode & stat.S_IROTH:
        return
    # the engine's private copies only: never the instructor's own tree or interpreter, even where
    # those live under the temp directory too (a checkout or CI clone in /tmp)
    ours = [ROOT.resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    in_tmp = (path.is_relative_to(Path(tempfile.gettempdir()).resolve()) and st.st_uid == os.getuid()
              and not any(path == o or path.is_relative_to(o) for o in ours))
    if gid is not None and not in_tmp:
        if st.st_mode & stat.S_IXOTH and st.st_mode & stat.S_IROTH:
            return
        raise SandboxError(f"{path} is not readable by the sandbox user; make it world-readable")
    if not in_tmp:
        raise SandboxError(f"{path} is not readable by the sandbox user; make it world-readable")
    if gid is not None and st.st_gid == gid and st.st_mode & 0o050 == 0o050:
        return  # done for an earlier worker
    dir_bits, file_bits = (0o050, 0o040) if gid is not None else (0o055, 0o044)

    def fix(p: str, bits: int) -> None:
        s = os.lstat(p)
        if stat.S_ISLNK(s.st_mode):
            return
        if gid is not None:
            os.chown(p, -1, gid)
            os.chmod(p, (s.st_mode | bits) & ~0o007 & ~0o020)
        else:
            os.chmod(p, s.st_mode | bits)

    fix(str(path), dir_bits)
    for top, dirs, files in os.walk(path):
        for d in dirs:
            fix(os.path.join(top, d), dir_bits)
        for f in files:
            fix(os.path.join(top, f), file_bits)


def _check_ancestors(path: Path) -> None:
    """Every folder above a path the worker reads must let "others" traverse it (uid mode: no
    mount namespace gives the worker fresh ones, as bubblewrap does)."""
    for anc in path.parents:
        try:
            mode = anc.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            raise SandboxError(f"{anc} (mode {stat.S_IMODE(mode):o}) is not traversable by the sandbox uid, "
                               f"and {path} below it is needed by every worker; install Python and the venv "
                               f"elsewhere, or allow traversal only: chmod o+x {anc}")


def hide_instructor_files(paths: Sequence[Path] | None = None) -> list[str]:
    """Close the instructor's secret folders to "others" (mode o-rwx): the uid mode's file-permission
    layer, under Landlock or without it. Only folders this user owns; returns those changed."""
    changed = []
    for p in paths if paths is not None else secret_paths():
        try:
            st = p.stat()
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_mode & 0o007:
            try:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o007)
            except OSError:  # e.g. a read-only file system: the self-test then decides (Landlock may hold)
                continue
            changed.append(str(p))
    return changed


class SandboxError(RuntimeError):
    """The sandbox cannot be built as asked (one line, says what to do)."""


# ---------------------------------------------------------------------------------------------
# detection and self-test

_SELF_TEST = r"""
import json, os, socket, sys
cfg = json.loads(sys.argv[1])
bad = []
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close(); bad.append("network reachable")
except OSError:
    pass
for p in cfg["unreadable"]:
    try:
        os.listdir(p) if os.path.isdir(p) else open(p, "rb").close(); bad.append("readable: " + p)
    except OSError:
        pass
for p in cfg["unwritable"]:
    try:
        open(os.path.join(p, ".sandbox-probe-%d" % os.getpid()), "w").close(); bad.append("writable: " + p)
    except OSError:
        pass
for p in cfg["readable"]:
    try:
        open(p, "rb").close()
    except OSError as e:
        bad.append("cannot read %s: %s" % (p, e))
for p in cfg["writable"]:
    try:
        open(os.path.join(p, "probe"), "w").close()
    except OSError as e:
        bad.append("private scratch %s not writable: %s" % (p, e))
try:
    pid = os.fork()
    if pid == 0: os._exit(0)
    os.waitpid(pid, 0); fork = "fork allowed"
except OSError:
    fork = "fork refused"
try:
    os.close(os.memfd_create("probe")); memfd = "memfd allowed"
except OSError:
    memfd = "memfd refused"
print("SANDBOX-OK" if not bad else "SANDBOX-BAD " + "; ".join(bad), fork, memfd, "uid=%d" % os.getuid())
"""


def _run_probe(box: Sandbox, probe_dir: Path) -> tuple[bool, str]:
    """Start the self-test through the box, with the paths a worker gets (this interpreter's, through
    their unresolved spellings too), and check each promise of the mode."""
    from autograder.engine.paths import worker_trees

    paths = [str(probe_dir), *map(str, worker_trees(ROOT)), sys.base_prefix, sys.prefix, *_site_dirs()]
    try:  # making the box's paths reachable (chown, chmod) may fail, e.g. an unmapped gid in a user namespace
        if box.kind == "uid":
            cfg = box.confinement(paths)
            argv = [sys.executable, "-I", "-S", str(CONFINE), json.dumps(cfg)]
            scratch = cfg["scratch"]
        else:
            argv, scratch = box.prefix(paths), "/tmp"
    except OSError as e:
        box.sweep()
        return False, f"could not set up its paths ({type(e).__name__}: {e})"
    checks = {"unreadable": [], "unwritable": [str(probe_dir)], "writable": [scratch] if box.kind != "uid" else [],
              "readable": [str(ROOT / "course" / "__init__.py"), str(ENGINE_DIR / "worker.py")]}
    if box.isolating:
        checks["unreadable"] = [str(p) for p in secret_paths()]
        checks["unwritable"] += [str(ROOT / "course"), str(ROOT), "/root"]
        if box.kind == "bubblewrap" or box.landlock_abi:
            checks["unwritable"] += ["/tmp", "/dev/shm", "/var/tmp", scratch] if box.kind == "uid" else []
            checks["unreadable"] += [f"/proc/{os.getpid()}/cmdline"] if box.kind == "uid" else []
    argv += [sys.executable, "-I", "-S", "-c", _SELF_TEST, json.dumps(checks)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        box.sweep()
    out = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode != 0 or not out.startswith("SANDBOX-OK"):
        err = (r.stderr.strip().splitlines() or [out or f"exit status {r.returncode}"])[-1]
        return False, (out if out.startswith("SANDBOX-BAD") else err)[:300]
    if box.seccomp and "fork refused" not in out:
        return False, "the seccomp filter did not refuse fork"
    if box.seccomp and "memfd refused" not in out:
        return False, "the seccomp filter did not refuse memfd_create"
    if box.uid is not None and f"uid={box.uid}" not in out:
        return False, f"the worker did not run as uid {box.uid}"
    return True, out


def _site_dirs() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _probe_dir() -> tempfile.TemporaryDirectory:
    d = tempfile.TemporaryDirectory(prefix="sandbox-probe-")
    os.chmod(d.name, 0o755)
    return d


def _try_bubblewrap(seccomp, limits) -> tuple[Sandbox | None, str]:
    bwrap = shutil.which(os.environ.get(ENV_BWRAP) or "bwrap")
    if not bwrap:
        return None, "bwrap not found; install the Debian package bubblewrap"
    setpriv = shutil.which("setpriv") if os.getuid() == 0 else None
    with _probe_dir() as d:
        box = Sandbox("bubblewrap", limits, bwrap, setpriv, seccomp, UID_BASE + 99 if setpriv else None, "bubblewrap")
        ok, why = _run_probe(box, Path(d))
        if not ok and box.uid is not None:  # retry without the uid drop before giving up
            first = why
            box = Sandbox("bubblewrap", limits, bwrap, None, seccomp, None, "bubblewrap")
            ok, why = _run_probe(box, Path(d))
            # both reasons: the first is the one to fix (setpriv where the sandbox does not mount it, say);
            # the retry without the uid drop fails for a reason of its own (root inside the sandbox)
            why = f"with setpriv's uid drop ({setpriv}): {first}; without it: {why}"
    return (replace(box, uid=None) if ok else None), f"bwrap failed its self-test: {why}"


def _try_uid(seccomp, limits) -> tuple[Sandbox | None, str]:
    if os.getuid() != 0:
        return None, "the unprivileged-uid sandbox needs the grader to run as root (to drop to another uid)"
    if not seccomp:
        return None, f"no seccomp filter for this architecture ({platform.machine()})"
    from autograder.engine import confine

    abi = confine.landlock_abi()
    hide_instructor_files()
    how = f"Landlock ABI {abi}" if abi else "file permissions only, no Landlock on this kernel: not isolating"
    box = Sandbox(f"unprivileged-uid ({how})", limits, None, None, seccomp, UID_BASE + 99, "uid", abi)
    with _probe_dir() as d:
        try:
            ok, why = _run_probe(box, Path(d))
        except SandboxError as e:
            ok, why = False, str(e)
    box.uid, box.spool = None, None
    return (box if ok else None), f"the unprivileged-uid sandbox failed its self-test: {why}"


_claimed: dict[int, tuple[int, int]] = {}  # preferred uid -> (the uid this process holds, its lock's fd)


def claim_uid(preferred: int) -> int:
    """A sandbox uid that no other grading process on this machine uses while this one lives: `preferred`,
    or the first of preferred + 100, + 200, ... whose lock (an flock on UID_LOCKS/uid-N.lock, released when
    the process ends, however it ends) is free. Two batches at once (two shards in two terminals, or a test
    suite run in parallel) would otherwise run their workers as the same uid: one's sweep would delete the
    other's files, their processes would share one RLIMIT_NPROC, and a worker of one could reach what a
    worker of the other left. Not root, or no lock folder that only root can write: `preferred` (the uid is
    then not used as root's sandbox uid anyway, or the machine cannot say which are free)."""
    import fcntl

    hit = _claimed.get(preferred)
    if hit is not None:
        return hit[0]
    if os.geteuid() != 0:
        return preferred
    try:
        os.makedirs(UID_LOCKS, mode=0o755, exist_ok=True)
        st = os.lstat(UID_LOCKS)
    except OSError:
        return preferred
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        return preferred  # someone else's folder: its locks prove nothing
    for k in range(UID_TRIES):
        uid = preferred + k * UID_STRIDE
        fd = os.open(os.path.join(UID_LOCKS, f"uid-{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _claimed[preferred] = (uid, fd)
        return uid
    raise RuntimeError(f"every sandbox uid from {preferred} in steps of {UID_STRIDE} is in use by another grading "
                       f"process ({UID_TRIES} tried); wait for one to finish")


def detect(prefer: str = "auto") -> Sandbox:
    """The strongest sandbox that passes its self-test here, or the rlimits-only fallback, whose mode
    says why. prefer: auto, bubblewrap, uid (bubblewrap is then not tried) or rlimits (forced).
    The environment variable GRADER_SANDBOX overrides "auto". Use require() to fail closed.
    Cached per mode and environment (the self-test runs once per process)."""
    if prefer == "auto":
        prefer = os.environ.get(ENV_MODE, "auto") or "auto"
    return _detect(prefer, os.environ.get(ENV_BWRAP, ""))


@lru_cache(maxsize=None)
def _detect(prefer: str, _bwrap_env: str) -> Sandbox:
    if prefer not in MODES:
        raise SandboxError(f"unknown sandbox mode {prefer!r}; choose one of {', '.join(MODES)}")
    seccomp = no_fork_filter()
    limits = SandboxLimits()
    reasons = []
    if prefer == "rlimits":
        reasons.append("forced by the caller")
    if prefer in ("auto", "bubblewrap"):
        box, why = _try_bubblewrap(seccomp, limits)
        if box:
            return box
        reasons.append(why)
    if prefer in ("auto", "uid"):
        box, why = _try_uid(seccomp, limits)
        if box:  # (in auto mode: say why bubblewrap was not the one, in every result and summary)
            return replace(box, passed_over=f"bubblewrap: {reasons[0]}") if reasons else box
        reasons.append(why)
    box = Sandbox(f"rlimits-only ({'; '.join(reasons)})", limits, None, None, seccomp, None, "rlimits")
    if seccomp:  # without isolation only the launcher's part can be checked: is fork refused?
        with _probe_dir() as d:
            _, out = _run_probe(box, Path(d))
        if "fork refused" not in out:
            box.seccomp = None
    return box


def require(mode: str = "auto", allow_weak: bool = False,
            to_accept: str = "pass --allow-weak-sandbox") -> Sandbox:
    """detect(mode), failing closed: raises SandboxError (one line) unless the result isolates the
    worker (bubblewrap or unprivileged-uid) and is the mode asked for, or allow_weak accepts a weaker
    one: the strongest mode this machine has (bubblewrap asked for but missing: unprivileged-uid where
    it passes its self-test, else rlimits-only). mode "rlimits" itself needs allow_weak. to_accept: how
    the channel's user accepts a weaker mode (named in the refusal)."""
    box = detect(mode)
    want = os.environ.get(ENV_MODE, "auto") if mode == "auto" else mode
    # a mode the environment asked for, not the channel: say so, the fix may be to unset it
    by_env = f" (set by {ENV_MODE}={want}: unset it for the default)" if mode == "auto" and want != "auto" else ""
    if box.isolating and (want in ("auto", box.kind)):
        return box
    if want == "rlimits" and not allow_weak:
        raise SandboxError(f"refusing to grade: sandbox mode 'rlimits'{by_env} isolates nothing (resource limits and "
                           f"the process filter only); {to_accept} to grade with it")
    best = _detect("auto", os.environ.get(ENV_BWRAP, "")) if not box.isolating and want != "rlimits" else box
    if allow_weak:  # the mode asked for is not here: the strongest that is
        return best if best.isolating else box
    why = box.mode.removeprefix("rlimits-only (").removesuffix(")") if box.mode.startswith("rlimits-only (") else box.mode
    weaker = f"in the strongest mode this machine has, {best.mode}" if best.isolating else "with resource limits only"
    raise SandboxError(f"refusing to grade: sandbox mode {want!r}{by_env} is not available here: {why}; fix that, or "
                       f"{to_accept} to grade {weaker}")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m instructor.sandbox", description=__doc__.split("\n")[0])
    ap.add_argument("--mode", "--prefer", choices=MODES, default="auto", dest="mode")
    ap.add_argument("--allow-weak-sandbox", action="store_true")
    args = ap.parse_args(argv)
    try:
        box = require(args.mode, args.allow_weak_sandbox)
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(box.describe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
