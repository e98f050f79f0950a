"""Judge side of the judge/worker split: the `student` proxy and the Engine of one grading run.

The judge (this process: pytest, references, checks, the verdict) never imports student code and
never unpickles anything: it talks to worker processes (workers.py) over pipes in the plain-data
format of protocol.py. Split by responsibility: errors.py (StudentError), limits.py (Limits),
submission.py (the private copy of the graded files), workers.py (processes and the pool).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import deps, memory, protocol, sanitize, transcripts
from .errors import StudentError
from .limits import Limits
from .paths import AUTOGRADER_DIR, ENGINE_DIR, REPO_ROOT
from .submission import MAX_SOURCE_BYTES, SubmissionCopy, prepare_submission
from .processes import Lost, WorkerPool, WorkerPrefix, Zygote, _Output, call_label

__all__ = ["AUTOGRADER_DIR", "ENGINE_DIR", "REPO_ROOT", "MAX_SOURCE_BYTES", "Engine", "Limits", "StudentError",
           "StudentProxy", "SubmissionCopy", "WorkerPool", "WorkerPrefix", "Zygote", "prepare_submission"]


# The test sets run in this order: public tests, then the diagnoses of hidden failures (fixed probe
# inputs, runner.GradingPlugin.run_diagnoses), then hidden tests. A later set may learn what an earlier
# one saw, never the reverse: from public to diagnosis the worker goes on (the pairs below); the hidden
# tests get a new one. The sets whose results are shown (a public test's output, a diagnosis's hint)
# get their workers from a fork server that never forked a worker of any other set, in any submission
# (processes.SandboxServers); any set not named here counts as hidden.
_WORKER_MAY_GO_ON = {("public", "diagnosis")}
_SHOWN_SETS = frozenset({"public", "diagnosis"})


class PartState:
    """A part's lost calls (the worker timed out, crashed, flooded its output, ran out of memory or
    broke the protocol): after Limits.max_losses the part's remaining calls are not run."""

    _WHAT = {"timeout": "timed out", "crash": "crashed", "exit": "exited", "output": "flooded the output",
             "memory": "ran out of memory", "protocol": "broke the protocol", "reply": "sent too much data"}

    def __init__(self) -> None:
        self.losses = 0
        self.kinds: dict[str, int] = {}

    def lose(self, kind: str) -> None:
        self.losses += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def said(self) -> str:
        """E.g. '3 earlier calls were lost (timed out 2×, flooded the output 1×)'."""
        how = ", ".join(f"{self._WHAT.get(k, 'lost the worker')} {n}×" for k, n in self.kinds.items())
        return f"{self.losses} earlier call{'s' if self.losses != 1 else ''} {'were' if self.losses != 1 else 'was'} lost ({how})"


class StudentProxy:
    """The `student` fixture: calls into the submission, in the worker, for one test of one part.

        student.call("flash_forward.flash_forward", q, k, v, causal=True)
        student.scenario("part5.cached_logits", steps=4)
        student.with_timeout(60).call(...)        # a longer limit for one slow call
        student.source("online_softmax.py")       # the submitted text (judge-side, never executed)
    """

    def __init__(self, engine: "Engine", part: int, test_id: str, timeout: float | None = None,
                 test_set: str = "public") -> None:
        self._engine, self.part, self.test_id = engine, part, test_id
        self._timeout, self.test_set = timeout, test_set

    @property
    def hidden(self) -> bool:
        """True in a hidden case and in a hidden failure's diagnosis: checks and probes then leave the
        inputs and the submission's own messages out of what they say."""
        return self.test_set != "public"

    def with_timeout(self, seconds: float) -> "StudentProxy":
        return StudentProxy(self._engine, self.part, self.test_id, seconds, self.test_set)

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        return self._engine.request(self, "call", target, args, kwargs, self._timeout)

    def scenario(self, target: str, **kwargs: Any) -> Any:
        return self._engine.request(self, "scenario", target, (), kwargs, self._timeout)

    @property
    def memo(self) -> dict:
        """Measurements the tests of this grading run share (one submission's; a new run starts empty)."""
        return self._engine.memo

    def shares_state(self) -> None:
        """This test's verdict reads something its own calls did not bring: a measurement another test or
        an earlier grade made and a cache kept. Its pass is then never reused (engine/transcripts.py)."""
        t = self._engine.transcript
        if t is not None and t.test_id == self.test_id:
            t.spoil()

    def source(self, filename: str) -> str:
        text = self._engine.sub.present.get(filename)
        t = self._engine.transcript
        if t is not None and t.test_id == self.test_id:  # the text is a reply too (transcripts.py)
            t.add(transcripts.read(filename, text, self._engine.sub.problems.get(filename)), b"")
        if text is None:
            raise StudentError(self._engine.sub.problems.get(filename, f"{filename} is missing from the submission"),
                               kind="missing", target=filename)
        return text


