"""Reuse a test's pass when a submission answers the test exactly as an earlier one that passed it.

A test's verdict is a function of the test (its code and parameters), the engine and its settings, and
of what the submission gave it: the reply to each of its calls (the value, or the error the call
raised, a lost call included) and the text of any graded file it read (`student.source`). Everything
else the judge computes itself, deterministically: the inputs (fixed seeds), the references, the
replays of the returned records and every rule measured on them. So once a test passed in a batch, a
later submission whose run of that test gets the same replies, in the same order, passes it too: the
judge can stop at its last reply and skip what follows it, the replays, the tag replay (§5.1) and the
checks, about three quarters of a part's cost.

That is finer than engine/reuse.py, which reuses a whole part when every file it reaches is
byte-identical. It catches what file identity cannot prove:
- a part that imports a changed file but does not run the change on its tests' inputs (part 4 imports
  flash_forward.py; a bug in the forward pass leaves every record of flash_backward as it was);
- the tests that a bug does not reach (a causal-only bug and the non-causal tests, a guard for fully
  masked rows and the tests without one).

How: each test run keeps a Transcript. Engine.request and StudentProxy.source add one event per call or
read: a digest of what was asked (the call's target and arguments, encoded as they are sent) and of
what came back (the reply's plain data and buffers as received, or the error's fields), chained
with the node id and the events before it. A test that passed leaves its chain in the store (one entry
per pass: several different passes of a test, the reference's and a variant's, stand side by side; a
batch shares them among its judges, as reuse.py's part results). When a later run of a test reaches a
chain the store holds, Engine.request raises Reused instead of returning, and the plugin records the
test as passed. Otherwise the test simply goes on: it is graded in full, with the replies it got.

Never kept: a test that did not pass; one with a lost call (a timeout, a crash, out of memory: these
depend on the machine's load); one that made no call; a hypothesis test (its examples are drawn anew
each run); a test that asked for something its digest cannot encode.

What a reused pass does not redo, and why that holds:
- the twin's inputs are drawn from a secret of each judge process (replay._TWIN_SECRET): a record that
  computes the reference on one secret draw is taken to compute it on another;
- the judge's own bounds on a replay, its wall clock and its memory (memory.over_bound, which depends on
  what the judge process holds): a reused pass ran within them once, on the same records.
The store's key holds everything a verdict depends on besides the events (reuse settings: the tests'
and engine's code, the environment, the hidden cases, the sets, the redaction, the limits) except the
per-call time limits, which act only through the events (a call over its limit is lost). A test whose
verdict reads what another test or an earlier grade measured (a cache keyed by the submission's text)
says so (StudentProxy.shares_state) and is never kept nor matched.

What a submission can learn from it: a reused test ends sooner, so code that times the gaps between its
calls learns whether its replies so far were exactly those of a pass stored in this batch (the
reference's, or another submission's); in a public test it can print that. It learns nothing of the
hidden inputs (its hidden workers never reach a shown one: processes.SandboxServers), and every test it
passes this way got, reply for reply, what a full grade verified; a submission that answers differently
when it finds itself reused gets the grade of the replies it gave, as one that reads the clock or the
machine's load does.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from . import protocol
from .errors import LOST_KINDS, StudentError


class Reused(BaseException):
    """Raised in a test's body where its chain of events reaches a stored pass's: the test passed. A
    BaseException, so that no `except Exception` in a test or a check swallows it."""


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def _plain(tree: Any, buffers: list) -> bytes:
    """One digest of a tagged JSON tree and its buffers (protocol's format), lengths included."""
    return _digest(json.dumps(tree, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"),
                   *(bytes(b) for b in buffers))


def asked(op: str, target: str, args: tuple, kwargs: dict) -> bytes | None:
    """What a call asks: its op, target and arguments as the worker receives them. None: not encodable
    (the call itself then fails the same way)."""
    try:
        tree, buffers = protocol.encode_value([list(args), kwargs])
    except Exception:  # noqa: BLE001 -- such a call is never kept (Transcript.spoil)
        return None
    return _digest(op.encode(), target.encode(), _plain(tree, buffers))


def answered(value: Any, buffers: list) -> bytes:
    """What a call returned: the reply's plain data (as received, before decoding) and its buffers."""
    return _digest(b"value", _plain(value, buffers))


def raised(error: StudentError) -> bytes:
    """What a call raised: the StudentError the judge made of it, but its `detail` (the traceback, whose
    paths name each grade's and each worker's own folders): no verdict reads it (a test that expects an
    error reads its kind, type and message), and with it an expected error would never match."""
    fields = [error.kind, str(error), error.target, error.function, error.where, error.exc_type]
    return _digest(b"error", repr(fields).encode("utf-8", "surrogatepass"))


def read(filename: str, text: str | None, problem: str | None) -> bytes:
    """A graded file's text as a test read it (student.source), or why it was not there."""
    return _digest(b"source", filename.encode(), (text if text is not None else "\0" + (problem or "")).encode(
        "utf-8", "surrogatepass"))


def settings_digest(settings: dict) -> str:
    """What every transcript key of a run holds besides the events: the run's reuse settings, less the
    limits a batch calibrates (per-call time limits, part budgets: a passed test's replies do not depend
    on them)."""
    from .limits import CALIBRATED

    limits = {k: v for k, v in (settings.get("limits") or {}).items() if k not in CALIBRATED}
    blob = json.dumps({**settings, "limits": limits}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


class Transcript:
    """The events of one test's run (test_id: its node id), as a chain of digests: after each event, the
    digest of the node id and every event so far. `passed(chain)` says whether a pass with exactly these
    events is stored: then the test stops there (in its body)."""

    def __init__(self, test_id: str, passed: Callable[[str], bool] | None = None) -> None:
        self.test_id = test_id
        self.chain = _digest(b"test", test_id.encode("utf-8", "surrogatepass")).hex()
        self.events = 0
        self.passed = passed
        self.spoiled = False  # never kept nor matched: a lost call, an event it could not digest
        self.live = False  # in the test's body (pytest's call phase): only there may it stop early

    def add(self, what: bytes | None, outcome: bytes) -> None:
        """One event. Raises Reused where a stored pass has exactly the events so far."""
        if what is None:
            self.spoiled = True
            return
        self.chain = _digest(bytes.fromhex(self.chain), what, outcome).hex()
        self.events += 1
        if self.live and not self.spoiled and self.passed is not None and self.passed(self.chain):
            raise Reused()

    def lost(self, error: StudentError) -> None:
        if error.kind in LOST_KINDS:
            self.spoiled = True

    def spoil(self) -> None:
        """Never keep nor match this run: its verdict reads something its events do not hold (a call
        another test made, a measurement an earlier grade cached: StudentProxy.shares_state; a reply
        without its digest; an exception of the judge's own in a call)."""
        self.spoiled = True

    def keepable(self) -> bool:
        return self.events > 0 and not self.spoiled


class PassedTests:
    """The passes of tests, in a PartResults store (a batch's judges share it), for one run: one entry per
    pass, keyed by the run's settings and the pass's chain of events, so that several different passes of
    a test (the reference's, a variant's) are kept side by side."""

    def __init__(self, store: Any, settings: dict) -> None:
        self.store, self.settings = store, settings_digest(settings)
        self.reused: list[str] = []  # node ids of the tests passed by their transcript in this run

    def key(self, chain: str) -> str:
        return "test:" + hashlib.sha256(f"{self.settings}:{chain}".encode()).hexdigest()

    def has(self, chain: str) -> bool:
        return self.store.get(self.key(chain)) is not None

    def transcript(self, nodeid: str) -> Transcript:
        return Transcript(nodeid, self.has)

    def keep(self, transcript: Transcript) -> None:
        key = self.key(transcript.chain)
        self.store.put(key, {"key": key, "events": transcript.events})


def is_transcript(entry: Any) -> bool:
    """Whether a store entry is a test's transcript (PassedTests.keep) rather than a part's result."""
    return type(entry) is dict and "events" in entry and str(entry.get("key", "")).startswith("test:")
