"""StudentError: what a call into student code that did not return plain data becomes in the judge."""
from __future__ import annotations


class StudentError(Exception):
    """A call into student code did not return plain data. str() is one line for the feedback.

    kind: not_implemented | exception | import | missing | timeout | crash | exit | memory |
          output | not_plain | refused | gave_up | protocol
    """

    def __init__(self, message: str, *, kind: str, target: str, function: str | None = None,
                 where: tuple[str, int] | None = None, detail: str = "", exc_type: str | None = None) -> None:
        message = " ".join(str(message).split())  # one line, always
        super().__init__(message)
        self.kind, self.target, self.function, self.where = kind, target, function, where
        self.detail, self.exc_type = detail, exc_type

    def redacted(self) -> str:
        """The message without anything student code controls (used for hidden tests): a
        submission could otherwise smuggle a hidden input out in an exception message, an exit
        code or an allocation size."""
        who = self.function or self.target
        loc = f" ({self.where[0]}:{self.where[1]})" if self.where else ""
        if self.kind == "exception":
            return f"{who} raised {self.exc_type or 'an exception'}{loc}"
        if self.kind == "exit" and "exited with status" in str(self):
            return f"worker exited during {self.target} (os._exit or a fatal error)"
        if self.kind == "exit":
            return f"{who} called sys.exit(){loc}; a graded function must return, not exit"
        if self.kind == "memory":
            return f"{who} ran out of memory{loc}"
        return str(self)
