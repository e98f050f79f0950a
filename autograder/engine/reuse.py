"""Reuse a part's result for a later submission whose files that part reaches are byte-identical.

A batch grades many submissions that share files: every part a student left untouched is the
starter's file, resubmissions repeat whole folders, and many buggy submissions differ from a correct
one in one file only. A part's result is a function of

- the bytes of the graded files it can run (deps.reach: its files, its `uses`, their relative
  imports), or why each was not taken (missing, not UTF-8...);
- the tests, the engine, the environment (runner._hashes) and the run's settings (test sets, what
  is redacted, the limits with the batch's scaled call time limits);

because the tests are deterministic, the judge decides every point from its own replay, and every
part gets workers of its own (Limits.worker_per_part), so no other part's code runs before it in the
same interpreter. The store holds such results in the judge's own memory (no worker can reach it),
keyed by a SHA-256 of all of the above. A batch shares it among its judges (instructor/batch.py:
each judge sends what it graded, the batch passes it on) and seeds it with the reference's parts,
graded anyway to scale the call time limits.

What is never kept: a part whose calls were lost (a timeout, a crash, out of memory: these depend on
the machine's load), one that gave up (the grade's time budget), one with a test that could not run,
and every part of a run that reported an error of its own.

A part whose code could read another graded file as data or import one by a name it computes (open,
importlib, getattr, a dunder: deps.DYNAMIC) reaches every graded file (deps.reach): its key is then
every graded file's bytes, so two submissions share its result only where all their files agree.
"""
from __future__ import annotations

import copy
import hashlib
import json
from collections import OrderedDict
from typing import Any

ENTRY_BYTES = 1 << 20  # a part's result larger than this (printed output, mostly) is not kept
TOTAL_BYTES = 128 << 20  # the store's bound; the least recently used results go first


def part_key(part: int, reached: dict[str, str], settings: dict[str, Any]) -> str:
    """The SHA-256 of everything a part's result may depend on. reached: {file: its text, or
    "\\0" + why it was not taken} for every file the part reaches; settings: plain JSON data."""
    files = {name: hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() for name, text in reached.items()}
    blob = json.dumps({"part": part, "files": files, "settings": settings}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


class PartResults:
    """Results of parts graded earlier in this process: {key: {"row": the part's report row,
    "tests": its tests}} (JSON data, hidden tests already redacted), least recently used out first."""

    def __init__(self, total_bytes: int = TOTAL_BYTES, entry_bytes: int = ENTRY_BYTES) -> None:
        self._entries: OrderedDict[str, tuple[dict, int]] = OrderedDict()
        self.total_bytes, self.entry_bytes = total_bytes, entry_bytes
        self.size = 0
        self.hits = self.misses = 0
        self._new: list[str] = []  # keys graded here since the last take_new (a batch shares them)

    def get(self, key: str) -> dict | None:
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return copy.deepcopy(found[0])

    def put(self, key: str, entry: dict, shared: bool = False) -> bool:
        """Keep `entry` (a deep copy); False when it is too large to keep. shared: it came from
        another judge of the batch (take_new leaves it out)."""
        n = len(json.dumps(entry))
        if n > self.entry_bytes or key in self._entries:
            return False
        self._entries[key] = (copy.deepcopy(entry), n)
        self.size += n
        if not shared:
            self._new.append(key)
        while self.size > self.total_bytes:
            _, (_, m) = self._entries.popitem(last=False)
            self.size -= m
        return True

    def entries(self) -> list[dict]:
        """Copies of every entry kept, least recently used first."""
        return [copy.deepcopy(e) for e, _ in self._entries.values()]

    def take_new(self) -> dict[str, dict]:
        """{key: entry} of what was put here (not shared) since the last call and is still kept: a
        batch judge sends them to the batch, which passes them on to its other judges."""
        new = {k: copy.deepcopy(self._entries[k][0]) for k in self._new if k in self._entries}
        self._new.clear()
        return new

    def __len__(self) -> int:
        return len(self._entries)
