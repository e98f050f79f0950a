"""Confinement of one worker process: what runs between its start and the first line of student code.

Standard library only, no package imports: it runs in the sandbox launcher (`python -I -S`, before
anything else) and in a worker freshly forked by a fork server (zygote.py: the judge's own in the
uid and rlimits modes, or the one inside a bubblewrap sandbox, where it replaces what the launcher
and bwrap's --seccomp give a directly started worker). A config (plain JSON, built by
instructor/sandbox.py) says what to do, in this order:

1. rlimits (only ever lowered): processes, open files, file size, core dumps, locked memory;
2. scratch: a private folder created here (mode 0700, owned by the worker's uid) for HOME/TMPDIR
   (and the working directory, with "chdir": the bubblewrap fork server's workers, as bwrap's own);
3. uid/gid: drop to an unprivileged uid with no supplementary groups (only when running as root);
4. no_new_privs, then Landlock (Linux >= 5.13, unprivileged): the worker may read ONLY the listed
   trees, write only its scratch folder, make no TCP connection and signal no process outside;
5. seccomp: the BPF program of instructor/sandbox.py (no new processes, no memfd/shm, no
   sockets but AF_UNIX, no namespace or mount calls).

Every step that the config asks for and that fails raises ConfineError: the worker never runs
with less confinement than asked.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 4, 38, 22, 2
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446  # same numbers on every architecture
_LL_RULE_PATH_BENEATH, _LL_RULE_NET_PORT = 1, 2
_LL_CREATE_RULESET_VERSION = 1
# filesystem rights, by the Landlock ABI that introduced them
_FS_ABI1 = (1 << 13) - 1  # execute, write_file, read_file, read_dir, remove_*, make_*
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1, 2, 4, 8
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV  # all a regular file can have
_NET_ALL = 1 | 2  # bind_tcp, connect_tcp (ABI 4)
_SCOPE_ALL = 1 | 2  # abstract unix sockets, signals (ABI 6)


class ConfineError(OSError):
    """A confinement step failed; the worker must not run."""


def _err(what: str) -> ConfineError:
    e = ctypes.get_errno()
    return ConfineError(e, f"sandbox: {what} failed ({os.strerror(e)})")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when unavailable (old kernel, disabled, or refused by seccomp)."""
    v = _libc.syscall(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_CREATE_RULESET_VERSION))
    return max(int(v), 0)


def set_rlimits(rlimits: dict) -> None:
    inf = resource.RLIM_INFINITY
    for name, value in rlimits.items():
        if value is None or value < 0:
            continue
        r = getattr(resource, name)
        soft, hard = resource.getrlimit(r)
        hard = value if hard == inf else min(hard, value)
        resource.setrlimit(r, (min(value, hard), hard))


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise ConfineError(1, f"sandbox: could not drop to uid {uid}")


