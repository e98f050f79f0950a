"""One streaming pass over the columns (§4.3), measured in the judge from its replay of the call.

online_summary must make (m, ℓ) of each row in ONE pass over its N columns; online_softmax must make its
summary so too, then normalise. A dense summary (m = x.amax(-1), then Σ_j exp(x_j − m)) gives the same
values, so only the program's structure tells the two apart. `column_order` follows which columns of x every
value of the replay depends on, with the tag replay of liveness.py (views follow strides, data movement runs
the same op on the tags, elementwise ops combine their operands' tags, reductions combine what they reduce)
and a tag algebra of its own (ColumnTags): per element, the SET of x's columns it depends on, the column whose
value it carries (while it is not combined with another column's value: the "position"), and a mark for data
of a second pass (below).

When is a column read? Column c is READ at the first op that combines its data with any other column's data
(first(c): a reduction over columns, a maximum with the running max, ...; a copy, a cast or x·scale of the
whole of x reads nothing). The program's own order of first reads is the order of the pass, whatever it is:
left to right, right to left, shuffled, tile by tile.

The measure. At every op whose result reaches the call's result (liveness.live_ops: a dead guard is no
pass), for each operand element a and the union U of the columns the op's output element depends on:

    ahead(a) = |{ i ∈ U − cols(a) : first(i) > max_{j ∈ cols(a)} first(j) }|

the columns the op makes a depend on that were read AFTER everything a already depended on; and the op's
WIDTH, the columns it reads for the first time together. A streaming pass keeps both small: folding column j
into the running (m, ℓ) makes the state depend on one column read after it (ahead 1); a tile of B columns is
read together (width B) and merged into the state with ⊕ (ahead B for the state; exp(x_c − m_new) inside the
tile: 0, its max came from the same tile). A dense summary reads the whole row at once (x.amax: width N);
a second pass combines column 0 with a max that already included the N − 1 columns read after it
(ahead N − 1); so does a Python loop that first streams the max and then sums exp(x_j − m) with it.

The bound: every op holds ahead and width to at most N // 2. Derivation: §4.4 lets a row be cut into blocks,
each block summarised and the summaries merged in any grouping; a block is a proper part of the row (one
block of N IS the dense summary), and the largest block of a row cut in two is N/2. The balanced pairwise
tree of §4.4 (Flash-Decoding's final merge) reaches exactly N/2 at its root: (m, ℓ) of the first half ⊕
(m, ℓ) of the second half, whose columns were all read after the first half's. So tiles of up to N/2
columns, merged left to right, right to left or as a balanced tree, pass; the whole row at once (N − 1 or N)
fails, as does any merge in which a summary absorbs more than half a row read after it (a right fold over
summaries all computed first: that is "keep everything, combine at the end", the dense ⊕ of N one-column
summaries by other means). The designated inputs have N >= 64 (cases_part1.STREAM: 64), so tiles of 8, 16
and 32 pass, and N // 2 stays far from the N − 1 of a dense pass.

The normalising pass of online_softmax reads x again after its summary is complete: exp(x_c − m) / ℓ
combines column c with a max of every column (ahead up to N − 1). That is allowed for a RAW column (an
element that depends on one column and carries its value): the result is marked as second-pass data, keeps
column c's position, and may go on through elementwise ops and data movement to the result, but never be
combined with another column's data (a reduction over columns, a running sum, another column's value): that
would make a statistic from a second pass, e.g. ℓ = Σ_j exp(x_j − m) after the max.

What the tags cannot see, by construction: data laundered by arithmetic that changes nothing (a program that
keeps a buffer of every column and mixes each new column into every buffered element, x_c + 0·x_j, reads
each column "late" in the measure's terms: its state is the whole row, which no measure of order can tell
from a running (m, ℓ)); values brought in from outside the recorded ops (the twin replay catches them); and
the structure on inputs other than the designated ones (a program that streams only on those shapes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from autograder.engine import replay

from . import liveness

NONE, REDUCED = 0, 1  # the position field: no column's value / values of several columns / c + 2: column c's
_NEVER = 2**62  # first(c) of a column not read yet
# The replay's bounds on the call bound the work; the designated inputs are small (a legal call holds a few
# tensors of x's size at once: under 10^4 tagged elements), so these bound only a hostile record.
COLUMN_BUDGET = 2**18  # tagged elements at once (each (N + 2) int32)
COLUMN_SECONDS = 20.0


@dataclass
class Violation:
    kind: str  # "width": columns read together | "ahead": state of later columns | "second": a second pass folded
    at: int  # the op
    op: str  # its name
    columns: int = 0  # how many columns (read together, or read after)
    column: int = -1  # the column (the one of a raw element, or the last read of a state's)
    raw: bool = False  # the operand was one raw column of x
    later: int = -1  # the last read of the columns read after it

    def describe(self, fn: str, n: int, bound: int) -> str:
        where = f"at op {self.at} ({self.op}) of the call on {n} columns"
        if self.kind == "width":
            return (f"{fn} read {self.columns} columns of x at once {where}: a tile of at most N/2 = {bound} "
                    "columns is read at a time in one streaming pass, and the whole row at once is a dense pass")
        if self.kind == "ahead":
            what = f"column {self.column}" if self.raw else f"a state of the columns read up to column {self.column}"
            return (f"{fn} combined {what} with data that already included {self.columns} columns read after it "
                    f"(the last: column {self.later}) {where}: that is a second pass over x, not one streaming "
                    f"pass (a pass folds at most N/2 = {bound} new columns into what it has, §4.3)")
        if self.kind == "second":
            return (f"{fn} combined values of x read AFTER its summary was complete (a second pass) with other "
                    f"columns {where}: only the final normalisation exp(x - m) / ℓ may read x again, and it makes "
                    "no statistic of x")
        return f"{fn}: {self.kind} {where}"


class ColumnTags:
    """The tag algebra of column_order (module docstring), for liveness._TagReplay: per element int32 fields
    [0, n) the columns it depends on (0/1), n its position (NONE, REDUCED, c + 2), n + 1 the second-pass mark.
    The combinations measure `ahead` as they combine (the op is `now`), `after` the op's width."""

    dtype = torch.int32

    numbers_carry_nothing = False  # a row max of a one-row x is one element, and depends on every column

    def __init__(self, n: int, bound: int) -> None:
        self.n, self.width, self.bound = n, n + 2, bound
        self.pos, self.second = n, n + 1
        self.budget = COLUMN_BUDGET
        self.first = torch.full((n,), _NEVER, dtype=torch.int64)
        self.now, self.op = 0, ""
        self.violation: Violation | None = None
        self.tile = 0  # the most columns one op read together or folded in (ahead), legal or not
        self.unread = n  # columns not read yet
        self.seconds = False  # whether any second-pass data was made

    # -- the algebra's members (liveness.PairTags lists them) ----------------------------------------------

    def initial(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """x: its element [..., c] depends on column c and carries its value."""
        dim %= t.dim()
        col = torch.arange(t.shape[dim]).reshape([-1 if i == dim else 1 for i in range(t.dim())]).expand(t.shape)
        tag = self.zeros(*t.shape)
        tag[..., :self.n].scatter_(-1, col.unsqueeze(-1), 1)
        tag[..., self.pos] = col.to(torch.int32) + 2
        return tag

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, self.width, dtype=torch.int32)

    def marked(self, t: torch.Tensor) -> torch.Tensor:
        return t[..., :self.n].amax(-1) > 0

    @staticmethod
    def summarise(flat: torch.Tensor) -> None:
        return None

    def combine(self, a: torch.Tensor | None, b: torch.Tensor | None, exempt: bool = True) -> torch.Tensor | None:
        """The union of two operands' columns. A position meets another position, or state (REDUCED), as
        REDUCED (x_j folded into the running max is a statistic), except that second-pass data keeps its
        position through state (exp(x_c - m) / ℓ is still column c's). A raw column combined with data of many
        later columns (the normalising pass) is no violation: the element is marked second-pass data at that
        column's position."""
        if a is None:
            return b
        if b is None:
            return a
        a, b = torch.broadcast_tensors(a, b)
        out = torch.maximum(a, b)
        pa, pb = a[..., self.pos], b[..., self.pos]
        ia, ib = pa >= 2, pb >= 2
        keep_a = ia & ((pb == NONE) | (pb == pa) | ((pb == REDUCED) & (a[..., self.second] > 0)))
        keep_b = ib & ((pa == NONE) | (pa == pb) | ((pa == REDUCED) & (b[..., self.second] > 0)))
        out[..., self.pos] = torch.where(keep_a, pa, torch.where(keep_b, pb, torch.where(ia | ib, REDUCED,
                                                                                             torch.maximum(pa, pb))))
        ea, eb = self._ahead(a, out, exempt), self._ahead(b, out, exempt)
        if ea is not None or eb is not None:
            ea = ea if ea is not None else torch.zeros_like(pa, dtype=torch.bool)
            eb = eb if eb is not None else torch.zeros_like(pa, dtype=torch.bool)
            out[..., self.second] = torch.where(ea | eb, 1, out[..., self.second])
            both = ea & eb & (pa != pb)
            out[..., self.pos] = torch.where(both, REDUCED, torch.where(ea, pa, torch.where(eb, pb, out[..., self.pos])))
        return out

    def spread(self, full: torch.Tensor | None, spread: torch.Tensor | None) -> torch.Tensor | None:
        return self.combine(full, spread)

    def contract(self, rows: torch.Tensor | None, cols: torch.Tensor | None) -> torch.Tensor | None:
        return self.combine(rows, cols, exempt=False)

    def reduce(self, t: torch.Tensor, dims: list[int], keepdim: bool, keep: bool = True) -> torch.Tensor:
        """Over real dims `dims`: the union of the columns; one position that every element has stays (a
        reduction over rows of one column), several positions or state make REDUCED."""
        if not dims:
            return t
        if t.numel() == 0:
            shape = [1 if i in dims else s for i, s in enumerate(t.shape[:-1])] if keepdim else \
                [s for i, s in enumerate(t.shape[:-1]) if i not in dims]
            return self.zeros(*shape)
        out = t.amax(dims, keepdim=True)
        pos = t[..., self.pos]
        ids = pos >= 2
        hi = torch.where(ids, pos, -1).amax(dims, keepdim=True)
        lo = torch.where(ids, pos, liveness._BIG).amin(dims, keepdim=True)
        state = (pos == REDUCED).any(dims[0], keepdim=True) if len(dims) == 1 else \
            (pos == REDUCED).amax(dims, keepdim=True)
        out[..., self.pos] = torch.where(hi >= 2, torch.where((lo == hi) & ~state, hi, REDUCED), out[..., self.pos])
        self._ahead(t, out, False)
        if not keepdim:
            out = out.reshape([s for i, s in enumerate(out.shape) if i not in dims])
        return out

    def reduction(self, t: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
        """A reduction op's tags (sum, amax, ...)."""
        return self.reduce(t, dims, keepdim, keep=False)

    def reduce_all(self, t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1, self.width)
        return self.reduce(flat, [0], False) if flat.shape[0] else self.zeros()

    def line(self, moved: torch.Tensor, tags: torch.Tensor, dim: int) -> torch.Tensor:
        """sort / topk: every value depends on its whole line (its place in it), whatever it carries."""
        whole = self.reduce(tags, [dim], True)
        out = moved.clone()
        out[..., :self.n] = whole[..., :self.n].expand(*moved.shape[:-1], self.n)
        out[..., self.second] = torch.maximum(out[..., self.second], whole[..., self.second])
        return out

    def indexed(self, out: torch.Tensor | None, index: list[torch.Tensor]) -> torch.Tensor | None:
        """Data chosen by index tensors made from x depends on what the indices depend on."""
        whole = None
        for t in index:
            whole = self.combine(whole, self.reduce_all(t), exempt=False)
        if out is None:
            return whole
        return self.combine(out, whole.expand_as(out), exempt=False)

    # -- the measure ---------------------------------------------------------------------------------------

    def begin(self, index: int, op: Any) -> None:
        self.now, self.op = index, op.info.name

    def _ahead(self, a: torch.Tensor, u: torch.Tensor, exempt: bool) -> torch.Tensor | None:
        """Per element of a: the columns of u (the union, broadcast to a) read after all of a's; records a
        violation above the bound. Returns the exempt elements (raw columns, when `exempt`), or None."""
        n = self.n
        am = a[..., :n] > 0
        more = (u[..., :n] > 0) & ~am  # u adds these columns (most combinations add none: the same state)
        if not bool(more.any()) or not bool(am.any()):
            return None
        eff = torch.where(self.first == _NEVER, self.now, self.first)
        h = torch.where(am, eff, -1).amax(-1)
        new = more & (eff > h.unsqueeze(-1))
        ahead = new.sum(-1)
        raw = (am.sum(-1) == 1) & (a[..., self.pos] >= 2) if exempt else torch.zeros_like(h, dtype=torch.bool)
        self.tile = max(self.tile, int(torch.where(raw, 0, ahead).max()))  # the normalising pass is no tile
        over = ahead > self.bound
        if not bool(over.any()):
            return None
        bad = over & ~raw
        if self.violation is None and bool(bad.any()):
            i = int(torch.where(bad, ahead, -1).reshape(-1).argmax())
            cols_a, cols_new = am.reshape(-1, n)[i], new.reshape(-1, n)[i]
            self.violation = Violation(
                "ahead", self.now, self.op, columns=int(cols_new.sum()),
                column=int(torch.where(cols_a, eff, -1).argmax()), raw=bool(cols_a.sum() == 1),
                later=int(torch.where(cols_new, eff, -1).argmax()))
        ex = over & raw
        if not bool(ex.any()):
            return None
        self.seconds = True
        return ex

    def after(self, outs: list[torch.Tensor]) -> None:
        """After an op: the columns it read for the first time (its width), and second-pass data combined
        with other columns."""
        n = self.n
        if self.seconds:
            for t in outs:
                if bool(((t[..., self.second] > 0) & (t[..., self.pos] < 2)).any()):
                    self.violation = self.violation or Violation("second", self.now, self.op)
        if not self.unread:
            return
        read = torch.zeros(n, dtype=torch.bool)
        for t in outs:
            cols = t.reshape(-1, self.width)[:, :n] > 0
            read |= (cols & (cols.sum(-1, keepdim=True) >= 2)).any(0)
        new = read & (self.first == _NEVER)
        width = int(new.sum())
        if width:
            self.first[new] = self.now
            self.unread -= width
            self.tile = max(self.tile, width)
            if width > self.bound and self.violation is None:
                self.violation = Violation("width", self.now, self.op, columns=width)


@dataclass
class Order:
    """column_order's verdict on one replayed call."""

    n: int  # columns
    bound: int  # N // 2
    tile: int  # the most columns an op read together or folded into what it had
    violation: Violation | None
    unfollowed: str  # why the tags could not follow the call (then it fails)
    seconds: float  # the judge's CPU time for the measure

    @property
    def ok(self) -> bool:
        return self.violation is None and not self.unfollowed

    def describe(self, fn: str) -> str:
        if self.unfollowed:
            return f"the grader could not follow {fn}'s use of x's columns: {self.unfollowed}"
        return self.violation.describe(fn, self.n, self.bound) if self.violation else ""


def column_order(rp: replay.Replayed, x_ref: int = 0, lives: liveness.Lives | None = None) -> Order:
    """The streaming structure of a replayed call on x = input `x_ref` (..., N) (module docstring)."""
    start = time.process_time()
    x = rp.env.get(x_ref)
    n = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    bound = n // 2
    if n < 4:  # two columns or three: any order is a tile of at most N/2 + 1; nothing to measure
        return Order(n, bound, 0, None, "", time.process_time() - start)
    lives = lives or liveness.lives_of(rp)
    live = liveness.live_ops(rp, lives)
    alg = ColumnTags(n, bound)
    tr = liveness._TagReplay(rp, {x_ref: -1}, lives, alg)
    env = rp.env
    for index, op in liveness.follow(tr, COLUMN_SECONDS, live, before=alg.begin):
        if op.info.view or op.info.scalar_out or not live[index]:
            continue
        outs = [tv for leaf in op.leaves if type(leaf) is int and isinstance(env.get(leaf), torch.Tensor)
                and (tv := tr.view(env[leaf])) is not None]
        if outs:
            alg.after(outs)
        if alg.violation is not None:
            break
    return Order(n, bound, alg.tile, alg.violation, tr.unfollowed, time.process_time() - start)
