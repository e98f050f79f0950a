"""StudentError: what a call into student code that did not return plain data becomes in the judge."""
from __future__ import annotations

from . import sanitize

# What a hidden test's failure says, per kind: text the judge wrote, nothing else. The kind itself
# is one of this fixed set (judge.py maps anything else to "exception").
_HIDDEN_TEXT = {
    "not_implemented": "not implemented yet — {name} raises NotImplementedError",
    "exception": "calling {target} raised an exception",
    "import": "importing the file of {target} failed (the public tests show why)",
    "exit": "the worker exited during {target}; a graded function must return, not exit",
    "memory": "calling {target} ran out of memory",
    "timeout": "calling {target} took longer than its time limit",
    "crash": "the worker crashed during {target}",
    "output": "calling {target} printed more output than the limit",
    "not_plain": "{target} returned something that is not plain data (tensors, numbers, tuples, lists, dicts)",
    "protocol": "the worker sent malformed data during {target}",
}
HIDDEN_SUFFIX = " (hidden test: details are not shown)"


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

    def redacted(self) -> str:
        """The failure of a hidden test: only text the judge wrote (the kind and the judge's own
        target name). No exception name or message, type name, qualname, file name, line, exit
        status or signal: a submission chooses each of them and could spell a hidden input in it."""
        template = _HIDDEN_TEXT.get(self.kind)
        if template is None:  # missing, refused, gave_up: decided before the call, from judge-side facts
            return str(self)
        name = self.target.rsplit(".", 1)[-1]
        return template.format(target=self.target, name=name) + HIDDEN_SUFFIX
