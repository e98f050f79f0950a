"""grade(): run the assignment tests in this process (the judge) against one submission.

pytest runs in-process with a plugin that provides the `student` fixture, orders the tests by
part, records each outcome with the structured reason, and turns them into the report dict of
the interface (points from the rubric). Pinned: rootdir and confcutdir are the tests folder,
the ini file is the engine's own, plugin autoloading is off and the cache provider is disabled, so
nothing outside the tests folder (least of all the submission's folder) takes part.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pytest

from . import cases as case_sets
from . import deps, memory, sanitize, static, transcripts
from .checks import NAMES_NOTHING, CheckFailure, join_hints, one_thread
from .errors import LOST_KINDS, exception_hint
from .judge import AUTOGRADER_DIR, ENGINE_DIR, REPO_ROOT, Engine, Limits, StudentError, StudentProxy, WorkerPrefix, \
    prepare_submission
from .reuse import PartResults, part_key
from .rubric import Rubric, load_rubric
from ..scenarios.tracing import paused_gc

DEFAULT_TESTS_DIR = AUTOGRADER_DIR / "tests"  # the test functions and their public cases (shipped)
DEFAULT_HIDDEN_DIR = REPO_ROOT / "instructor" / "hidden_tests"  # hidden cases (instructor only)
TEST_SETS = ("public", "hidden")
PLUGIN_NAME = "autograder-engine"
_PART_MARK = re.compile(r"^part(\d+)$")


class GradingPlugin:
    """The judge's pytest plugin for one grading run."""

    def __init__(self, engine: Engine, rubric: Rubric, parts: Sequence[int], tests_dir: Path,
                 redact_sets: Iterable[str] = ("hidden",), fail_fast: bool = False,
                 test_sets: Iterable[str] = ("public",), hidden_dir: Path | None = None,
                 passed_tests: transcripts.PassedTests | None = None) -> None:
        self.engine, self.rubric, self.parts, self.tests_dir = engine, rubric, list(parts), tests_dir
        self.test_sets, self.hidden_dir = set(test_sets), hidden_dir
        self.redact_sets = set(redact_sets)
        self.fail_fast = fail_fast
        self.failed_parts: set[int] = set()
        self.items: list[dict] = []  # in run order: {"nodeid", "part", "set", "function"}
        self.by_id: dict[str, dict] = {}
        self.results: dict[str, dict] = {}  # nodeid -> {"outcome", "exc"}
        self.errors: list[str] = []
        self.diagnoses: dict[str, Callable[[Any], Any] | None] = {}  # nodeid -> its @cases(diagnosis=...)
        self.pending: dict[Any, tuple[Callable[[Any], Any], int]] = {}  # diagnoses the hidden tests declare
        self.hints: dict[Any, str | None] = {}  # diagnosis key -> the hint it gave (run_diagnoses)
        self.diagnosed = False
        self.passed_tests = passed_tests  # transcripts of passed tests to match and to keep (transcripts.py)

    # -- configuration and collection ------------------------------------------------------
    def pytest_configure(self, config: pytest.Config) -> None:
        # The report is built from the exceptions themselves; pytest's source-annotated traceback
        # of each failure would cost ~0.1 s per failing test (the starter fails every test).
        config.option.tbstyle = "line"
        for part in self.rubric.parts:
            config.addinivalue_line("markers", f"{part.marker}: tests of part {part.number} ({part.name})")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = str(report.longrepr).strip().splitlines()
            self.errors.append(f"collection error in {report.nodeid or 'the tests'}: {text[-1] if text else ''}")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        case_sets.parametrize(metafunc, self.test_sets, self.hidden_dir)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if "hidden" not in self.test_sets or self.hidden_dir is None:
            return
        by_file: dict[Path, set[str]] = {}
        for item in session.items:
            by_file.setdefault(Path(str(item.path)), set()).add(getattr(item, "originalname", None) or item.name)
        for path, names in by_file.items():
            for name in case_sets.unknown_hidden_names(self.hidden_dir, path, names):
                self.errors.append(f"hidden cases for {name!r} in {case_sets.hidden_module_path(self.hidden_dir, path).name}"
                                   f" match no test of {path.name}")

    @staticmethod
    def _test_set(item: pytest.Item) -> str:
        mark = item.get_closest_marker(case_sets.SET_MARK)
        return mark.args[0] if mark else "public"

    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        keep, drop = [], []
        for item in items:
            if item.get_closest_marker(case_sets.NO_CASES_MARK) is not None or self._test_set(item) not in self.test_sets:
                drop.append(item)  # a hidden-only test while the hidden set is not graded, or the reverse
                continue
            parts = [p for m in item.iter_markers() if (p := self.rubric.part_of_marker(m.name))]
            numbers = sorted({p.number for p in parts})
            if len(numbers) != 1:
                self.errors.append(f"{item.nodeid}: a test needs exactly one part marker, found {numbers or 'none'}")
                drop.append(item)
                continue
            if numbers[0] not in self.parts:
                drop.append(item)
                continue
            info = {"nodeid": item.nodeid, "part": numbers[0], "set": self._test_set(item),
                    "function": getattr(item, "originalname", None) or item.name, "order": len(keep),
                    "checks": case_sets.what_it_checks(getattr(item, "function", None))}
            fn = self.diagnoses[item.nodeid] = case_sets.diagnosis_of(item)
            if fn is not None and info["set"] in self.redact_sets:
                self.pending.setdefault(_diagnosis_key(fn), (fn, numbers[0]))
            item.stash[_INFO] = info
            keep.append(item)
        set_rank = {s: i for i, s in enumerate(TEST_SETS)}
        # every public test before any hidden one: a worker that has seen a hidden input is then
        # replaced once and never serves a public test (Engine.request)
        keep.sort(key=lambda it: (set_rank.get(it.stash[_INFO]["set"], 9), it.stash[_INFO]["part"],
                                  it.stash[_INFO]["order"]))
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        for item in keep:
            info = item.stash[_INFO]
            self.items.append(info)
            self.by_id[info["nodeid"]] = info

    # -- the fixture ---------------------------------------------------------------------
    @pytest.fixture
    def student(self, request: pytest.FixtureRequest) -> StudentProxy:
        info = request.node.stash.get(_INFO, None)
        if info is None:
            raise RuntimeError("test bug: the student fixture is only for tests with a part marker")
        return StudentProxy(self.engine, info["part"], info["nodeid"], test_set=info["set"])

    # -- memory ----------------------------------------------------------------------------
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.engine.transcript = None
        self.engine.stop_clock()
        # Automatic collection is off while the tests run (grade(): it walked the judge's objects again
        # and again, ~1 s of a full grade); each test's cyclic garbage (tracebacks holding replays) goes here.
        gc.collect(0)

    # -- outcomes ------------------------------------------------------------------------
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        info = item.stash.get(_INFO, None)
        if info is not None and info["set"] in self.redact_sets and not self.diagnosed:
            self.diagnosed = True
            self.run_diagnoses()  # before the first hidden test: see run_diagnoses
        if info is not None:
            self.engine.start_clock(info["part"])  # (Limits.part_budgets)
        if self.fail_fast and info is not None and info["part"] in self.failed_parts:
            pytest.skip("not run: an earlier test of this part failed (fail-fast mode)")
        if info is not None and self.passed_tests is not None and not _is_hypothesis_test(item):
            self.engine.transcript = self.passed_tests.transcript(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        t = self.engine.transcript
        if t is not None and t.test_id == item.nodeid:
            t.live = True  # only the test's body may stop at a stored pass's last event
        try:
            return (yield)
        finally:
            if t is not None:
                t.live = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        t = self.engine.transcript
        reused = call.excinfo is not None and call.excinfo.errisinstance(transcripts.Reused)
        if reused:  # the submission answered as a stored pass did, event for event: it passed
            report.outcome, report.longrepr = "passed", None
            self.passed_tests.reused.append(item.nodeid)
        elif call.when == "call" and report.passed and t is not None and t.test_id == item.nodeid and t.keepable():
            self.passed_tests.keep(t)
        if item.nodeid in self.by_id:
            res = self.results.setdefault(item.nodeid, {"outcome": "passed", "exc": None, "text": ""})
            if report.skipped and res["outcome"] == "passed":
                res["outcome"] = "skipped"
                res["text"] = str(getattr(call.excinfo, "value", "")) if call.excinfo else "skipped"
            elif report.failed and res["exc"] is None:
                exc = _relevant(call.excinfo.value) if call.excinfo else None
                res["exc"] = _detached(exc)
                if isinstance(exc, StudentError) and exc.kind == "exception" and \
                        self.by_id[item.nodeid]["set"] not in self.redact_sets:
                    res["diagnosis"] = self.localise(item.nodeid)
                if isinstance(exc, (CheckFailure, StudentError)) or (isinstance(exc, AssertionError)):
                    res["outcome"] = "failed"
                else:
                    res["outcome"] = "error"
                res["text"] = _short_text(report, exc)
                self.failed_parts.add(self.by_id[item.nodeid]["part"])
        if call.excinfo is not None:
            # The report is made: the failed test's frames (its inputs, references, replays) go now,
            # not when the grade ends (memory.py: kept, they held GBs per hostile part).
            _release_frames(call.excinfo.tb)
        return report

    # -- hidden failures' hints ----------------------------------------------------------
    def run_diagnoses(self) -> None:
        """Run every diagnosis that the hidden tests declare, once each, BEFORE the first hidden test.

        A hidden verdict is one bit chosen by the submission (passed or not): its text is the test's
        docstring and this hint. The hint comes from calls on the judge's own fixed probe inputs, made
        before any hidden input exists in any worker (test set "diagnosis", which may go on in the
        public worker; Engine.request replaces it before the hidden tests), so it cannot depend on the
        hidden inputs through any state a worker leaves (files, IPC, counters such as the next PID),
        and is the same for every hidden case of a test, however the submission fails them. It costs
        the probes' calls on every grade with hidden tests, shown or not."""
        for key, (fn, part) in self.pending.items():
            if key not in self.hints:  # (a public test's exception may have run it: localise)
                self._diagnose(key, fn, part)

    def _diagnose(self, key: Any, fn: Callable[..., Any], part: int) -> None:
        clock = self.engine._clock
        proxy = StudentProxy(self.engine, part, f"diagnosis/{_diagnosis_name(fn)}", test_set="diagnosis")
        self.engine.start_clock(part)  # a diagnosis's time is its part's (Limits.part_budgets)
        try:
            with one_thread():
                found = fn(proxy)
        except Exception:  # noqa: BLE001 -- a diagnosis that cannot run gives no hint, never an error
            found = None
        finally:
            self.engine.stop_clock()
            if clock is not None:  # a test's clock was running (localise): it goes on
                self.engine.start_clock(clock[0])
        text = found.message() if hasattr(found, "message") else found
        self.hints[key] = sanitize.line(text, 800) if isinstance(text, str) and text.strip() else None

    def localise(self, nodeid: str) -> str | None:
        """For a public test whose call raised: what its declared diagnosis localises (the probe ladder's
        failed rung, e.g. "raises with leading dims (2, 3)"), which the exception's own line cannot say;
        None where the probes found nothing. Run once per diagnosis, on the judge's fixed probe inputs
        in a diagnosis worker, before any hidden test: its text is the one a hidden failure's hint gets."""
        fn = self.diagnoses.get(nodeid)
        if fn is None:
            return None
        key = _diagnosis_key(fn)
        if key not in self.hints:
            self._diagnose(key, fn, self.by_id[nodeid]["part"])
        text = self.hints.get(key)
        named = [c for c in (text or "").split("; ") if c.strip() and not c.startswith(NAMES_NOTHING)]
        return "; ".join(named) or None

    def hidden_hint(self, nodeid: str) -> str | None:
        fn = self.diagnoses.get(nodeid)
        return self.hints.get(_diagnosis_key(fn)) if fn is not None else None


_INFO = pytest.StashKey[dict]()


def _diagnosis_key(fn: Callable[..., Any]) -> Any:
    """The same diagnosis, declared on several tests (functools.partial objects differ), runs once."""
    if isinstance(fn, functools.partial):
        return (fn.func, fn.args, tuple(sorted(fn.keywords.items())))
    return fn


def _diagnosis_name(fn: Callable[..., Any]) -> str:
    return getattr(fn.func if isinstance(fn, functools.partial) else fn, "__name__", "diagnosis")


def _is_hypothesis_test(item: pytest.Item) -> bool:
    """A @given test: its examples are drawn anew each run, so its transcript is never kept nor matched."""
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))