def landlock(read: list[str], write: list[str], abi: int) -> int:
    """Allow reading (and executing) beneath `read`, everything beneath `write`, nothing else; no TCP
    (ABI >= 4), no signals or abstract sockets outside the domain (ABI >= 6). Returns the ABI used."""
    fs = _FS_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) | (_FS_IOCTL_DEV if abi >= 5 else 0)
    attr = struct.pack("=Q", fs)
    if abi >= 4:
        attr += struct.pack("=Q", _NET_ALL)
    if abi >= 6:
        attr += struct.pack("=Q", _SCOPE_ALL)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _libc.syscall(_LL_CREATE, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _err("landlock_create_ruleset")
    try:
        for paths, rights in ((read, _EXECUTE | _READ_FILE | _READ_DIR), (write, fs)):
            for p in paths:
                try:
                    fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path that does not exist needs no rule
                try:
                    is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
                    allowed = rights if is_dir else rights & _FILE_RIGHTS & fs
                    rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                    if _libc.syscall(_LL_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LL_RULE_PATH_BENEATH),
                                     rule, ctypes.c_uint32(0)) != 0:
                        raise _err(f"landlock_add_rule({p})")
                finally:
                    os.close(fd)
        if _libc.syscall(_LL_RESTRICT, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _err("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): die when the parent does (the launcher, and the fork server in a
    sandbox: a uid change clears bwrap's --die-with-parent, and the signal comes only where bwrap may
    still signal it, not under setpriv; there the engine kills it itself, processes.Zygote.close)."""
    import signal

    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise _err("prctl(PR_SET_PDEATHSIG)")


def set_dumpable(on: bool) -> None:
    """PR_SET_DUMPABLE: a process that is not dumpable cannot be opened by others of its uid (its
    memory, its fds, its /proc files belong to root): the fork server inside a sandbox (zygote.py)."""
    if _libc.prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise _err("prctl(PR_SET_DUMPABLE)")


class _Prog(ctypes.Structure):
    """struct sock_fprog."""
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install_seccomp(bpf: bytes, every_thread_nr: int | None = None) -> None:
    """Install the BPF program on this thread (prctl), or, given the seccomp syscall's number, on every
    thread of the process (seccomp(2) with TSYNC: threads made before it get it too)."""
    prog = _Prog(len(bpf) // 8, bpf)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _err("prctl(PR_SET_NO_NEW_PRIVS)")
    if every_thread_nr is None:
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            raise _err("installing the seccomp filter")
        return
    r = _libc.syscall(ctypes.c_long(every_thread_nr), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if r != 0:
        raise _err("installing the seccomp filter on every thread") if r < 0 else ConfineError(
            1, f"sandbox: thread {r} could not take the seccomp filter")


# clone, clone3 and seccomp per architecture (the sandbox's full filter is instructor/sandbox.py's; this
# one only stacks on it): AUDIT_ARCH_*, clone, clone3, seccomp
_CLONE_NR = {"x86_64": (0xC000003E, 56, 435, 317), "aarch64": (0xC00000B7, 220, 435, 277)}
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1


def seccomp_active() -> bool:
    """Whether a seccomp filter already confines this process (a sandbox's: /proc/self/status says 2)."""
    try:
        with open("/proc/self/status") as f:
            return any(line.split(":")[0] == "Seccomp" and line.split()[1] == "2" for line in f)
    except (OSError, IndexError):
        return False


def refuse_threads() -> bool:
    """Stack a seccomp filter that refuses every new thread (clone: EAGAIN, clone3: ENOSYS) on this
    process for the rest of its life. A worker computes on one torch thread; a thread it could start
    is a write to machine-wide counters (the kernel's count of forks in /proc/stat, the next PID)
    that a later worker could read: hidden inputs encoded in how many threads were started. Returns
    False where there is no syscall table for this machine (nothing installed)."""
    import platform

    entry = _CLONE_NR.get(platform.machine())
    if entry is None or sys.byteorder != "little" or not sys.platform.startswith("linux"):
        return False
    arch, clone, clone3, seccomp = entry
    allow, errno_ret = 0x7FFF0000, 0x00050000
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, allow),  # another ABI: the outer filter's
            (0x20, 0, 0, 0),
            (0x15, 0, 1, clone3), (0x06, 0, 0, errno_ret | 38),  # ENOSYS
            (0x15, 0, 1, clone), (0x06, 0, 0, errno_ret | 11),  # EAGAIN
            (0x06, 0, 0, allow)]
    # every thread of the process, not only this one (prctl's filter is the caller's alone): the threads
    # made before it (scenarios/threads.py's spares, where student code runs too) get it as well
    install_seccomp(b"".join(struct.pack("=HBBI", *ins) for ins in prog), every_thread_nr=seccomp)
    return True


def apply(cfg: dict) -> None:
    """All confinement steps of `cfg` (see the module docstring), in order. Sets HOME/TMPDIR to the
    scratch folder when there is one."""
    set_rlimits(cfg.get("rlimits", {}))
    uid, gid = cfg.get("uid"), cfg.get("gid")
    scratch = cfg.get("scratch")
    if scratch:
        if cfg.get("scratch_owner") == "root":  # a folder to stand in, not to write (the uid mode)
            os.mkdir(scratch, 0o711)
        else:
            os.mkdir(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, gid)
        os.environ["HOME"] = os.environ["TMPDIR"] = scratch
        if cfg.get("chdir"):
            os.chdir(scratch)
    if uid is not None:
        drop_privileges(int(uid), int(gid))
    if cfg.get("landlock"):
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _err("prctl(PR_SET_NO_NEW_PRIVS)")
        ll = cfg["landlock"]
        writable = [scratch] if scratch and ll.get("scratch_write", True) else []
        landlock(ll["read"], [*ll.get("write", []), *writable], int(ll["abi"]))
    bpf = bytes.fromhex(cfg.get("seccomp") or "")
    if bpf:
        install_seccomp(bpf)


def launch(argv: list[str]) -> None:
    """The sandbox launcher: `python -I -S confine.py CONFIG_JSON argv...` (see instructor/sandbox.py).
    Dies with the judge that started it; applies the config and execs argv, or, in bubblewrap mode,
    runs bwrap as its child (the filter goes to bwrap on a pipe) and dies of the worker's signal."""
    import signal

    die_with_parent()
    cfg, argv = json.loads(argv[0]), argv[1:]
    if cfg.get("mode") != "bwrap":
        try:
            apply(cfg)
        except OSError as e:
            sys.exit(f"sandbox launcher: {e.strerror or e}")
        os.execvp(argv[0], argv)
    set_rlimits(cfg.get("rlimits", {}))
    bpf = bytes.fromhex(cfg.get("seccomp") or "")
    if bpf:
        rd, wr = os.pipe()
        os.write(wr, bpf)
        os.close(wr)
        os.set_inheritable(rd, True)
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


if __name__ == "__main__":
    launch(sys.argv[1:])
