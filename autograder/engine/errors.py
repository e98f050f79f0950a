"""StudentError: what a call into student code that did not return plain data becomes in the judge."""
from __future__ import annotations

from . import sanitize


class StudentError(Exception):
    """A call into student code did not return plain data. str() is one line for the feedback.

    kind: not_implemented | exception | import | missing | timeout | crash | exit | memory |
          output | not_plain | refused | gave_up | protocol
    Every field the submission could choose (message, function, where, exc_type, detail) is
    sanitized here, once: one line of printable text of bounded length.
    """

    def __init__(self, message: str, *, kind: str, target: str, function: str | None = None,
                 where: tuple[str, int] | None = None, detail: str = "", exc_type: str | None = None) -> None:
        message = sanitize.line(message, 500)
        super().__init__(message)
        self.kind, self.target = kind, sanitize.line(target, 120)
        self.function = sanitize.line(function, 100) if function is not None else None
        self.where = (sanitize.line(where[0], 100), where[1] if type(where[1]) is int else 0) if where else None
        self.detail = sanitize.block(detail, 4000) if detail else ""
        self.exc_type = sanitize.line(exc_type, 80) if exc_type is not None else None