def _relevant(exc: BaseException) -> BaseException:
    """The exception that explains a failure (hypothesis may wrap it in an ExceptionGroup)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if isinstance(e, (CheckFailure, StudentError))]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc


def _release_frames(tb: Any) -> None:
    """Free what a failed test's frames hold, now rather than at a full collection: their locals, the
    snapshot of them pytest read (f_locals, for __tracebackhide__; frame.clear() leaves it in place in
    Python 3.11), and the failure pytest keeps in sys.last_* until the next one. Kept, a hostile part's
    replays went to the oldest generation with every failed test and were freed by the grade's last
    collection: 15 million objects and 14 s of one part's 58 s, and its judge's peak memory."""
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        sys.__dict__.pop(name, None)
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:  # still executing (a hook's own frame): its locals are in use
            pass
        else:
            snapshot = frame.f_locals
            if type(snapshot) is dict:
                snapshot.clear()
        tb = tb.tb_next


def _detached(exc: BaseException | None) -> BaseException | None:
    """exc without the tracebacks along its chain (causes, contexts, groups): the report is built
    from the exceptions themselves, and a traceback keeps every frame's locals alive."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return exc


def _short_text(report: Any, exc: BaseException | None) -> str:
    if isinstance(exc, (CheckFailure, StudentError)):
        return str(exc)
    if isinstance(exc, AssertionError):
        return f"AssertionError: {exc}".strip()
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    return f"grading error (please report it): {crash.message if crash else type(exc).__name__}"


