"""Part 1 scenarios (run in the worker): the *_counted softmaxes, with reads the JUDGE counts.

The values stay in the judge. The student's function runs in a spare thread of the worker (threads.py) on a
LazyCounter that holds no values: a read of an element whose block (BLOCK consecutive elements,
aligned) is not at hand ends the current scenario call with {"need": block index}; the judge answers
with the values of that block in the next call (counted_feed) and counts every element it delivers.
So the judge's count is the number of input elements the code had to fetch: a correct k-pass
algorithm fetches exactly k·n (each pass reads every element once, in any order), and nothing the
code does in this process can make the judge count fewer or more than it fetched.

The rebase count is a RETURN value (checked against the judge's own count of the values), so the
rebase test uses a plain course.counting.ReadCounter (`counted`).
"""
from __future__ import annotations

import queue
from typing import Any

from course.counting import ReadCounter

from . import threads

COUNTED = {"naive": "naive_softmax_counted", "safe": "safe_softmax_counted", "online": "online_softmax_counted"}
BLOCK = 256  # elements per delivery (the judge uses the same constant): 16 requests a pass at n = 4096


class LazyCounter(ReadCounter):
    """A ReadCounter of n values that fetches each aligned block of BLOCK values from the judge.

    A block delivered once serves each of its elements once; reading an element again (a new
    pass) fetches its block again. Every block delivered stays at hand until then, so a pass may
    read in any order (two halves side by side, say): only a read of an element already read costs
    a delivery."""

    def __init__(self, n: int, ask: "queue.Queue[Any]", answers: "queue.Queue[Any]") -> None:
        super().__init__([])
        self._n, self._ask, self._answers = n, ask, answers
        self._at_hand: dict[int, tuple[list, set]] = {}  # block -> (its values, its elements not read yet)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> float:
        if not isinstance(i, int):
            raise TypeError(f"ReadCounter takes one integer index at a time, got {type(i).__name__}")
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("ReadCounter index out of range")
        b = i // BLOCK
        held = self._at_hand.get(b)
        if held is None or i not in held[1]:
            self._ask.put(("need", b))
            values = self._answers.get()
            if values is _ABANDONED:
                raise _Abandoned()
            held = self._at_hand[b] = (values, set(range(b * BLOCK, b * BLOCK + len(values))))
        held[1].discard(i)
        self.reads += 1
        return held[0][i - b * BLOCK]

    def __iter__(self):
        for i in range(self._n):
            yield self[i]


_SESSION: dict[str, Any] = {}
_ABANDONED = object()  # what a suspended call gets when a new one starts: it ends, giving back its thread


class _Abandoned(BaseException):
    """Ends a counted call the judge no longer feeds (BaseException: `except Exception` lets it through)."""


def _next_event() -> dict[str, Any]:
    kind, value = _SESSION["ask"].get()
    if kind == "need":
        return {"need": value}
    _SESSION.clear()
    if kind == "error":
        raise value
    return {"result": value}


def counted_start(student, which: str, n: int) -> dict[str, Any]:
    """Start <which>_softmax_counted on a LazyCounter of n values: {"need": block} or {"result": ...}."""
    fn = student.function(f"online_softmax.{COUNTED[which]}")
    ask: queue.Queue[Any] = queue.Queue()
    answers: queue.Queue[Any] = queue.Queue()
    counter = LazyCounter(n, ask, answers)

    def run() -> None:
        try:
            ask.put(("done", fn(counter)))
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the scenario call
            ask.put(("error", exc))

    if "answers" in _SESSION:  # a call still waiting for values: end it first
        _SESSION["answers"].put(_ABANDONED)
    _SESSION.clear()
    _SESSION.update(ask=ask, answers=answers)
    threads.run(run)
    return _next_event()


def counted_feed(student, values: list[float]) -> dict[str, Any]:
    """The values of the block last asked for: {"need": block} or {"result": ...}."""
    if "answers" not in _SESSION:
        raise RuntimeError("no counted call is waiting for values")
    _SESSION["answers"].put([float(v) for v in values])
    return _next_event()


def counted(student, values: list[float], which: str) -> dict[str, Any]:
    """Run <which>_softmax_counted on ReadCounter(values): {"result", "n"} (the rebase test)."""
    fn = student.function(f"online_softmax.{COUNTED[which]}")
    counter = ReadCounter(values)
    return {"result": fn(counter), "n": len(counter)}
