"""Fork server for workers: imports torch and the course package once, then forks fresh workers.

Starting a worker is mostly `import torch` (1–3 s). Without a sandbox, or with one that a forked
worker can apply to itself (instructor/sandbox.py's uid and rlimits modes), the judge starts ONE
zygote process (`python -I -S`, like a worker) and asks it over a Unix socket for
each new worker: the judge creates the worker's three pipes and passes their ends with
SCM_RIGHTS; the zygote forks; the child makes itself a session leader, sets its resource limits,
moves the pipes to fds 0/1/2, applies the sandbox's confinement (confine.py: uid, Landlock,
seccomp) and runs worker.main() exactly as a directly started worker would.
The zygote never imports or runs student code; it only forks, reaps and reports exit statuses.
"""
from __future__ import annotations

import json
import os
import resource
import select
import socket
import sys
import time

from . import protocol


def _child(fds: list[int], req: dict, sock: socket.socket) -> None:
    try:
        os.setsid()
        sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for name, value in req.get("rlimits", {}).items():
            if value >= 0:
                resource.setrlimit(getattr(resource, name), (value, value))
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req.get("env", {}))
        if req.get("confine"):
            # the sandbox (uid, Landlock, seccomp): applied here, before any student code; a step
            # that fails ends the worker before it runs anything
            from . import confine

            try:
                confine.apply(req["confine"])
            except Exception as e:  # noqa: BLE001
                os.write(2, f"sandbox: could not confine the worker: {e}\n".encode())
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
    except Exception:  # noqa: BLE001
        pass


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    header, _ = protocol.read_frame(0)
    cfg = header["config"]
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
    protocol.write_frame(1, {"ok": True, "ready": True, "pid": os.getpid(), "startup_s": time.perf_counter() - started})
    statuses: dict[int, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            statuses[pid] = os.waitstatus_to_exitcode(status)

    while True:
        readable, _, _ = select.select([sock], [], [], 0.5)
        reap()
        if not readable:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the judge is gone
        req = json.loads(msg)
        if req["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(fds, req, sock)
            for fd in fds:
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
        else:
            sock.send(b'{"error": "unknown op"}')