# ---------------------------------------------------------------------------------------------
# the report


HIDDEN_ERROR_PREFIX = "hidden test "  # an error line about a hidden test (instructor only)
HIDDEN_RESULT = "result: failed (hidden test: its inputs, its values and the way it failed are not shown)"


def hidden_verdict(checks: str, hint: str | None) -> dict:
    """All that a failed hidden test says: the test's docstring and its diagnosis's hint
    (GradingPlugin.run_diagnoses), text the judge wrote that is the same however the
    submission failed. Which check failed, an exception or a timeout, a wrong value or a wrong type
    would each be a choice of the submission, and so a channel for the hidden inputs it saw."""
    lines = [f"checked: {checks}", HIDDEN_RESULT] + ([f"hint: {hint}"] if hint else [])
    return {"kind": "hidden", "what": checks, "hint": hint, "message": "\n".join(lines)}


def _exception_hint(exc: StudentError, res: dict) -> str | None:
    """A raised call's hint: where the probes localise the failure first (GradingPlugin.localise), then
    what the exception usually means (errors.exception_hint)."""
    if exc.kind != "exception":
        return None
    return join_hints(res.get("diagnosis"), exception_hint(str(exc))) or None


def _message(res: dict) -> str:
    """A failed public test's message: the check's or the call's message, cleaned (a returned string
    or an exception message may appear in it)."""
    exc = res.get("exc")
    if isinstance(exc, CheckFailure):
        text = exc.message()
    elif isinstance(exc, StudentError):
        hint = _exception_hint(exc, res)
        return f"{exc}\nhint: {hint}" if hint else str(exc)
    else:
        text = res.get("text", "")
    return sanitize.block(text, 2000, 40)


