"""StudentError: what a call into student code that did not return plain data becomes in the judge."""
from __future__ import annotations

from . import sanitize


# kinds of StudentError that depend on the machine's load or on the judge's state, not on the code alone: a part
# or a test with one is never reused (engine/reuse.py, engine/transcripts.py)
LOST_KINDS = frozenset({"timeout", "crash", "exit", "output", "memory", "protocol", "reply", "gave_up"})


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


# What an exception of torch, numpy or Python in student code most often means in this assignment: the
# hint a failed public test adds to the exception's own line (runner._message). First match wins; the
# patterns see the sanitized "<function> raised <type>: <first line>" text, never a hidden test's.
EXCEPTION_HINTS: tuple[tuple[str, str], ...] = (
    (r"expected (scalar type|m1 and m2 to have the same dtype)|found dtype|must have the same dtype|"
     r"dtype .*(mismatch|doesn't match)|expected .* dtype|to have the same dtype",
     "two tensors of different dtypes meet: create every buffer, accumulator and cache in its input's dtype "
     "(dtype=q.dtype, or the model's weight dtype), not torch's default float32"),
    (r"non-zero size|zero-size|with no elements|empty sequence|max\(\) arg is an empty",
     "a reduction over an empty dim: a block, segment or row with 0 keys must give the identity of ⊕, "
     "(m, ℓ, o) = (-inf, 0, 0) and lse = -inf (§4.4)"),
    (r"must match the size of tensor|size mismatch|shapes cannot be multiplied|The size of tensor a|"
     r"mat1 and mat2|cannot be broadcast|could not be broadcast|doesn't match the broadcast shape",
     "two operands' shapes do not fit at that line: print both shapes. The usual causes here: a reduction over "
     "the wrong dim (dim=0 vs dim=-1) left the wrong size; a row statistic (..., N) meets a (..., N, d) tensor "
     "without its trailing dim (unsqueeze(-1))"),
    (r"(from|to) shared \S+ is out of bounds",
     "a shared array smaller than the layout that indexes it: declare it with room for every index its loads and "
     "stores use (a tile whose rows are padded to d + 1 words needs rows·(d + 1)); a ragged last block needs a "
     "guard on its rows, not a smaller array"),
    (r"Dimension out of range",
     "a dim that this input does not have: count dims from the end (dim=-2 for the keys or rows, -1 for the "
     "features), never a fixed dim=2 or dim=3, so that any number of leading dims works"),
    (r"out of (bounds|range)|IndexError",
     "an index past the end at that line: a guard for the ragged last block (it ends at N, not at start + B), or "
     "an offset or stride too large (a head's rows start at head·N with that buffer's own N: Nq for Q, O and L, "
     "Nk for K and V)"),
    (r"OverflowError|math range error",
     "math.exp overflows above 709: subtract the running max before exp (§4.2), and when the max grows ℓ is "
     "rescaled by exp(m_old - m_new) <= 1, never by exp(m_new - m_old) (§4.3)"),
    (r"modified by an inplace operation|a leaf Variable that requires grad",
     "autograd needs the tensors it saved unchanged: write to a new tensor instead of in place, or "
     "compute the backward by hand in the Function (§7)"),
)


# graded functions that loop over blocks: a shape error there may be a ragged last block
_TILED = ("flash_forward", "flash_backward", "flash_kernel", "FlashAttention", "flash_attention", "online_summary")
_RAGGED = ("; or a ragged last block holds fewer than B rows or keys (slice it as [start:min(start + B, N)])")


def exception_hint(text: str) -> str | None:
    """The hint for a student exception's line (EXCEPTION_HINTS), or None. A shape error says the sizes
    torch reported, and names a ragged last block only in a function that works in blocks."""
    import re

    for pattern, hint in EXCEPTION_HINTS:
        if re.search(pattern, text):
            if hint is EXCEPTION_HINTS[2][1]:
                sizes = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
                                  r"non-singleton dimension (\d+)", text)
                if sizes:
                    hint = hint.replace("print both shapes", f"sizes {sizes[1]} and {sizes[2]} meet along dim "
                                                             f"{sizes[3]}")
                function = text.split(" raised ", 1)[0]
                if "kernel" in function:  # the simulator's arrays: the thread axis is the last one, always
                    hint = ("two operands' shapes do not fit at that line: print both shapes. In a kernel every "
                            "per-thread value keeps the thread axis LAST: a row statistic is (L,), a row of d values "
                            "per thread is (d, L), never (L, d) (docs/gpusim_guide.md); a reduction over the tile's "
                            "keys is over axis 0 of the (keys, L) scores")
                elif any(t in function for t in _TILED):
                    hint += _RAGGED
            return hint
    return None
