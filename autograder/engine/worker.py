"""The worker process: runs the student's code, and nothing that decides a grade.

Started by the judge as ``python -I -S -c <bootstrap>`` (isolated mode, no site module, so no
user site-packages, no sitecustomize/usercustomize and no PYTHON* variables), with its own
process group and resource limits. The bootstrap puts a private library folder first on sys.path
(this module, protocol.py, and links to `course` and `autograder.scenarios`); the judge then sends
a config frame with the rest of sys.path (the interpreter's site-packages) and the submission
folder, which holds ONLY the graded files, as a package under a fixed private name.

File descriptors: the protocol uses private duplicates of fd 0 and fd 1, taken before any
student code runs. fd 0 then reads /dev/null and fd 1 and fd 2 both go to the judge's output
pipe, which the judge caps; so neither `print` nor C code writing to fd 1 can corrupt the
protocol stream.
"""
from __future__ import annotations

import io
import os
import sys
import time
import traceback
from typing import Any

from . import protocol

PACKAGE = "_graded_submission"  # the fixed private package name of the submission
_PACKAGE_DIR = "/nonexistent"  # set from the config: stripped from messages
_MEMORY_MB = 0  # set from the config: named in out-of-memory messages


def _setup_fds() -> tuple[int, int]:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)  # student stdout -> the output pipe (fd 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="replace")
    return proto_in, proto_out


class ImportFailed(Exception):
    """A graded file could not be imported (syntax error, missing import, exit at import...)."""


class WorkerStudent:
    """What a scenario (autograder/scenarios/partN.py) gets as `student`, inside the worker."""

    def __init__(self, modules: list[str]) -> None:
        self._modules = set(modules)
        self.allowed: set[str] = set(self._modules)  # narrowed per request to the part's files

    def module(self, name: str):
        """The imported student module `name` (e.g. "kv_cache")."""
        import importlib

        name = name.removesuffix(".py")
        if name not in self._modules:
            raise LookupError(f"{name!r} is not a graded file (graded: {sorted(self._modules)})")
        if name not in self.allowed:
            raise LookupError(f"scenario bug: this part may not use {name}.py (add it to `uses` in the rubric)")
        qualified = f"{PACKAGE}.{name}"
        if qualified in sys.modules:
            return sys.modules[qualified]
        try:
            return importlib.import_module(qualified)
        except BaseException as exc:  # noqa: BLE001 -- SystemExit at import time included
            detail = f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] in self._modules:
                detail += f" (import the other graded files relatively: from .{exc.name} import ...)"
            sys.modules.pop(qualified, None)
            raise ImportFailed(f"importing {name}.py failed: {detail}") from exc

    def function(self, target: str):
        """The student object at "module.attr[.attr...]"."""
        module, _, rest = target.partition(".")
        obj = self.module(module)
        for part in rest.split(".") if rest else []:
            if part.startswith("__"):
                raise LookupError(f"refusing to look up the private name {part!r}")
            obj = getattr(obj, part)
        return obj


