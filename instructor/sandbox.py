"""The sandbox around the grading engine's worker processes (batch grading, Gradescope, nbgrader).

The engine starts each worker as `prefix + [python, -I, -S, -c, bootstrap]`; this module builds
that prefix. The judge (pytest, the references, the verdict) stays outside. Two modes:

"bubblewrap"  (`bwrap`, Debian package bubblewrap) — the worker sees a private file system:
    read-only binds of the Python installation, the venv, the course package, the engine's worker
    files, the scenario code and the submission's private copy; nothing else of the instructor's
    tree (no solutions/, no autograder/tests/, no other submission, no output folder). A private
    size-capped tmpfs /tmp, no network (--unshare-net), its own PID, IPC and UTS namespaces, a new
    session (no terminal injection), no capabilities, and --die-with-parent. When `uid` is given
    the worker also drops to that unprivileged uid (setpriv), so root-owned files are off limits.
"rlimits-only (<reason>)" — used where bubblewrap is missing or fails its self-test: resource
    limits alone. The worker can then read whatever the grading user can read; every report says so.

Both modes add, through a small launcher run in front of everything:
- a seccomp filter that refuses new processes (fork, vfork, clone without CLONE_THREAD; clone3 is
  answered ENOSYS so that glibc falls back to clone for threads) and a few kernel interfaces a
  worker never needs (unshare, setns, ptrace, mount, bpf, perf_event_open, keyctl, ...). This is
  the fork-bomb defence: RLIMIT_NPROC alone does not bind root, and we grade as root;
- RLIMIT_NPROC / RLIMIT_NOFILE / RLIMIT_CORE / RLIMIT_MEMLOCK. Memory (RLIMIT_AS), CPU time and
  file size are the engine's own per-worker limits (autograder.engine Limits), set in the worker's
  bootstrap; the launcher leaves them alone so the engine can still set them.

`python -m instructor.sandbox` runs the self-test and prints the mode this machine gets.
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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
# Instructor paths a worker must never see (checked against every bind, in both directions).
SECRET_PATHS = (ROOT / "solutions", ROOT / "instructor", ROOT / "autograder" / "tests")


@dataclass(frozen=True)
class SandboxLimits:
    """What the launcher sets (the engine sets memory, CPU time and file size itself)."""

    nproc: int = 64  # processes + threads of the sandbox uid (the worker uses 1 torch thread)
    nofile: int = 256  # open files
    memlock_bytes: int = 64 << 10
    tmp_bytes: int = 64 << 20  # size of the private /tmp (bubblewrap mode)


# ---------------------------------------------------------------------------------------------
# seccomp: "no new processes" as a classic BPF program (struct sock_filter[]), built here so that
# no library is needed. Syscall numbers per architecture; other architectures get no filter.

_ARCH = {  # machine -> (AUDIT_ARCH_*, {syscall: nr})
    "x86_64": (0xC000003E, dict(fork=57, vfork=58, clone=56, clone3=435, unshare=272, setns=308, ptrace=101,
                                mount=165, umount2=166, pivot_root=155, chroot=161, bpf=321,
                                perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248,
                                request_key=249, kexec_load=246)),
    "aarch64": (0xC00000B7, dict(clone=220, clone3=435, unshare=97, setns=268, ptrace=117, mount=40,
                                 umount2=39, pivot_root=41, chroot=51, bpf=280, perf_event_open=241,
                                 userfaultfd=282, keyctl=219, add_key=217, request_key=218, kexec_load=104)),
}
_EPERM, _EAGAIN, _ENOSYS = 1, 11, 38
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_CLONE_THREAD = 0x00010000


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
    # clone: a thread (CLONE_THREAD in flags = args[0], low word at offset 16) is fine, a process not
    prog += [jeq(nr["clone"], 0, 4), ld(16), jset(_CLONE_THREAD, 0, 1), ret(_RET_ALLOW), ret(_RET_ERRNO | _EAGAIN)]
    for name in ("unshare", "setns", "ptrace", "mount", "umount2", "pivot_root", "chroot", "bpf",
                 "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load"):
        prog += [jeq(nr[name], 0, 1), ret(_RET_ERRNO | _EPERM)]
    prog.append(ret(_RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# The launcher: `python -I -S -c LAUNCHER CONFIG_JSON argv...`. Standard library only, nothing
# from the course: it runs before anything is sandboxed. It
# - dies with the judge that started it (PR_SET_PDEATHSIG), so no worker outlives its judge (the
#   signal fires when the judge THREAD that started it ends: start workers from a long-lived thread);
# - sets the limits (only ever lower);
# - without bubblewrap: installs the seccomp program itself and execs the worker;
# - with bubblewrap: hands the program to bwrap on a pipe (--seccomp FD; bwrap applies it to the
#   worker after setting up the namespaces), runs bwrap as its child and, when the worker was
#   killed by a signal (bwrap reports that as exit status 128+N), dies of the same signal, so the
#   judge sees "crashed (signal 11, SIGSEGV)" rather than "exited with status 139".
LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL, 0, 0, 0)
cfg = json.loads(sys.argv[1]); argv = sys.argv[2:]
INF = resource.RLIM_INFINITY
lo = lambda a, b: b if a == INF else a if b == INF else min(a, b)
for name, value in cfg["rlimits"].items():
    r = getattr(resource, name); soft, hard = resource.getrlimit(r)
    resource.setrlimit(r, (lo(soft, value), lo(hard, value)))
bpf = bytes.fromhex(cfg.get("seccomp") or "")
if cfg["mode"] != "bwrap":
    if bpf:
        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        prog = Prog(len(bpf) // 8, bpf)
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
            sys.exit("sandbox launcher: could not install the seccomp filter (errno %d)" % ctypes.get_errno())
    os.execvp(argv[0], argv)
if bpf:
    rd, wr = os.pipe(); os.write(wr, bpf); os.close(wr); os.set_inheritable(rd, True)
    argv = [str(rd) if a == "@SECCOMP_FD@" else a for a in argv]
pid = os.fork()
if pid == 0:
    os.execvp(argv[0], argv)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)  # only bwrap holds the judge's pipes: they close exactly when the sandbox ends
if bpf:
    os.close(rd)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
sig = -code if code < 0 else code - 128 if 128 < code < 128 + 65 else 0
if sig:
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
os._exit(code & 0xFF)
"""


