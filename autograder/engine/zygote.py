"""Fork server for workers: imports torch and the course package once, then forks fresh workers.

Starting a worker is mostly `import torch` (1–3 s). The judge starts a zygote process (`python -I
-S`, like a worker) and asks it over a Unix socket for each new worker: the judge creates the
worker's three pipes and passes their ends with SCM_RIGHTS; the zygote forks; the child makes
itself a session leader, closes every other descriptor, sets its resource limits, moves the pipes to
fds 0/1/2, applies the sandbox's confinement (confine.py: uid, Landlock, seccomp, scratch folder)
and runs worker.main() exactly as a directly started worker would. The zygote never imports or runs
student code; it only forks, reaps, kills its children when asked and reports exit statuses.

Two kinds (processes.Zygote):
- the judge's own, one per judge process: without a sandbox, or with one that a forked worker
  applies to itself (instructor/sandbox.py's uid and rlimits modes);
- one INSIDE a bubblewrap sandbox (Sandbox.fork_server): bubblewrap's private file system cannot be
  entered by a forked process, so the server runs in it. A judge keeps such servers across the
  submissions it grades (processes.SandboxServers: one serves the sets whose results are shown, one
  the hidden sets), so the sandbox binds no submission: each worker's graded files come with its
  spawn request as descriptors the judge opened, and the server writes them below the scratch (_install)
  before it forks. Its config then has a "sandbox" entry, and the server also
  * checks its sandbox before it serves (_self_check): it is not root, it is PID 1, every mount but
    the scratch tmpfs (and /proc, /dev/pts and the device nodes) is read-only, the scratch is empty,
    and a probe child confined as a worker is cannot fork nor write outside the scratch. Otherwise
    it answers "not ready" with the reason, and the judge starts that submission's workers directly;
  * keeps no signal handler: PID 1 of a namespace receives no signal from inside it that it does not
    handle, so no worker can stop, kill or interrupt it; and it is not dumpable, so no worker can
    read or write its memory or its /proc files (they belong to root then);
  * serves ONE worker at a time, and empties the scratch tmpfs, the only place a worker can write,
    when a worker dies and again before each fork (after killing and reaping any child still alive).
    If the scratch cannot be emptied it refuses to fork, and the judge starts the worker directly.

Every server (both kinds) also refuses a fork, and stops serving, once its own resource limits,
priority, scheduling policy or CPU affinity are not what they were when it started (_own_state): a
forked worker inherits them, so a worker that changed them (the seccomp filter refuses that already)
would set the limits of the next submissions' workers.
"""
from __future__ import annotations

import json
import os
import re
import resource
import select
import signal
import socket
import stat
import sys
import time

from . import protocol

_SANDBOX: dict | None = None  # the config's "sandbox" entry when this server runs inside one
_HANDLERS: dict[int, object] = {}  # the Python signal handlers a fresh interpreter has (inside a sandbox)
_LIVE: set[int] = set()  # forked workers not reaped yet
_WIPE_BUDGET = 100_000  # entries a dead worker may leave in the scratch; beyond, the server stops forking
_CODE_FILES, _CODE_BYTES = 16, 16 << 20  # a spawn request's graded files (a submission has 6, each <= 1 MiB)
_CODE_ROOT = re.compile(r"code-[0-9a-f]{16}")  # the folder below the scratch that holds a worker's files
_CODE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\.py")


def _child(fds: list[int], req: dict, sock: socket.socket) -> None:
    try:
        os.setsid()
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        # the server's other descriptors (its own pipes to the judge, what torch opened) are not the worker's
        os.closerange(3, max(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 256))
        for sig, handler in _HANDLERS.items():  # what a directly started interpreter has (SIGINT, SIGPIPE)
            signal.signal(sig, handler)
        for name, value in req.get("rlimits", {}).items():
            if value >= 0:
                resource.setrlimit(getattr(resource, name), (value, value))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req.get("env", {}))
        if req.get("confine"):
            # the sandbox (uid, Landlock, seccomp, scratch): applied here, before any student code; a
            # step that fails ends the worker before it runs anything
            from . import confine

            try:
                confine.apply(req["confine"])
            except Exception as e:  # noqa: BLE001
                os.write(2, f"sandbox: could not confine the worker: {e}\n".encode())
                os._exit(70)
        elif _SANDBOX is not None:
            os.write(2, b"sandbox: no confinement given for a worker of the fork server in the sandbox\n")
            os._exit(70)
        from . import worker

        worker.main()
    finally:
        os._exit(0)