def _student_frame(tb) -> tuple[str, int, str] | None:
    """(file name, line, function) of the innermost frame in the submission, if any."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        mod = frame.f_globals.get("__name__", "")
        if isinstance(mod, str) and mod.startswith(PACKAGE + "."):
            found = (os.path.basename(frame.f_code.co_filename), lineno, frame.f_code.co_qualname)
    return found


def _out_of_memory(exc: BaseException | None) -> bool:
    """MemoryError (numpy's included), or torch's allocator failing under the address-space limit."""
    return exc is not None and (isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)
                                or "not enough memory" in str(exc))


def _describe(exc: BaseException) -> dict:
    where = _student_frame(exc.__traceback__)
    if isinstance(exc, SystemExit):
        kind, message = "exit", f"called sys.exit({exc.code!r})"
    elif isinstance(exc, NotImplementedError):
        kind, message = "not_implemented", str(exc)
    elif isinstance(exc, protocol.NotPlainData):
        kind, message = "not_plain", str(exc)
    elif _out_of_memory(exc):
        import re

        asked = re.search(r"allocate (\d+) bytes", str(exc))
        size = f" while allocating {int(asked.group(1)) / 2**30:.1f} GiB" if asked else ""
        cause = exc.__cause__ if isinstance(exc, ImportFailed) and exc.__cause__ is not None else exc
        kind, message = "memory", f"ran out of memory{size} ({type(cause).__name__}; the worker's limit is {_MEMORY_MB} MB)"
        if isinstance(exc, ImportFailed):  # "importing x.py failed: ran out of memory ..."
            message = f"{str(exc).split(':', 1)[0]}: {message}"
    else:
        kind, message = "exception", str(exc)
    if isinstance(exc, ImportFailed):
        kind = "import"
        where = where or _student_frame(exc.__cause__.__traceback__ if exc.__cause__ else None)
    message = message.replace(_PACKAGE_DIR + os.sep, "").replace(f"{PACKAGE}.", "")
    return {
        "kind": kind,
        "type": type(exc).__name__,
        "message": message[:2000],
        "where": list(where) if where else None,
        # also true when importing a graded file ran out of memory: the judge counts it as a loss
        "memory": _out_of_memory(exc) or _out_of_memory(exc.__cause__),
        "traceback": "".join(traceback.format_exception(exc))[-6000:],
    }


def _seed_generators() -> None:
    """The same random streams before every request: a submission that draws unseeded numbers (torch,
    random, numpy) gets the same ones in every grading of it, so regrading gives the same grade."""
    import random

    import torch

    random.seed(0)
    # the CPU generator (what torch.rand* use here): torch.manual_seed would also queue a lazy seeding
    # of every accelerator backend, each with a formatted stack (~0.3 ms per request, and a list that grows)
    torch.default_generator.manual_seed(0)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(0)


SPARE_THREADS = 4  # a part-1 counted call runs in one; one its code never lets go of is lost


def main() -> None:
    proto_in, proto_out = _setup_fds()
    header, _ = protocol.read_frame(proto_in)
    cfg = header["config"]
    global _PACKAGE_DIR, _MEMORY_MB
    _PACKAGE_DIR = str(cfg.get("package_dir", _PACKAGE_DIR))
    _MEMORY_MB = int(cfg.get("memory_mb", 0))
    sys.path[:] = [p for p in cfg["sys_path"] if isinstance(p, str)]
    sys.dont_write_bytecode = True
    started = time.perf_counter()
    import faulthandler

    faulthandler.enable(file=sys.stderr)  # a segfault prints where it happened into the output pipe
    import torch

    torch.set_num_threads(int(cfg.get("threads", 1)))
    # torch.empty's memory is NaN (the largest int, True) instead of what the allocator held: a call that
    # reads memory it never wrote gives the same answer every time, and the one the judge's replay gives
    # (replay.fill_unwritten); every CPU op this kit allows has a deterministic kernel (warn_only: a
    # warning, never an error, if one had not). The switch itself: torch.use_deterministic_algorithms
    # would also import torch._inductor (and dynamo, which wants a writable temp dir a uid-mode worker
    # does not have, and half a second) only to set a compiler flag no worker uses
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    if cfg.get("preload"):
        import course  # noqa: F401  (the course package is trusted; import it before any student code)
    import gc

    gc.freeze()  # torch's objects: no collection walks them again (a forked worker inherits the zygote's)
    if int(cfg.get("threads", 1)) == 1:  # one torch thread: no new thread from here on (confine.py)
        from autograder.scenarios import threads

        from . import confine

        threads.start(SPARE_THREADS)  # what scenarios may run student code in (scenarios/threads.py)
        try:
            confine.refuse_threads()
        except OSError:
            # a kernel that takes no filter: fatal under a sandbox (its own filter is there), not for
            # the unsandboxed local grade of a student's own code
            if confine.seccomp_active():
                raise
    student = WorkerStudent(cfg["modules"])
    protocol.write_frame(proto_out, {"ok": True, "ready": True, "pid": os.getpid(),
                                     "startup_s": time.perf_counter() - started})
    while True:
        try:
            request, buffers = protocol.read_frame(proto_in)
        except EOFError:
            os._exit(0)
        op, rid = request.get("op"), request.get("id")
        if op == "exit":
            os._exit(0)
        try:
            result: Any = None
            if op == "modules":
                result = sorted(n.split(".", 1)[1] for n in list(sys.modules) if n.startswith(PACKAGE + "."))
            else:
                args = protocol.decode_value(request["args"], buffers)
                kwargs = protocol.decode_value(request["kwargs"], buffers)
                target = request["target"]
                student.allowed = {str(m).removesuffix(".py") for m in request.get("allowed", [])}
                _seed_generators()
                if op == "call":
                    fn = student.function(target)
                    result = fn(*args, **kwargs)
                elif op == "scenario":
                    import importlib

                    module, _, name = target.rpartition(".")
                    fn = getattr(importlib.import_module(f"autograder.scenarios.{module}"), name)
                    result = fn(student, **kwargs)
                else:
                    raise ValueError(f"unknown op {op!r}")
            tree, out_buffers = protocol.encode_value(result)
            reply, reply_buffers = {"id": rid, "ok": True, "value": tree}, out_buffers
            if sum(len(b) for b in out_buffers) > protocol.MAX_PAYLOAD:
                raise protocol.NotPlainData(f"the result is larger than {protocol.MAX_PAYLOAD >> 30} GiB")
        except BaseException as exc:  # noqa: BLE001 -- everything the student raises is reported
            result = None  # drop references to a large result before answering
            reply, reply_buffers = {"id": rid, "ok": False, "error": _describe(exc)}, []
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
        protocol.write_frame(proto_out, reply, reply_buffers)


if __name__ == "__main__":
    main()