class Engine:
    """Everything the judge needs for one grading run: submission copy, worker pool, per-part rules."""

    def __init__(self, sub: SubmissionCopy, rubric: "Any", limits: Limits, prefix: WorkerPrefix,
                 refused: dict[int, str], overrides: dict | None = None) -> None:
        self.sub, self.rubric, self.refused = sub, rubric, refused
        self.base_limits, self.overrides = limits, dict(overrides or {})
        modules = sorted(n.removesuffix(".py") for n in rubric.all_files())
        self.pool = WorkerPool(sub, modules, limits, prefix)
        self.parts: dict[tuple[int, bool], PartState] = {}  # (part, diagnosis?) -> losses of its calls
        self.outputs: dict[str, _Output] = {}  # test id -> output of its calls
        self.worker_set: str | None = None  # the test set the current worker has served
        self.worker_part: int | None = None  # ... and the part
        self.started = time.perf_counter()  # Limits.grade_budget_s counts from here
        self.part_spent: dict[int, float] = {}  # wall time of each part's finished tests and diagnoses
        self._clock: tuple[int, float] | None = None  # (part, since when) of the test or diagnosis running
        self.transcript: transcripts.Transcript | None = None  # the running test's events (transcripts.py)
        self.memo: dict = {}  # what this run's tests share (StudentProxy.memo); never another run's
        self._reached: dict[int, set[str]] = {}  # part -> deps.reach

    def start_clock(self, part: int) -> None:
        """A test or diagnosis of `part` starts: its wall time counts toward the part's budget."""
        self.stop_clock()
        self._clock = (part, time.perf_counter())

    def stop_clock(self) -> None:
        if self._clock is not None:
            part, since = self._clock
            self.part_spent[part] = self.part_spent.get(part, 0.0) + time.perf_counter() - since
            self._clock = None

    def part_time(self, part: int) -> float:
        """The wall time `part` has taken so far in this grade (Limits.part_budgets)."""
        running = time.perf_counter() - self._clock[1] if self._clock is not None and self._clock[0] == part else 0.0
        return self.part_spent.get(part, 0.0) + running

    def reached(self, part: int) -> set[str]:
        """The graded files part `part` can run (deps.reach), worked out once per part."""
        found = self._reached.get(part)
        if found is None:
            found = self._reached[part] = deps.reach(self.rubric, part, self.sub.present)
        return found

    def code_for(self, part: int) -> Path:
        """The folder part `part`'s workers import from: the graded files it reaches, no others, which is
        what its reused result is keyed on (reuse.part_key); every file where one worker serves all parts."""
        files = self.reached(part) if self.limits_for(part).worker_per_part else self.sub.present
        return self.sub.code_for(files)

    def limits_for(self, part: int) -> Limits:
        # rubric defaults < the part's limits in the rubric < explicit overrides of grade()
        return self.base_limits.updated(**self.rubric.part(part).limits).updated(**self.overrides)

    def request(self, proxy: StudentProxy, op: str, target: str, args: tuple, kwargs: dict,
                timeout: float | None) -> Any:
        """One call into the submission, for the test `proxy` stands for: its decoded value, or a
        StudentError. The running test's transcript gets the event (what was asked, what came back)."""
        t = self.transcript
        if t is None or t.test_id != proxy.test_id:
            return self._request(proxy, op, target, args, kwargs, timeout, None)
        what = transcripts.asked(op, target, args, kwargs)
        got: list[bytes] = []
        losses = sum(s.losses for s in self.parts.values())
        try:
            value = self._request(proxy, op, target, args, kwargs, timeout, got)
        except StudentError as error:
            t.lost(error)
            if sum(s.losses for s in self.parts.values()) > losses:  # e.g. an exception flagged as out of memory
                t.spoil()
            t.add(what, transcripts.raised(error))  # raises Reused where a stored pass ends so
            raise
        except BaseException:
            t.spoil()
            raise
        if not got:  # (every reply the judge decodes has its digest; none: never kept, never matched)
            t.spoil()
        t.add(what, got[0] if got else b"")
        return value

    def _request(self, proxy: StudentProxy, op: str, target: str, args: tuple, kwargs: dict,
                 timeout: float | None, got: list[bytes] | None) -> Any:
        part_rule = self.rubric.part(proxy.part)
        limits = self.limits_for(proxy.part)
        allowed = part_rule.reachable_modules()
        if op == "call":
            module = target.split(".", 1)[0]
            if module not in allowed:
                raise RuntimeError(f"test bug: part {proxy.part} may only call its own files "
                                   f"{sorted(allowed)} (and `uses` in the rubric), not {target!r}")
            needed = [module + ".py"]
        else:
            needed = part_rule.files
        label = call_label(op, target, kwargs)  # a recorded call is named by the student's function
        name = label.rsplit(".", 1)[-1]
        if proxy.part in self.refused:
            raise StudentError(self.refused[proxy.part], kind="refused", target=target)
        for f in needed:
            if f in self.sub.problems:
                raise StudentError(self.sub.problems[f], kind="missing", target=target)
        step = (self.worker_set, proxy.test_set)
        new_set = self.worker_set not in (None, proxy.test_set) and step not in _WORKER_MAY_GO_ON
        new_part = limits.worker_per_part and self.worker_part not in (None, proxy.part)
        if new_set or new_part:
            # A worker that saw hidden inputs never serves a public call (whose output is shown) nor a
            # diagnosis (whose hint is shown), nor the other way round: no state passes between the
            # sets, across parts too. Nor does a worker serve two parts (Limits.worker_per_part). The
            # sandbox also clears what the old worker left in shared folders.
            self.pool.discard(spare=False)
            sweep = getattr(self.pool.prefix, "sweep", None)
            if callable(sweep):
                sweep()
        self.worker_set, self.worker_part = proxy.test_set, proxy.part
        # A fork server inside the sandbox (bubblewrap) keeps counters a worker can leave (the next
        # PID, its CPU time): the shown sets' workers come from one that no hidden worker came from.
        self.pool.shown = proxy.test_set in _SHOWN_SETS
        # Diagnoses count their losses apart, so that they never cost a test a point, and may lose one
        # call per part (a ladder stops at its first loss; a hanging submission then costs one time
        # limit per part, not one per diagnosis); they give up where the part's tests have.
        tests = self.parts.setdefault((proxy.part, False), PartState())
        state = self.parts.setdefault((proxy.part, True), PartState()) if proxy.test_set == "diagnosis" else tests
        if tests.losses >= limits.max_losses or (state is not tests and state.losses >= 1):
            lost = tests if tests.losses >= limits.max_losses else state
            raise StudentError(f"not run: in part {proxy.part}, {lost.said()}", kind="gave_up", target=label)
        timeout = timeout or limits.call_timeout_s
        budget = limits.part_budgets.get(str(proxy.part)) if isinstance(limits.part_budgets, dict) else None
        if isinstance(budget, (int, float)) and budget > 0:
            left = budget - self.part_time(proxy.part)
            if left <= 0:
                raise StudentError(f"not run: part {proxy.part}'s time budget of {budget:g} s is spent (its earlier "
                                   "calls and the grader's checks of them took it: a correct solution takes a small "
                                   "part of that)", kind="gave_up", target=label)
            timeout = min(timeout, left)
        if limits.grade_budget_s > 0:
            left = limits.grade_budget_s - (time.perf_counter() - self.started)
            if left <= 0:
                raise StudentError(f"not run: the grade's time budget of {limits.grade_budget_s:g} s is spent "
                                   "(earlier calls took it)", kind="gave_up", target=label)
            timeout = min(timeout, left)
        sink = self.outputs.setdefault(proxy.test_id, _Output(limits.output_keep_bytes, limits.output_cap_bytes))
        sink.total = 0  # the cap applies per call; `data` keeps accumulating up to `keep`
        spare = state.losses + 1 < limits.max_losses  # a replacement only if this part may call again
        memory.set_bound(limits.judge_memory_mb)  # also what replay.py checks during this call's replays
        self.pool.code = self.code_for(proxy.part)
        try:
            reply, buffers = self.pool.request(op, target, args, kwargs, timeout, sink, [m + ".py" for m in allowed],
                                               spare=spare)
        except Lost as lost:
            state.lose(lost.kind)
            raise StudentError(str(lost), kind=lost.kind, target=label, function=name) from None
        if not reply.get("ok"):
            error = self._named_absent(_student_error(reply.get("error"), target, name))
            if error.kind == "memory" or (type(reply.get("error")) is dict and reply["error"].get("memory") is True):
                # A call that hit the memory limit is a loss like a timeout: a bomb in every call
                # would otherwise cost every call its allocation time. The worker is replaced too.
                state.lose("memory")
                self.pool.discard(spare)
            raise error
        if got is not None:
            got.append(transcripts.answered(reply.get("value"), buffers))
        try:
            value = protocol.decode_value(reply.get("value"), buffers)
        except protocol.ProtocolError as e:
            raise StudentError(f"{target} returned malformed data ({e})", kind="protocol", target=target) from None
        del reply, buffers
        used = memory.over_bound()
        if used is not None:
            # Each reply is capped (Limits.reply_cap_mb); this bounds what the replies add up to while
            # the judge keeps them (a test holds its results, a scenario its records).
            del value
            state.lose("reply")
            raise StudentError(f"{name}'s reply left the judge holding {memory.describe(used)}: return only "
                               "the result the function documents (no extra tensors), and keep no results "
                               "from one call for the next", kind="reply", target=label, function=name)
        return value

    def _named_absent(self, error: StudentError) -> StudentError:
        """An import that failed on a graded file the submission lacks (missing, or not accepted: a
        syntax error, say) says which and why, instead of Python's "No module named 'x'"."""
        import re

        m = re.search(r"No module named '(?:[\w.]*\.)?(\w+)'", str(error)) if error.kind == "import" else None
        problem = self.sub.problems.get(f"{m[1]}.py") if m else None
        if problem is None:
            return error
        return StudentError(f"{str(error).split(':', 1)[0]}: it imports {m[1]}.py, and {problem}", kind="import",
                            target=error.target, function=error.function, where=error.where, exc_type=error.exc_type)

    def close(self) -> None:
        self.pool.close()