def _warm_up() -> None:
    """What every worker's first call would pay, paid once here before the forks: the scenario
    modules (shipped grader code, trusted) and a first recorded op (torch's lazy kernel and dispatch
    set-up). Nothing here touches a submission."""
    import importlib

    import torch

    for name in ("tracing", "part1", "part2", "part3", "part4", "part5", "part6"):
        try:
            importlib.import_module(f"autograder.scenarios.{name}")
        except Exception:  # noqa: BLE001 -- a warm-up only; the worker imports it again when used
            pass
    try:
        from autograder.scenarios.tracing import record_call

        x = torch.ones(2, 2)
        record_call(lambda t: (t @ t).exp().sum(-1), [x], x)
        # autograd with an explicit gradient (part 4's scenarios): its first use imports
        # torch.fx.experimental.symbolic_shapes and sympy, ~0.2 s of CPU in every forked worker
        y = (x.clone().requires_grad_() * 2).sum(-1)
        y.backward(torch.ones_like(y))
    except Exception:  # noqa: BLE001
        pass


# ---------------------------------------------------------------------------------------------
# inside a bubblewrap sandbox


def _enter_sandbox(box: dict) -> None:
    """Before anything else: die with bwrap, no signal handlers (PID 1 then receives no signal from
    its namespace: its workers) and not dumpable (no worker may open its memory or write its /proc
    files)."""
    global _SANDBOX
    from . import confine

    _SANDBOX = box
    confine.die_with_parent()  # bwrap, outside; the judge's socket closing ends it too (main)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(sig)
        if handler not in (None, signal.SIG_DFL):
            _HANDLERS[sig] = handler
            signal.signal(sig, signal.SIG_DFL)
    confine.set_dumpable(False)


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, file-system type, mount options) of every mount this process sees."""
    def unescape(s: str) -> str:  # mountinfo writes space, tab, newline and backslash as \\ooo
        out, i = [], 0
        while i < len(s):
            if s[i] == "\\" and s[i + 1:i + 4].isdigit():
                out.append(chr(int(s[i + 1:i + 4], 8)))
                i += 4
            else:
                out.append(s[i])
                i += 1
        return "".join(out)

    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            found.append((unescape(fields[4]), right.split()[0], fields[5].split(",")))
    return found


def _wipe(top: str, budget: int = _WIPE_BUDGET) -> str | None:
    """Remove everything below `top`; None once it is empty, else why it is not. Called only while no
    worker is alive, so nothing changes under the walk: an entry that lstat calls a folder is one
    (symbolic links are removed, never followed). A folder a worker closed even to its owner (mode
    000) is opened up first; the server has the workers' uid."""
    stack, seen = [top], 0
    try:
        while stack:
            path = stack[-1]
            if path != top:  # top is the tmpfs itself (mode 1777, not the server's to chmod)
                os.chmod(path, 0o700)
            subdirs = []
            with os.scandir(path) as it:
                for entry in it:
                    seen += 1
                    if seen > budget:
                        return f"more than {budget} files were left in it"
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.path)
                    else:
                        os.unlink(entry.path)
            if subdirs:
                stack.extend(subdirs)
                continue
            stack.pop()
            if path != top:
                os.rmdir(path)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None if not os.listdir(top) else "it is not empty after the wipe"