def _failure_dict(info: dict, test_id: str, res: dict) -> dict:
    exc = res.get("exc")
    out: dict[str, Any] = {"test": test_id, "set": info["set"], "kind": None, "what": None, "inputs": None,
                           "max_abs_err": None, "max_rel_err": None, "index": None, "hint": None,
                           "message": _message(res)}
    if isinstance(exc, CheckFailure):
        out.update(exc.as_dict())
    elif isinstance(exc, StudentError):
        out.update(kind=exc.kind, what=f"calling {exc.target}", hint=_exception_hint(exc, res))
        if exc.function:
            out["function"] = exc.function
    else:
        out["kind"] = res["outcome"]
    return out


def _public_id(info: dict, redact: bool, ordinal: dict) -> str:
    """Hidden tests are named by file, function and a number: parameter ids could reveal inputs."""
    nodeid = info["nodeid"]
    if not redact:
        return f"{info['set']}/{nodeid}" if not nodeid.startswith(info["set"]) else nodeid
    base = nodeid.split("[", 1)[0]
    n = ordinal.setdefault(base, 0)
    ordinal[base] = n + 1
    name = base if base.startswith(info["set"]) else f"{info['set']}/{base}"
    return f"{name}[{n}]" if "[" in nodeid else name


def _sha256_files(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _hashes(sub_sha: str, rubric: Rubric, tests_dir: Path) -> dict:
    code = [p for d in (tests_dir, AUTOGRADER_DIR / "scenarios", ENGINE_DIR) if d.is_dir()
            for p in d.rglob("*") if p.is_file() and p.suffix in (".py", ".ini", ".toml") and "__pycache__" not in p.parts]
    import hypothesis
    import numpy
    import torch

    env = json.dumps({"python": sys.version, "platform": platform.platform(), "torch": torch.__version__,
                      "numpy": numpy.__version__, "pytest": pytest.__version__,
                      "hypothesis": hypothesis.__version__}, sort_keys=True)
    course = [p for p in (REPO_ROOT / "course").rglob("*.py") if "__pycache__" not in p.parts]
    env_h = hashlib.sha256(env.encode() + _sha256_files(course).encode()).hexdigest()
    return {"submission": sub_sha, "tests": _sha256_files([*code, rubric.path]), "environment": env_h}


def build_report(plugin: GradingPlugin, sub: Any, rubric: Rubric, parts: Sequence[int], test_sets: Sequence[str],
                 redact_sets: set[str], tests_dir: Path, extra_errors: list[str]) -> dict:
    tests: list[dict] = []
    part_rows: list[dict] = []
    ordinal: dict[str, int] = {}
    errors = list(extra_errors) + plugin.errors
    by_part: dict[int, list[dict]] = {n: [] for n in parts}
    # tests that raised an error of their own (not a CheckFailure nor a StudentError: a reply of the
    # wrong type already fails as the submission's), so their 0 would not be the submission's grade
    judge_errors: list[str] = []
    for info in plugin.items:
        by_part[info["part"]].append(info)
    for n in parts:
        rule = rubric.part(n)
        infos = by_part[n]
        weights = [rule.weight(i["function"]) for i in infos]
        total_w = sum(weights)
        passed = failed_ni = 0
        first: dict | None = None
        first_hidden: dict | None = None
        statuses = []
        for info, w in zip(infos, weights):
            res = plugin.results.get(info["nodeid"], {"outcome": "error", "exc": None, "text": "did not run"})
            redact = info["set"] in redact_sets
            test_id = _public_id(info, redact, ordinal)
            max_score = rule.points * w / total_w if total_w else 0.0
            ok = res["outcome"] == "passed"
            passed += ok
            exc = res.get("exc")
            outcome, verdict = res["outcome"], None
            if redact and not ok and outcome != "skipped":  # one uniform verdict, whatever happened
                outcome = "failed"
                verdict = hidden_verdict(info["checks"] or info["function"], plugin.hidden_hint(info["nodeid"]))
            elif isinstance(exc, StudentError) and exc.kind == "not_implemented":
                failed_ni += 1  # counted on the tests that show their kind: the public ones
            entry = {"id": test_id, "part": n, "set": info["set"], "outcome": outcome,
                     "score": round(max_score if ok else 0.0, 6), "max_score": round(max_score, 6),
                     "message": "" if ok else verdict["message"] if verdict else _message(res)}
            out = plugin.engine.outputs.get(info["nodeid"])
            if out is not None and out.data and not redact:
                entry["output"] = sanitize.block(out.data, 1 << 20, 1 << 16)  # already capped by the engine
            tests.append(entry)
            statuses.append(outcome)
            if res["outcome"] == "error":  # student_view drops the hidden ones: for the instructor only
                judge_errors.append(test_id)
                errors.append(f"{HIDDEN_ERROR_PREFIX}{test_id} could not run: {sanitize.line(res['text'], 300)}"
                              if redact else f"{info['nodeid']}: {sanitize.line(res['text'], 500)}")
            if not ok:
                if verdict is not None:
                    fd = {"test": test_id, "set": info["set"], "inputs": None, "max_abs_err": None,
                          "max_rel_err": None, "index": None, **verdict}
                else:
                    fd = _failure_dict(info, test_id, res)
                if not redact and first is None:
                    first = fd
                elif redact and first_hidden is None:
                    first_hidden = fd
        first = first or first_hidden
        points = sum(e["score"] for e in tests if e["part"] == n)
        # Fail closed: a test set asked for that brought no test (a hidden-tests folder missing, empty
        # or cut short) would otherwise hand the part's points to the other set alone.
        empty_sets = [s for s in test_sets if infos and not any(i["set"] == s for i in infos)]
        if not infos:
            status = "error"
            errors.append(f"part {n}: no tests collected (looked for test_part{n}_*.py in {', '.join(test_sets)})")
        elif empty_sets:
            status, points = "error", 0.0
            for e in tests:
                if e["part"] == n:
                    e["score"] = 0.0
            errors.append(f"part {n}: no {' or '.join(empty_sets)} tests were collected, so the part's points are "
                          "withheld (is the hidden-tests folder complete?)")
        elif passed == len(infos):
            status = "ok"
        elif "error" in statuses:
            status = "error"
        elif failed_ni and failed_ni == sum(not (i["set"] in redact_sets) for i in infos) and not passed:
            status = "not_implemented"  # every shown test says so, and no hidden one passed
        else:
            status = "failed"
        part_rows.append({"part": n, "name": rule.name, "points": round(points, 4), "max_points": rule.points,
                          "passed": passed, "total": len(infos), "status": status, "first_failure": first})
    return {
        "parts": part_rows,
        "total": round(sum(p["points"] for p in part_rows), 4),
        "max_total": float(sum(p["max_points"] for p in part_rows)),
        "tests": tests,
        "errors": errors,
        "hashes": _hashes(sub.sha256, rubric, tests_dir),
        "test_sets": list(test_sets),
        "judge_errors": judge_errors,
    }


# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _pytest_env():
    saved = {k: os.environ.get(k) for k in ("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    os.environ.pop("PYTEST_PLUGINS", None)
    before = set(sys.modules)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _forget_test_modules(before)


def _forget_test_modules(before: set[str]) -> None:
    """Drop test modules that this run imported from outside the autograder package (a tests folder
    given by path): their names are derived from the path, and the next run may bring different
    files under the same names. autograder.tests.* stay imported, so module-level caches of
    trusted reference values (e.g. functools.cache on a cases_partN helper) serve every run."""
    for name in list(sys.modules):
        if name in before or name.startswith("autograder."):
            continue
        path = getattr(sys.modules.get(name), "__file__", None) or ""
        if name.startswith("conftest") or os.path.basename(path).startswith(("test_", "conftest")):
            sys.modules.pop(name, None)


def _grade_one(args: tuple) -> dict:
    impl_dir, part, kwargs = args
    return grade(impl_dir, parts=[part], **kwargs)


def _grade_in_processes(impl_dir: Any, numbers: list[int], jobs: int, kwargs: dict, started: float) -> dict:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # the slowest parts first, so that the pool stays busy (the rubric may say which are slow)
    rubric = load_rubric(kwargs["rubric"])
    order = sorted(numbers, key=lambda n: -rubric.part(n).cost)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        reports = dict(zip(order, pool.map(_grade_one, [(str(impl_dir), n, kwargs) for n in order])))
    merged = reports[numbers[0]]
    merged = {**merged, "parts": [], "tests": [], "errors": []}
    timing = {"wall_s": 0.0, "calls": 0, "worker_starts": 0, "worker_startup_s": [], "in_calls_s": 0.0,
              "longest_call_s": {}, "part_s": {}}
    for n in numbers:
        r = reports[n]
        merged["parts"] += r["parts"]
        merged["tests"] += r["tests"]
        merged["errors"] += [e for e in r["errors"] if e not in merged["errors"]]
        for k in ("calls", "worker_starts", "in_calls_s"):
            timing[k] += r["timing"][k]
        timing["worker_startup_s"] += r["timing"]["worker_startup_s"]
        for t, v in r["timing"]["longest_call_s"].items():
            timing["longest_call_s"][t] = max(timing["longest_call_s"].get(t, 0.0), v)
        timing["part_s"].update(r["timing"].get("part_s", {}))
    merged["total"] = round(sum(p["points"] for p in merged["parts"]), 4)
    merged["max_total"] = float(sum(p["max_points"] for p in merged["parts"]))
    timing["wall_s"] = round(time.perf_counter() - started, 3)
    timing["in_calls_s"] = round(timing["in_calls_s"], 3)
    timing["jobs"] = jobs
    merged["timing"] = timing
    return merged


def grade(impl_dir: str | os.PathLike, *, parts: Sequence[int] | None = None,
          test_sets: Sequence[str] = ("public",), worker_prefix: WorkerPrefix = None,
          rubric: str | os.PathLike | None = None, tests_dir: str | os.PathLike | None = None,
          hidden_dir: str | os.PathLike | None = None, redact_sets: Iterable[str] = ("hidden",), limits: dict | None = None,
          fail_fast: bool = False, jobs: int = 1, reuse: PartResults | None = None,
          not_taken: dict[str, str] | None = None) -> dict:
    """Grade the implementation folder `impl_dir` and return the report dict (JSON-serialisable).

    parts: part numbers (default: all in the rubric). test_sets: "public" and/or "hidden".
    worker_prefix: argv prefix for worker processes (e.g. a bubblewrap command), or a callable
    that gets the list of paths the worker must be able to read and returns that prefix.
    redact_sets: test sets whose failures are named but not revealed (no inputs, values, output).
    limits: overrides of engine.judge.Limits for every part (e.g. {"call_timeout_s": 5}).
    fail_fast: after a part's first failure, skip its remaining tests (the mutation harness; the
    points are then a lower bound).
    jobs: grade the parts in up to `jobs` judge processes at once (parts are independent: each
    has its own tests and reaches only its own files) and merge the reports. 1 = this process.
    not_taken: {graded file name: why a channel's intake did not take it} (a syntax error, an encoding):
    what a part that needs the file says instead of "missing".
    reuse: a store of earlier results (engine/reuse.py): a part whose reached files and settings
    match an earlier grade's is not run again; its result is taken from the store (a batch judge
    keeps one for its whole batch). report["timing"]["reused_parts"] lists them. The store also
    keeps the transcripts of passed tests (engine/transcripts.py): a test whose calls get the replies
    a stored pass got stops at its last reply, passed; report["timing"]["reused_tests"] counts them.
    """
    started = time.perf_counter()
    numbers_all = sorted(set(parts)) if parts else load_rubric(rubric).numbers
    if jobs > 1 and len(numbers_all) > 1:
        kwargs = dict(test_sets=tuple(test_sets), worker_prefix=worker_prefix, rubric=rubric, tests_dir=tests_dir,
                      hidden_dir=hidden_dir, redact_sets=tuple(redact_sets), limits=limits, fail_fast=fail_fast,
                      not_taken=not_taken)
        return _grade_in_processes(impl_dir, numbers_all, min(jobs, len(numbers_all)), kwargs, started)
    rubric_obj = load_rubric(rubric)
    tests_path = Path(tests_dir or DEFAULT_TESTS_DIR).resolve()
    numbers = sorted(set(parts)) if parts else rubric_obj.numbers
    for n in numbers:
        rubric_obj.part(n)  # raises on an unknown part
    bad_sets = [s for s in test_sets if s not in TEST_SETS]
    if bad_sets:
        raise ValueError(f"unknown test set(s) {bad_sets}; use {list(TEST_SETS)}")
    impl = Path(impl_dir)
    if not impl.is_dir():
        raise FileNotFoundError(f"{impl_dir} is not a folder; pass the folder that holds the graded files")
    errors: list[str] = []
    hidden_path = Path(hidden_dir or DEFAULT_HIDDEN_DIR).resolve()
    if "hidden" in test_sets and not hidden_path.is_dir():
        errors.append(f"the hidden tests are not in this copy ({hidden_path} is missing)")

    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        sub = prepare_submission(impl, rubric_obj.all_files(), Path(tmp), not_taken)
        reused: dict[int, dict] = {}
        keys: dict[int, str] = {}
        passed_tests = None
        if reuse is not None:
            settings = _reuse_settings(rubric_obj, tests_path, hidden_path, test_sets, redact_sets, limits,
                                       fail_fast, worker_prefix)
            keys = {n: reuse_key(rubric_obj, n, sub, settings) for n in numbers}
            reused = {n: hit for n in numbers if (hit := reuse.get(keys[n])) is not None}
            passed_tests = transcripts.PassedTests(reuse, settings)
        all_numbers, numbers = numbers, [n for n in numbers if n not in reused]
        files = [str(p) for n in numbers for p in sorted(tests_path.glob(f"test_part{n}_*.py"))]
        refused = {}
        for n in numbers:
            rule = rubric_obj.part(n)
            found = [v for f in rule.files if f in sub.present
                     for v in static.violations(sub.present[f], f, numpy_allowed=rule.numpy_allowed)]
            if found:
                refused[n] = static.refusal(found)
        base = Limits().updated(**rubric_obj.defaults).updated(**(limits or {}))
        engine = Engine(sub, rubric_obj, base, worker_prefix, refused, overrides=limits or {})
        bound_before = memory.bound()
        plugin = GradingPlugin(engine, rubric_obj, numbers, tests_path, redact_sets, fail_fast, test_sets,
                               hidden_path if hidden_path.is_dir() else None, passed_tests)
        try:
            if files:
                engine.pool.code = engine.code_for(numbers[0])  # the first part's files (a direct start's)
                engine.pool.warm_up()  # torch is imported for the worker while pytest collects
                markers = " or ".join(rubric_obj.part(n).marker for n in numbers)
                args = [*files, "-c", str(ENGINE_DIR / "judge.ini"), "--rootdir", str(tests_path),
                        "--confcutdir", str(tests_path), "-p", "no:cacheprovider", "-p", "no:stepwise",
                        "-p", "no:unraisableexception", "-p", "no:threadexception", "-p", "no:faulthandler",
                        "-p", "no:logging",  # log capture is set up for every test phase; no grading test logs
                        "--import-mode=importlib", "-m", markers, "-p", "no:terminal"]
                _freeze_what_lives()
                with _pytest_env(), paused_gc():
                    code = pytest.main(args, plugins=[plugin])
                gc.collect()
                memory.trim_if_above(256 << 20)  # the next grade (a batch judge's) starts lean
                if code not in (0, 1, 5):  # 5: nothing collected (reported per part)
                    errors.append(f"pytest stopped with exit code {int(code)}")
        finally:
            engine.close()
            memory.set_bound(bound_before >> 20)  # Engine.request set this grade's; what runs after keeps its own
        report = build_report(plugin, sub, rubric_obj, numbers, test_sets, set(redact_sets), tests_path, errors)
        if reuse is not None:
            for n in numbers:
                if _reusable(report, n, engine, plugin):
                    reuse.put(keys[n], {"row": next(r for r in report["parts"] if r["part"] == n),
                                        "tests": [t for t in report["tests"] if t["part"] == n]})
            report = _with_reused(report, all_numbers, reused)
    stats = engine.pool.stats
    report["timing"] = {"wall_s": round(time.perf_counter() - started, 3), "calls": stats.calls,
                        "worker_starts": stats.worker_starts,
                        "worker_startup_s": [round(s, 3) for s in stats.startup_s],
                        "in_calls_s": round(stats.call_s, 3),
                        "longest_call_s": {t: round(v, 4) for t, v in sorted(stats.longest_s.items())},
                        # each graded part's own wall time, its tests and diagnoses (Limits.part_budgets)
                        "part_s": {str(n): round(t, 3) for n, t in sorted(engine.part_spent.items())},
                        "reused_parts": sorted(reused),
                        "reused_tests": len(passed_tests.reused) if passed_tests is not None else 0}
    return report


def reuse_keys(impl_dir: str | os.PathLike, *, parts: Sequence[int] | None = None,
               test_sets: Sequence[str] = ("public",), worker_prefix: WorkerPrefix = None,
               rubric: str | os.PathLike | None = None, tests_dir: str | os.PathLike | None = None,
               hidden_dir: str | os.PathLike | None = None, redact_sets: Iterable[str] = ("hidden",),
               limits: dict | None = None, fail_fast: bool = False) -> dict[int, str]:
    """{part: the key under which grade(impl_dir, same arguments, reuse=store) keeps that part's result}, without
    grading: a store's entries graded under other settings can be put under these keys when the result
    is known to hold there too (the batch's calibration: the reference graded before the call time
    limits were scaled, with every call far below them; instructor/batch.py)."""
    rubric_obj = load_rubric(rubric)
    numbers = sorted(set(parts)) if parts else rubric_obj.numbers
    tests_path = Path(tests_dir or DEFAULT_TESTS_DIR).resolve()
    hidden_path = Path(hidden_dir or DEFAULT_HIDDEN_DIR).resolve()
    settings = _reuse_settings(rubric_obj, tests_path, hidden_path, test_sets, redact_sets, limits, fail_fast,
                               worker_prefix)
    with tempfile.TemporaryDirectory(prefix="grade-keys-") as tmp:
        sub = prepare_submission(Path(impl_dir), rubric_obj.all_files(), Path(tmp))
        return {n: reuse_key(rubric_obj, n, sub, settings) for n in numbers}


def _reuse_settings(rubric: Rubric, tests_path: Path, hidden_path: Path, test_sets: Sequence[str],
                    redact_sets: Iterable[str], limits: dict | None, fail_fast: bool, prefix: Any) -> dict:
    """What a part's result depends on besides its files (reuse.part_key): the code of the tests and
    the engine, the environment, and the run's settings."""
    hashes = _hashes("", rubric, tests_path)
    hidden = [p for p in hidden_path.rglob("*") if p.is_file() and "__pycache__" not in p.parts] \
        if hidden_path.is_dir() else []
    return {"tests": hashes["tests"], "environment": hashes["environment"], "hidden": _sha256_files(hidden),
            "test_sets": list(test_sets), "redact_sets": sorted(redact_sets), "limits": limits or {},
            "fail_fast": fail_fast, "sandbox": getattr(prefix, "mode", None) if prefix is not None else None}


def reuse_key(rubric: Rubric, part: int, sub: Any, settings: dict) -> str:
    """reuse.part_key of part `part` of the submission copy `sub`: the texts of the files it reaches
    (or why each was not taken)."""
    reached = {f: sub.present[f] if f in sub.present else "\0" + sub.problems.get(f, "missing")
               for f in sorted(deps.reach(rubric, part, sub.present))}
    return part_key(part, reached, {**settings, "part_rule": repr(rubric.part(part))})


def _reusable(report: dict, n: int, engine: Engine, plugin: GradingPlugin) -> bool:
    """Whether part n's result may serve a later submission: no error in the run, none of its tests
    could not run, no call of it was lost and none gave up (all of which depend on the machine)."""
    if report["errors"] or any(engine.parts.get((n, d)) and engine.parts[(n, d)].losses for d in (False, True)):
        return False
    if not engine.limits_for(n).worker_per_part:
        return False
    row = next(r for r in report["parts"] if r["part"] == n)
    if row["status"] == "error":
        return False
    for info in plugin.items:
        if info["part"] == n:
            exc = plugin.results.get(info["nodeid"], {}).get("exc")
            if isinstance(exc, StudentError) and exc.kind in LOST_KINDS:
                return False
    return True


def _with_reused(report: dict, numbers: Sequence[int], reused: dict[int, dict]) -> dict:
    """report (of the parts run) with the reused parts' rows and tests put in, in part order."""
    if not reused:
        return report
    rows = {r["part"]: r for r in report["parts"]}
    rows.update({n: e["row"] for n, e in reused.items()})
    tests = {n: [t for t in report["tests"] if t["part"] == n] for n in numbers}
    tests.update({n: e["tests"] for n, e in reused.items()})
    parts = [rows[n] for n in numbers]
    return {**report, "parts": parts, "tests": [t for n in numbers for t in tests[n]],
            "total": round(sum(p["points"] for p in parts), 4),
            "max_total": float(sum(p["max_points"] for p in parts))}


# ---------------------------------------------------------------------------------------------
# what a student sees


OUTPUT_SHOWN = 2000  # characters of a test's printed output kept in a student's view
OUTPUT_TOTAL = 20000  # characters of printed output in one view, all tests together


def hidden_by_function(tests: list[dict]) -> list[dict]:
    """The tests with each hidden test function's cases folded into one entry, where the first of
    them stood: id without the case number, outcome "failed" if any case failed (else the cases'
    common outcome), score and max_score summed, `passed` of `cases`, the redacted verdict (the
    same for every case of a function: hidden_verdict). Which hidden case failed would tell a
    submission that branches on its inputs where the hidden shapes lie, one bit per case per grade;
    the count tells it less, and the points show the count anyway."""
    out: list[dict] = []
    folded: dict[str, dict] = {}
    for t in tests:
        if t.get("set") != "hidden":
            out.append(t)
            continue
        base = str(t.get("id", "")).split("[", 1)[0]
        g = folded.get(base)
        if g is None:
            g = folded[base] = {"id": base, "part": t.get("part"), "set": "hidden", "outcome": t.get("outcome"),
                                "score": 0.0, "max_score": 0.0, "message": "", "passed": 0, "cases": 0}
            out.append(g)
        g["cases"] += 1
        g["score"] = round(g["score"] + float(t.get("score") or 0.0), 6)
        g["max_score"] = round(g["max_score"] + float(t.get("max_score") or 0.0), 6)
        if t.get("outcome") == "passed":
            g["passed"] += 1
        else:
            if g["outcome"] == "passed" or t.get("outcome") == "failed":
                g["outcome"] = t.get("outcome")
            g["message"] = g["message"] or t.get("message", "")
    return out


def student_view(report: dict) -> dict:
    """The report as a student may see it (every channel renders this): hidden tests arrive
    redacted by the engine (hidden_verdict); here they also lose any output, their cases are
    folded into one entry per test function (hidden_by_function: counts, not which case), the
    error list loses the lines about hidden tests (whether one could not run would be one more
    bit), printed output is truncated, and timings go."""
    view = json.loads(json.dumps(report))
    view["errors"] = [sanitize.line(e, 500) for e in view.get("errors", [])
                      if not e.startswith(HIDDEN_ERROR_PREFIX) and "hidden" not in e.lower()]
    budget = OUTPUT_TOTAL
    for t in view.get("tests", []):
        if t.get("set") == "hidden":
            t.pop("output", None)
            continue
        text = t.get("output")
        if text:
            keep = max(0, min(OUTPUT_SHOWN, budget))
            budget -= keep
            t["output"] = text[:keep] + (f"\n[... output truncated: {len(text)} characters in all]"
                                         if len(text) > keep else "")
    view["tests"] = hidden_by_function(view.get("tests", []))
    for row in view.get("parts", []):
        first = row.get("first_failure")
        if isinstance(first, dict) and first.get("set") == "hidden":
            first["test"] = str(first.get("test", "")).split("[", 1)[0]
    view.pop("timing", None)
    return view


def _freeze_what_lives() -> None:
    """Before each grade: collect, then keep every object still alive out of all later collections
    (gc.freeze): the imports (torch's, and the ~200k objects of the modules that a first grade imports
    lazily), the judge's caches and stores. This grade's collections then walk only its own objects:
    a batch judge's full collection took ~0.1 s, twice per submission, walking the same survivors
    again (measured; a replay allocates hundreds of thousands of small objects, hence full collections).
    Collected first, so that no garbage is frozen. A frozen object is still freed when its last
    reference goes; only a cycle of frozen objects that dies later is never collected (the judge's
    stores hold plain data; a judge that grows past its memory bound is replaced, instructor/batch.py)."""
    gc.collect()
    gc.freeze()


def grade_for_student(impl_dir: str | os.PathLike, **kwargs: Any) -> tuple[dict, dict]:
    """`make grade`'s one call: the engine on a folder, then the student view of its report.
    Returns (report, view); the channels (instructor/grading.py) add intake and a sandbox on top."""
    report = grade(impl_dir, **kwargs)
    view = student_view(report) if kwargs.get("redact_sets", ("hidden",)) else json.loads(json.dumps(report))
    if kwargs.get("worker_prefix") is None:  # every result records its isolation mode
        view["sandbox"] = "none (worker processes with the engine's limits only)"
    return report, view