def _student_error(err: Any, target: str, name: str) -> StudentError:
    """The worker's error record (plain data, every field chosen by the submission) as a StudentError.
    Fields are cut and cleaned to one printable line here, at the boundary (sanitize.py); the kind
    is one of a fixed set. A hidden test shows none of them (runner.hidden_verdict)."""
    if type(err) is not dict:
        return StudentError(f"{target} failed", kind="protocol", target=target)
    kind = err.get("kind")
    if type(kind) is not str or kind not in {"exit", "not_implemented", "not_plain", "memory", "exception", "import"}:
        kind = "exception"
    exc_type = sanitize.line(err.get("type", "Exception"), 80)
    raw_where = err.get("where")
    where = None
    function = name
    if type(raw_where) is list and len(raw_where) == 3:
        where = (sanitize.line(raw_where[0], 100), raw_where[1] if type(raw_where[1]) is int else 0)
        function = sanitize.line(raw_where[2], 100)
    loc = f" ({where[0]}:{where[1]})" if where else ""
    message = err.get("message", "")
    first = sanitize.line(message.strip().splitlines()[0] if type(message) is str and message.strip() else "", 300)
    if kind == "not_implemented":
        text = f"not implemented yet — {function} raises NotImplementedError"
    elif kind == "exit":
        text = f"{function} {first}{loc}; a graded function must return, not exit"
    elif kind == "not_plain":
        text = f"{name} returned something that is not plain data: {first}"
    elif kind == "memory":
        text = f"{function} {first}{loc}"
    elif kind == "import":
        text = first
    else:
        text = f"{function} raised {exc_type}" + (f": {first}" if first else "") + loc
    return StudentError(text, kind=kind, target=target, function=function, where=where,
                        detail=sanitize.block(str(err.get("traceback", ""))[-4000:]), exc_type=exc_type)