def _probe(cfg: dict) -> str | None:
    """Fork a child, confine it as a worker (cfg: Sandbox.forked_confinement) and check that it cannot
    fork (when there is a seccomp filter) nor write outside its scratch folder. None when it holds."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            from . import confine

            confine.apply(cfg)
            code = 2
            if cfg.get("seccomp"):
                try:
                    if os.fork() == 0:
                        os._exit(0)
                except OSError:
                    code = 3
            else:
                code = 3
            if code == 3:
                code = 4
                for outside in ("/", "/tmp", "/dev"):
                    try:
                        open(os.path.join(outside, ".probe"), "w").close()
                        os._exit(4)
                    except OSError:
                        pass
                code = 5
                with open(os.path.join(cfg["scratch"], "probe"), "w") as f:
                    f.write("x")
                code = 0
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    why = _wipe(_SANDBOX["scratch"])
    problems = {1: "a worker could not be confined", 2: "a confined worker could still fork",
                4: "a confined worker could write outside its scratch folder",
                5: "a confined worker could not write its scratch folder"}
    if code:
        return problems.get(code, f"the probe worker ended with status {code}")
    return f"the probe's scratch could not be emptied: {why}" if why else None


def _self_check(box: dict) -> str | None:
    """Why this sandbox may not host a fork server (see the module docstring), or None."""
    scratch = box["scratch"]
    if os.getuid() == 0 or os.geteuid() == 0:
        return "it would run as root inside the sandbox (its workers could write its /proc files)"
    if os.getpid() != 1:
        return "it is not the PID 1 of its sandbox"
    for point, fstype, options in _mounts():
        if "ro" in options or point == scratch or fstype in ("proc", "devpts"):
            continue  # /proc: per-process files (the server's own are root's); devpts: terminals
        try:
            device = stat.S_ISCHR(os.stat(point).st_mode)  # /dev/null and the other device nodes
        except OSError:
            device = False
        if not device:
            return f"{point} is writable ({fstype}); only {scratch} may be"
    try:
        if os.listdir(scratch):
            return f"{scratch} is not empty"
    except OSError as e:
        return f"{scratch}: {e.strerror or e}"
    return _probe(box["probe"])


def _install(code: object, fds: list[int]) -> str | None:
    """Write one worker's graded files below the scratch (inside a sandbox, right before its fork):
    `code` = {"root": SCRATCH/code-<16 hex>, "package": name, "files": [name.py, ...]}, and `fds` the
    files' descriptors, opened by the judge, in that order. None once written, else why not (the
    server then refuses the fork). Nothing is followed but the judge's own descriptors: the folder is
    made here, in the scratch this server emptied a moment ago."""
    if type(code) is not dict:
        return "the request's code is not a dict"
    root, package, names = code.get("root"), code.get("package"), code.get("files")
    if not (type(root) is str and os.path.dirname(root) == _SANDBOX["scratch"]
            and _CODE_ROOT.fullmatch(os.path.basename(root))):
        return "the request's code folder is not a fresh folder of the scratch"
    if not (type(package) is str and package.isidentifier() and type(names) is list
            and len(names) == len(fds) <= _CODE_FILES
            and all(type(n) is str and _CODE_NAME.fullmatch(n) for n in names) and len(set(names)) == len(names)):
        return "the request's code files are malformed"
    left = _CODE_BYTES
    try:
        os.mkdir(root, 0o755)
        os.mkdir(os.path.join(root, package), 0o755)
        for name, fd in zip(names, fds):
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                left -= len(chunk)
                if left < 0:
                    return f"the submission's files are larger than {_CODE_BYTES >> 20} MiB"
                chunks.append(chunk)
            data = memoryview(b"".join(chunks))
            out = os.open(os.path.join(root, package, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                while data:  # (a write may take only part of it)
                    data = data[os.write(out, data):]
            finally:
                os.close(out)
    except OSError as e:
        return f"the submission's files could not be written ({e.strerror or e})"
    return None


def _own_state() -> tuple:
    """What a process of the workers' uid could change in this server and so pass on to every worker it
    forks later: its resource limits, priority, scheduling policy and CPU affinity. The workers' seccomp
    filter refuses those calls on any process but the caller (instructor/sandbox.py); the server checks
    before each fork that they are what they were when it started all the same."""
    names = sorted(n for n in dir(resource) if n.startswith("RLIMIT_"))
    return (tuple(resource.getrlimit(getattr(resource, n)) for n in names), os.getpriority(os.PRIO_PROCESS, 0),
            os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, tuple(sorted(os.sched_getaffinity(0))))


def _kill_all(statuses: dict[int, int]) -> None:
    """Kill and reap every worker still alive (inside a sandbox: one worker at a time)."""
    for pid in sorted(_LIVE):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            statuses[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            pass
        _LIVE.discard(pid)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    header, _ = protocol.read_frame(0)
    cfg = header["config"]
    box = cfg.get("sandbox")
    if box:
        _enter_sandbox(box)
    sys.path[:] = [p for p in cfg["sys_path"] if isinstance(p, str)]
    sys.dont_write_bytecode = True
    started = time.perf_counter()
    import faulthandler  # noqa: F401  (imported here so children need not)

    import torch
    import torch.utils._python_dispatch  # noqa: F401  (the tracer's imports, shared by every worker)
    import torch.utils.flop_counter  # noqa: F401

    torch.set_num_threads(1)
    import course  # noqa: F401
    from . import confine, worker  # noqa: F401  (forked workers need no file access for these)
    _warm_up()
    import gc

    gc.freeze()  # the imports' objects: never walked by a collection, and their pages stay shared after fork
    if box:
        try:
            why = _self_check(box)
        except Exception as e:  # noqa: BLE001 -- a check that cannot run has not passed
            why = f"{type(e).__name__}: {e}"
        if why:
            protocol.write_frame(1, {"ok": False, "ready": False, "reason": why})
            os._exit(0)
    protocol.write_frame(1, {"ok": True, "ready": True, "pid": os.getpid(), "startup_s": time.perf_counter() - started})
    statuses: dict[int, int] = {}
    state = _own_state()  # checked before every fork

    def reap() -> None:
        died = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            statuses[pid] = os.waitstatus_to_exitcode(status)
            _LIVE.discard(pid)
            died = True
        if died and _SANDBOX is not None and not _LIVE:
            _wipe(_SANDBOX["scratch"])  # what it left goes now; checked again before the next fork

    while True:
        readable, _, _ = select.select([sock], [], [], 0.5)
        reap()
        if not readable:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3 + _CODE_FILES)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the judge is gone
        req = json.loads(msg)
        if req["op"] == "spawn":
            pipes, files = fds[:3], fds[3:]  # the worker's stdin, stdout, stderr; its graded files
            why = None
            if _SANDBOX is not None:
                _kill_all(statuses)
                why = _wipe(_SANDBOX["scratch"])
                if why:  # never fork a worker where the last one's files could still be read
                    why = f"the scratch folder could not be emptied: {why}"
            if why is None and _own_state() != state:  # never fork a worker with what an earlier one set
                why, state = "the fork server's limits or scheduling are not what they were when it started", None
            if why is None and _SANDBOX is not None and "code" in req:
                why = _install(req["code"], files)
            for fd in files:  # (the judge's own server: its workers read the submission's copy)
                os.close(fd)
            if why:
                for fd in pipes:
                    os.close(fd)
                sock.send(json.dumps({"error": why}).encode())
                if state is None:
                    os._exit(0)  # it serves no more: the judge starts a fresh one, or the workers directly
                continue
            pid = os.fork()
            if pid == 0:
                _child(pipes, req, sock)
            _LIVE.add(pid)
            for fd in pipes:
                os.close(fd)
            sock.send(json.dumps({"pid": pid}).encode())
        elif req["op"] == "status":
            pid, deadline = int(req["pid"]), time.monotonic() + float(req.get("wait", 0))
            while True:
                reap()
                if pid in statuses or time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
            sock.send(json.dumps({"pid": pid, "status": statuses.pop(pid, None)}).encode())
        elif req["op"] == "kill":  # the judge cannot signal a worker in another PID namespace itself
            pid = int(req["pid"])
            if pid in _LIVE:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
            sock.send(b'{"ok": true}')
        else:
            sock.send(b'{"error": "unknown op"}')