# ---------------------------------------------------------------------------------------------


@dataclass
class Sandbox:
    """A worker_prefix factory. `mode` is what every report shows ("bubblewrap" or
    "rlimits-only (<reason>)"); `process_limit` says how new processes are refused."""

    mode: str
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    bwrap: str | None = None
    setpriv: str | None = None
    seccomp: bytes | None = None
    uid: int | None = None  # unprivileged uid for the worker (bubblewrap mode, when grading as root)

    @property
    def process_limit(self) -> str:
        if self.seccomp:
            return "seccomp filter: no fork/clone of new processes"
        if self.uid is not None:
            return f"RLIMIT_NPROC={self.limits.nproc} for uid {self.uid}"
        return "none beyond the engine's time limit (no seccomp on this architecture)"

    def describe(self) -> dict:
        return {"sandbox": self.mode, "process_limit": self.process_limit,
                "uid": self.uid if self.bwrap else None, "limits": self.limits.__dict__}

    def with_uid(self, uid: int | None) -> "Sandbox":
        return Sandbox(self.mode, self.limits, self.bwrap, self.setpriv, self.seccomp,
                       uid if (self.bwrap and self.setpriv) else None)

    # the engine calls this with the paths the worker needs (readable), once per worker start
    def __call__(self, paths: Sequence[str]) -> list[str]:
        return self.prefix(paths)

    def prefix(self, paths: Sequence[str]) -> list[str]:
        rl = {"RLIMIT_NOFILE": self.limits.nofile, "RLIMIT_CORE": 0, "RLIMIT_MEMLOCK": self.limits.memlock_bytes}
        if self.uid is not None or not self.bwrap:
            rl["RLIMIT_NPROC"] = self.limits.nproc
        cfg = {"rlimits": rl, "seccomp": (self.seccomp or b"").hex(), "mode": "bwrap" if self.bwrap else "plain"}
        launcher = [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(cfg)]
        if not self.bwrap:
            return launcher
        return launcher + self._bwrap_argv(paths)

    def _bwrap_argv(self, paths: Sequence[str]) -> list[str]:
        binds = _bind_list(paths)
        argv = [self.bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox",
                "--cap-drop", "ALL",
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
        argv += ["--proc", "/proc", "--dev", "/dev", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--chdir", "/tmp"]
        if self.seccomp:
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


def _make_traversable(path: Path) -> None:
    """Private temp folders (the engine's submission copy) are 0700, and a strict umask makes their
    files 0600; the worker's uid must read them. Only trees under the temp directory that this user
    owns are touched (made world-readable, never writable); anything else must already be readable."""
    try:
        st = path.stat()
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXOTH and st.st_mode & stat.S_IROTH:
        return
    if not (path.is_relative_to(Path(tempfile.gettempdir()).resolve()) and st.st_uid == os.getuid()):
        raise SandboxError(f"{path} is not readable by the sandbox user; make it world-readable")
    os.chmod(path, st.st_mode | 0o055)
    for top, dirs, files in os.walk(path):
        for d in dirs:
            p = os.path.join(top, d)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o055)
        for f in files:
            p = os.path.join(top, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o044)


class SandboxError(RuntimeError):
    """The sandbox cannot be built as asked (one line, says what to do)."""


# ---------------------------------------------------------------------------------------------
# detection and self-test

_SELF_TEST = r"""
import os, socket, sys
secret, bound = sys.argv[1], sys.argv[2]
bad = []
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close(); bad.append("network reachable")
except OSError:
    pass
if os.path.exists(secret): bad.append("secret path visible: " + secret)
try:
    open(os.path.join(bound, ".sandbox-probe"), "w").close(); bad.append("bound folder writable")
except OSError:
    pass
try:
    open("/tmp/probe", "w").close()
except OSError as e:
    bad.append("private /tmp not writable: %s" % e)
try:
    pid = os.fork()
    if pid == 0: os._exit(0)
    os.waitpid(pid, 0); fork = "fork allowed"
except OSError:
    fork = "fork refused"
print("SANDBOX-OK" if not bad else "SANDBOX-BAD " + "; ".join(bad), fork, "uid=%d" % os.getuid())
"""


def _run_probe(box: Sandbox, probe_dir: Path) -> tuple[bool, str]:
    argv = box.prefix([str(probe_dir), sys.base_prefix, sys.prefix]) + [
        sys.executable, "-I", "-S", "-c", _SELF_TEST, str(SECRET_PATHS[0]), str(probe_dir)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{type(e).__name__}: {e}"
    out = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode != 0 or not out.startswith("SANDBOX-OK"):
        err = (r.stderr.strip().splitlines() or [out or f"exit status {r.returncode}"])[-1]
        return False, (out if out.startswith("SANDBOX-BAD") else err)[:200]
    if box.seccomp and "fork refused" not in out:
        return False, "the seccomp filter did not refuse fork"
    if box.uid is not None and f"uid={box.uid}" not in out:
        return False, f"the worker did not run as uid {box.uid}"
    return True, out


@lru_cache(maxsize=None)
def detect(prefer: str = "auto") -> Sandbox:
    """The strongest sandbox that passes its self-test here. prefer="rlimits" forces the fallback
    (e.g. for comparison runs); the reason then says so."""
    seccomp = no_fork_filter()
    limits = SandboxLimits()
    reason = "forced by the caller" if prefer == "rlimits" else None
    if reason is None:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            reason = "bwrap not found; install the Debian package bubblewrap"
        else:
            setpriv = shutil.which("setpriv") if os.getuid() == 0 else None
            with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as d:
                os.chmod(d, 0o755)
                box = Sandbox("bubblewrap", limits, bwrap, setpriv, seccomp, 65534 if setpriv else None)
                ok, why = _run_probe(box, Path(d))
                if not ok and box.uid is not None:  # retry without the uid drop before giving up
                    box = Sandbox("bubblewrap", limits, bwrap, None, seccomp, None)
                    ok, why = _run_probe(box, Path(d))
                if ok:
                    return box
                reason = f"bwrap failed its self-test: {why}"
    box = Sandbox(f"rlimits-only ({reason})", limits, None, None, seccomp, None)
    if seccomp:  # without bubblewrap only the launcher's part can be checked: is fork refused?
        with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as d:
            _, out = _run_probe(box, Path(d))
        if "fork refused" not in out:
            box.seccomp = None
    return box


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m instructor.sandbox", description=__doc__.split("\n")[0])
    ap.add_argument("--prefer", choices=["auto", "rlimits"], default="auto")
    args = ap.parse_args(argv)
    box = detect(args.prefer)
    print(json.dumps(box.describe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
