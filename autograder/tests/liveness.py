"""What is live when in a replayed program, measured in the judge from the replay (engine/replay.Replayed).

The rules of parts 2, 4 and 6 that bound a program's tensors one by one (no new storage of Nq × Nk, every
q·kᵀ matmul over at most B_c keys) say nothing of MANY tensors that exist at once: the scores of a B_r × Nk
row panel assembled from tile matmuls (cat, stack, slice assignment or index_put into a buffer, a Python
list or dict of tiles, ctx attributes), P tiles kept from the forward for the backward. Those are programs
in which the tiles' data is live together. This module measures, from the replay's own fields (the ops,
their reads and outputs, the tensors of the replay and their storages):

- `Lives`: the live interval of every storage: from the op that first writes it to the last op that reads
  any view of it (in-place writes and views share the storage); the call's result stays live to the end;
- `live_ops` / `live_matmul_flops`: which ops' results reach the call's result (through any storage they
  write, in place too), and the matmul FLOPs of those ops only: a product nobody uses is no work done;
- `peak_score_like`: the largest number of elements that storages made from both the query side and the
  key side (scores, P̃, statistics, accumulators, outputs: cases_part2.Sides) hold at one time;
- `kept_for_backward`: the storages a forward made that its backward reads, in total;
- `pair_keys`: the §5.1 invariant itself. Every element of every tensor is tagged with the query row and
  the key it is indexed by (a tag replay: views follow the replay's own strides, data movement runs the
  same op on the tags, elementwise ops combine their operands' tags, reductions and matmul contractions
  over keys leave "reduced" tags): S, P̃, dP, dS and anything moved or computed from them element by
  element carry one query row and one key; m, ℓ, acc, o, dq, dk are reduced over keys or over queries.
  Then, per query row, the keys that its live (query, key) data spans at any time are counted:
  FlashAttention holds one B_r × B_c tile (of one K/V block) at a time, whatever the loop order, the
  number of (batch, head) pairs at once or the dtype; a row panel, however it was put together, or P
  tiles kept for later, span more.

What the tags cannot see, by construction (a reduction must leave reduced tags, or the row max of a tile
would be a tile): scores of one key laundered through a reduction that loses nothing (a sum over a dim of
one; over data of several keys, or of none, such a reduction is a copy: _combines_nothing), mixed
elementwise with other keys' data of their own shape, or, one key at a time (a column of one key), with a
reduced tensor of their own shape (_keeps_several), or packed two keys to an element by arithmetic; and
an invertible transform along the keys done as a matmul (whose FLOPs the FLOP rules count). The peak of
live data made from q and k (a measure of memory, blind to all tags) backs them where the shapes separate.
A product whose value is multiplied by zero still reaches the result: live_ops follows data, not values.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple

import torch
from torch.utils._pytree import tree_flatten

from autograder.engine import replay

# ---------------------------------------------------------------------------------------------------
# storages and their live intervals


def _storage(t: Any) -> tuple[int, int, int] | None:
    """(data pointer, bytes, element size) of a tensor's storage; None for an empty or unreadable one."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if st.nbytes() == 0:
        return None
    return st.data_ptr(), st.nbytes(), t.element_size()


@dataclass
class Storage:
    """One storage of the replay (every tensor of the replay stays in its env, so no storage is freed and
    reused during it: a data pointer names one storage)."""

    ptr: int
    nbytes: int
    itemsize: int  # the smallest element size of the tensors that view it
    first: int  # the op that first wrote it (-1: it existed before the first op: an input, a constant)
    last_read: int  # the last op that read any view of it (-1: none)
    last: int  # its end of life: last_read, its last write, or the end of the program for the result
    refs: list[int] = field(default_factory=list)
    example: int = -1  # the ref that first showed it (for messages: its shape)

    @property
    def elements(self) -> int:
        return self.nbytes // max(1, self.itemsize)


class Lives:
    """The storages of a replay with their live intervals (see the module docstring)."""

    def __init__(self, rp: replay.Replayed) -> None:
        self.env = rp.env  # not rp itself: lives_of keeps this in rp.analyses, and a cycle would outlive the test
        self.n_ops = len(rp.prepared)
        self.of_ref: dict[int, int] = {}  # ref -> data pointer of its storage
        self.storages: dict[int, Storage] = {}
        for ref, t in rp.env.items():
            key = _storage(t)
            if key is None:
                continue
            ptr, nbytes, itemsize = key
            self.of_ref[ref] = ptr
            produced = rp.producer.get(ref, -1)
            reads = rp.readers.get(ref)
            last_read = reads[-1] if reads else -1
            s = self.storages.get(ptr)
            if s is None:
                s = self.storages[ptr] = Storage(ptr, nbytes, itemsize, produced, last_read, max(produced, last_read),
                                                 example=ref)
            else:
                s.itemsize = min(s.itemsize, itemsize)
                if produced < s.first:
                    s.first, s.example = produced, ref
                s.last_read = max(s.last_read, last_read)
                s.last = max(s.last, produced, last_read)
            s.refs.append(ref)
        self.result_ptrs = {k[0] for t in tree_flatten(rp.result)[0] for k in [_storage(t)] if k is not None}
        for ptr in self.result_ptrs:
            if ptr in self.storages:
                self.storages[ptr].last = self.n_ops
        n_in = len(rp.inputs)
        self.input_ptrs = {self.of_ref[r] for r in range(n_in) if r in self.of_ref}

    def storage(self, ref: int) -> Storage | None:
        ptr = self.of_ref.get(ref)
        return self.storages.get(ptr) if ptr is not None else None

    def shape(self, s: Storage) -> tuple[int, ...]:
        t = self.env.get(s.example)
        return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def lives_of(rp: replay.Replayed) -> Lives:
    """rp's Lives, made on first use and kept with the replay (rp.analyses): a test's live_ops, pair_keys,
    peak_score_like and kept_for_backward all read the same storages of the same finished replay."""
    lives = rp.analyses.get("lives")
    if lives is None:
        lives = rp.analyses["lives"] = Lives(rp)
    return lives


# ---------------------------------------------------------------------------------------------------
# live ops and their FLOPs


def live_ops(rp: replay.Replayed, lives: Lives | None = None) -> list[bool]:
    """Per op: whether its results reach the call's result. Followed backwards through storages: an op is
    live when it writes (a new tensor, or in place) a storage that a live op reads later, or the result;
    then every storage it reads is live before it. Views move no data (they are live with their storage);
    an op that returns a Python number (.item()) feeds no tensor."""
    lives = lives or lives_of(rp)
    live_ptrs = set(lives.result_ptrs)
    out = [False] * lives.n_ops
    of_ref = lives.of_ref
    for index in range(lives.n_ops - 1, -1, -1):
        op = rp.prepared[index]
        if op.info.view or op.info.scalar_out:
            continue
        if any(type(leaf) is int and of_ref.get(leaf) in live_ptrs for leaf in op.leaves):
            out[index] = True
            for ref in op.reads:
                ptr = of_ref.get(ref)
                if ptr is not None:
                    live_ptrs.add(ptr)
    return out


def live_matmul_flops(rp: replay.Replayed, start: int = 0, end: int | None = None,
                      live: list[bool] | None = None) -> int:
    """Matmul FLOPs (as the replay counts them: matmuls, trusted ops, broadcast products) of the live ops
    in [start, end): the work whose results reach the call's result."""
    live = live_ops(rp) if live is None else live
    end = len(live) if end is None else end
    at = rp.flops_at
    return sum(at[i + 1] - at[i] for i in range(start, end) if live[i])


# ---------------------------------------------------------------------------------------------------
# peak live data made from the query side and the key side


class Peak(NamedTuple):
    elements: int  # the most elements live at once
    at: int  # the op where that peak is reached
    largest: list[tuple[tuple[int, ...], int]]  # (shape, elements) of the largest storages live then


def peak_elements(lives: Lives, storages: Iterable[Storage]) -> Peak:
    """The largest total of elements of these storages live at one op (each live over [first, last])."""
    chosen = [s for s in storages if s.elements]
    events: list[tuple[int, int, int]] = []  # (op, 0 = a storage ends before it / 1 = starts at it, elements)
    for s in chosen:
        events.append((max(0, s.first), 1, s.elements))
        events.append((s.last + 1, 0, -s.elements))
    events.sort()
    total = best = 0
    at = 0
    for op, _, n in events:
        total += n
        if total > best:
            best, at = total, op
    live = sorted((s for s in chosen if max(0, s.first) <= at <= s.last), key=lambda s: -s.elements)
    return Peak(best, at, [(lives.shape(s), s.elements) for s in live[:4]])


def peak_score_like(rp: replay.Replayed, sides: dict[int, int] | None = None, lives: Lives | None = None) -> Peak:
    """The peak of live elements in storages made from both the query side and the key side (cases_part2.Sides:
    what was written into a storage, through any view, counts for all of it)."""
    from .cases_part2 import KEY_SIDE, QUERY_SIDE, Sides

    lives = lives or lives_of(rp)
    sd = Sides(rp, sides)
    sd.follow()
    both = QUERY_SIDE | KEY_SIDE
    return peak_elements(lives, [s for ptr, s in lives.storages.items() if sd.storage.get(ptr, 0) & both == both])


def kept_for_backward(rp: replay.Replayed, mark: str = "backward", lives: Lives | None = None) -> list[Storage]:
    """The storages (not the inputs') that exist before the first op at `mark` and that an op after it reads:
    what a forward kept for its backward, however it was kept (saved tensors, ctx attributes, closures,
    Python lists and dicts of tiles)."""
    at = rp.marks.get(mark, [None])[0]
    if at is None:
        return []
    lives = lives or lives_of(rp)
    return [s for ptr, s in lives.storages.items()
            if ptr not in lives.input_ptrs and s.first < at <= s.last_read
            and any(i >= at for ref in s.refs for i in rp.readers.get(ref, ()))]


# ---------------------------------------------------------------------------------------------------
# the (query, key) tag replay

NONE, REDUCED = 0, 1  # a tag field: 0 depends on no row, 1 reduced over several, r + 2 indexed by row r
# The tag replay's own bounds (the replay's budget lets a record hold 4 GiB of new tensors and run for a
# minute a pass; tags take 8 bytes an element, and the tags of a storage that no later op reads are
# dropped): the largest legal calls of the tests hold under 10^5 tagged elements at once and take under
# 15 s on a loaded machine (row-vector and per-key variants at Nq = Nk = 1023, 10^5 ops); a record above
# either bound is not followed and counts as every key.
TAG_BUDGET = 2**25
TAG_SECONDS = 60.0
QUERY, KEY = 0, 1  # the two fields of a tag: the query row, the key

_REDUCTIONS = frozenset("sum mean amax amin argmax argmin all any prod std var logsumexp max min sum_to_size".split())
_OWN_LINE = frozenset({"_softmax", "_log_softmax", "cumsum"})  # same shape: softmax(S) is still S's (query, key)
_MATMUL = frozenset("mm bmm mv dot vdot addmm addmv addbmm baddbmm".split())
_CREATION = frozenset("arange empty empty_like empty_strided full full_like linspace new_empty new_empty_strided "
                      "new_full new_ones new_zeros ones ones_like scalar_tensor zeros zeros_like zero fill".split())
# data movement: the same op on the tags (dims made non-negative, index arguments the replay's own)
_MOVES = frozenset("cat stack repeat expand_copy slice_copy select_copy index index_select gather embedding index_put "
                   "index_copy index_add scatter _unsafe_view sort topk flatten unfold reshape".split())
_SCALAR = frozenset("_local_scalar_dense item is_nonzero equal".split())
_ELEMENTWISE = (replay.ELEMENTWISE | replay.OUTER_OPS | {"masked_fill", "where", "clamp", "rsub", "maximum", "minimum"}) \
    - {"copy", "fill", "zero"}
# how the tag replay treats each op of the replay's allow-list (tests/test_tracer.py checks that none is missing;
# an op without a rule would make its outputs reduced: the rules would miss data moved through it)
KINDS = {**{n: "elementwise" for n in _ELEMENTWISE}, **{n: "reduction" for n in _REDUCTIONS},
         **{n: "own_line" for n in _OWN_LINE}, **{n: "matmul" for n in _MATMUL},
         **{n: "creation" for n in _CREATION}, **{n: "move" for n in _MOVES}, **{n: "scalar" for n in _SCALAR},
         "copy": "copy", "einsum": "decomposed"}


def _plain(short: str) -> str:
    return short[:-1] if short.endswith("_") and not short.endswith("__") else short


def _tensors(x: Any, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The tensors among the leaves of an op's decoded arguments, in tree_flatten's order: replay._dec puts
    them in plain lists, tuples and dicts only, so a walk of those finds the same ones without pytree's
    machinery (a tenth of its time on reshape's list of sizes)."""
    out = [] if out is None else out
    kind = type(x)
    if kind is list or kind is tuple:
        for item in x:
            _tensors(item, out)
    elif kind is dict:
        for item in x.values():
            _tensors(item, out)
    elif isinstance(x, torch.Tensor):
        out.append(x)
    return out


def _combine(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """Two tags of one element (operands of the same extent): an id with none stays that id; reduced with
    anything is reduced (a running maximum or sum: m, ℓ, acc absorb each key they meet); two different ids
    are reduced too (a per-key online softmax combines key after key)."""
    if a is None:
        return b
    if b is None:
        return a
    return _combined(torch.minimum(a, b), torch.maximum(a, b))


def _combined(mn: torch.Tensor, mx: torch.Tensor) -> torch.Tensor:
    """_combine from the elementwise minimum and maximum of the two tags."""
    return torch.where((mn == 0) | (mn == mx), mx, REDUCED)


def _several(t: torch.Tensor) -> torch.Tensor:
    """Per field (query, key): whether the tags t name more than one row (a tile of scores, not the data
    of one key or one query row)."""
    ids = t.reshape(-1, t.shape[-1])
    low = torch.where(ids >= 2, ids, _BIG).amin(0)
    return (low < _BIG) & (low < ids.amax(0))


def _keeps_several(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """_combine, except that an operand whose field names several rows (a tile of several keys: then its
    query rows too, even one) keeps its ids where the other operand is reduced: a statistic of the tile's
    own shape (a row max expanded and made contiguous, a row sum repeated) mixed into scores, as in
    s + 0·R, leaves them scores, as a broadcast statistic does (_spread). Data of ONE key combined with a
    reduced tensor is still reduced, since that is how a per-key online softmax folds each key into m, ℓ
    and acc (and P·V of a one-key segment is a mul, not a matmul): the price is that scores mixed one key
    at a time stay out of sight."""
    if a is None or b is None:
        return _combine(a, b)
    mn, mx = torch.minimum(a, b), torch.maximum(a, b)
    out = _combined(mn, mx)
    # an id of one operand meets REDUCED in the other exactly where the smaller tag is REDUCED and the larger an
    # id: nowhere, mostly, and then the loop below keeps nothing (one test instead of one per operand)
    if a.numel() and b.numel() and not bool(((mn == REDUCED) & (mx >= 2)).any()):
        return out
    for t, other in ((a, b), (b, a)):
        kept = (t >= 2) & (other == REDUCED)  # where an id of t can stay: the other operand is reduced there
        if t.numel() and not bool(kept.any()):
            continue  # (nothing to keep, as for m·α: _several is the costly part; an empty t raises in it)
        keep = _several(t)
        if bool(keep[KEY]):  # scores of several keys stay (query, key) data, of one query row too (a decode)
            keep[QUERY] = True
        if bool(keep.any()):
            out = torch.where(keep & kept, t, out)
    return out


def _spread(full: torch.Tensor | None, spread: torch.Tensor | None) -> torch.Tensor | None:
    """An element's tag from its full operands' tag and its broadcast operands' tag: a statistic broadcast
    over the keys does not hide the key of S in S - m (P̃ = exp(S - m) is still indexed by key j), nor the
    query row of dP in dP - D; otherwise as _combine."""
    if full is None or spread is None:
        return spread if full is None else full
    return torch.where((full >= 2) & (spread == REDUCED), full, _combine(full, spread))


def _reduce(t: torch.Tensor, dims: list[int], keepdim: bool, keep: bool = True) -> torch.Tensor:
    """Tags reduced over real dims `dims` (non-negative; the tag's last dim holds its two fields). With `keep`
    (a matmul's rows or columns, a whole tensor): an id that every element over them has stays, several make
    REDUCED. Without (sum, amax, ...: a reduction op): any id makes REDUCED, even over one element."""
    if not dims:
        return t
    if t.numel() == 0:
        shape = [1 if i in dims else n for i, n in enumerate(t.shape[:-1])] if keepdim else \
            [n for i, n in enumerate(t.shape[:-1]) if i not in dims]
        return t.new_zeros(*shape, 2)
    mx = t.amax(dims, keepdim)
    if keep:
        low = torch.where(t >= 2, t, _BIG).amin(dims, keepdim)
        return torch.where(low < mx, REDUCED, mx)
    return torch.where(mx >= 2, REDUCED, mx)


_BIG = 2**30


def _combines_nothing(t: torch.Tensor, dims: list[int]) -> bool:
    """Whether a reduction over `dims` of tags t is a copy: each output element reduces elements that all
    carry its one tag (a dim of one, an expanded or repeated copy, a sum over the head dim of data indexed
    by (query, key)), and t holds no key or several keys. A sum over an unsqueezed dim must not launder q,
    k or a tile of scores; but the row max of a one-key tile or segment (a ragged last tile, a one-key
    segment of a decode) is a statistic, as of any tile, so data of one key stays reduced (scores put
    together one key at a time remain the storage and peak rules' to see: module docstring)."""
    if not dims or t.numel() == 0 or not bool((t.amax(dims) == t.amin(dims)).all()):
        return False
    key = t[..., KEY]
    ids = key[key >= 2]
    return ids.numel() == 0 or bool(ids.amin() != ids.amax())


def _reduce_all(t: torch.Tensor) -> torch.Tensor:
    """A tag tensor reduced to one tag (2,) over every element (keep)."""
    flat = t.reshape(-1, 2)
    return _reduce(flat, [0], False) if flat.shape[0] else torch.zeros(2, dtype=torch.int32)


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """torch.broadcast_shapes of two shapes (without its symbolic-shape machinery)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _broadcast(x: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether an operand of an elementwise op is spread over the output: fewer dims, a dim of one, or an
    expanded (stride 0) dim where the output has more than one element."""
    if x.dim() < len(shape):
        return any(n > 1 for n in shape[:len(shape) - x.dim()]) or _broadcast(x, shape[len(shape) - x.dim():])
    return any(n > 1 and (m == 1 or st == 0) for n, m, st in zip(shape, x.shape, x.stride()))


def _outer_over_one(operands: list[torch.Tensor], shape: tuple[int, ...]) -> bool:
    """Whether a mul of two tensors is an outer product over a dim of extent 1 in both: a matmul whose
    contraction has length one, as einsum lowers a tile with one query row or one key (engine/replay.py
    counts its FLOPs so)."""
    if len(shape) == 0:
        return False
    aligned = [(1,) * (len(shape) - t.dim()) + tuple(t.shape) for t in operands]
    return all(_broadcast(t, shape) for t in operands) and any(
        n == 1 and all(a[i] == 1 for a in aligned) for i, n in enumerate(shape))


def _contract(rows: torch.Tensor | None, cols: torch.Tensor | None) -> torch.Tensor | None:
    """A matmul's tags from its rows' and columns' tags (each reduced over the contraction, keep): an index
    that both factors carry along the contraction is summed over (P̃·V over the keys, dSᵀ·Q over the
    queries), even a contraction of length one; an index only one factor carries stays (S = Q·Kᵀ: q's row,
    k's key)."""
    if rows is None or cols is None:
        return rows if cols is None else cols
    return torch.where(torch.minimum(rows, cols) == 0, torch.maximum(rows, cols), REDUCED)


class PairTags:
    """The tag algebra of pair_keys: per element two int32 fields (QUERY, KEY), each NONE, REDUCED or an id
    r + 2 (module docstring). The tag replay (_TagReplay) runs any algebra with these members: `width` fields
    of `dtype` per element, `budget` tagged elements at most, the initial tags of an input, which elements a
    rule follows (`marked`), the combinations of two operands' tags (combine, spread, contract), reductions
    (`reduction`: a reduction op's; `reduce`: a matmul's rows or a whole tensor),
    and the tags of ops whose values depend on a whole line (sort, cumsum) or on an index tensor; `summarise`
    a storage's tags when it is written (here: the keys its (query, key) elements span: a KeySpan)."""

    width = 2
    dtype = torch.int32
    # a one-valued operand spread over a larger output tags nothing: its tag would reduce every element it
    # meets (a statistic), so that adding 0·S[0, 0] to k would hide the keys of every score made from it
    numbers_carry_nothing = True

    def __init__(self, rp: replay.Replayed, rows: dict[int, tuple[int, int]]) -> None:
        self.budget = TAG_BUDGET
        self.n_rows = max([1] + [rp.env[r].shape[d] for r, (f, d) in rows.items() if f == QUERY
                                 and isinstance(rp.env.get(r), torch.Tensor) and rp.env[r].dim()])

    def initial(self, t: torch.Tensor, spec: tuple[int, int]) -> torch.Tensor:
        """The tags of an input whose dim `dim` numbers its query rows or keys (field `fld`)."""
        fld, dim = spec
        tag = torch.zeros(*t.shape, 2, dtype=torch.int32)
        n = t.shape[dim]
        tag[..., fld] = torch.arange(2, n + 2, dtype=torch.int32).reshape([n if i == dim % t.dim() else 1
                                                                           for i in range(t.dim())])
        return tag

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(*shape, 2, dtype=torch.int32)

    def marked(self, t: torch.Tensor) -> torch.Tensor:
        """Per element: (query, key) data (both fields an id)."""
        return t.amin(-1) >= 2

    combine = staticmethod(_keeps_several)
    spread = staticmethod(_spread)
    reduce = staticmethod(_reduce)

    @staticmethod
    def reduction(t: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
        """A reduction op's tags (sum, amax, ...): reduced, unless it combines nothing (_combines_nothing)."""
        return _reduce(t, dims, keepdim, keep=_combines_nothing(t, dims))
    contract = staticmethod(_contract)
    reduce_all = staticmethod(_reduce_all)

    @staticmethod
    def line(moved: torch.Tensor, tags: torch.Tensor, dim: int) -> torch.Tensor:
        """sort / topk values (their tags moved like the values) and cumsum (the tags of its input): an
        element keeps its (query, key)."""
        return moved

    @staticmethod
    def indexed(out: torch.Tensor | None, index: list[torch.Tensor]) -> torch.Tensor | None:
        """Data moved by index tensors that are themselves tagged: the moved data's tags."""
        return out

    def summarise(self, flat: torch.Tensor) -> KeySpan | None:
        """The keys of a storage's (query, key) elements (None: none): lowest and highest, and per query row."""
        low = flat.amin(1)  # >= 2: both fields name one row
        if int(low.max()) < 2:
            return None
        pair, key = low >= 2, flat[:, KEY]
        first, last = int(torch.where(pair, key, _BIG).amin()), int(torch.where(pair, key, -1).amax())
        return KeySpan(first - 2, last - 2, flat, self.n_rows)


class KeySpan:
    """PairTags.summarise of a storage: the lowest and highest key of its (query, key) elements, and `rows()`,
    per query row. The rows are worked out on first use: pair_keys needs them only where the two bounds of
    the live storages leave room for a row wider than the widest so far (a few times a call), and the tags
    stay as summarised until the storage is written again, when _TagReplay makes a new KeySpan (which
    pair_keys takes at that same op)."""

    __slots__ = ("first", "last", "_flat", "_n", "_rows")

    def __init__(self, first: int, last: int, flat: torch.Tensor, n_rows: int) -> None:
        self.first, self.last = first, last
        self._flat, self._n = flat, n_rows
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query row, the lowest key (_BIG: none) and the highest (-1: none)."""
        if self._rows is None:
            flat, n = self._flat, self._n
            # the elements that are not (query, key) pairs go to a spare row n (no boolean indexing: 3× faster)
            row = torch.where(flat.amin(1) >= 2, flat[:, QUERY] - 2, n).long()
            key = flat[:, KEY] - 2
            lo = torch.full((n + 1,), _BIG, dtype=torch.int32).scatter_reduce_(0, row, key, "amin")[:n]
            hi = torch.full((n + 1,), -1, dtype=torch.int32).scatter_reduce_(0, row, key, "amax")[:n]
            self._rows, self._flat = (lo, hi), None
        return self._rows


def _dims(value: Any, ndim: int) -> list[int]:
    """Real dims of a reduction's dim argument (None or [] = all) made non-negative."""
    if value is None or value == []:
        return list(range(ndim))
    if isinstance(value, int):
        value = [value]
    return sorted({d % max(ndim, 1) for d in value}) if ndim else []


@functools.lru_cache(maxsize=None)
def _schema_of(func: Any) -> tuple[list[str], dict[str, Any]]:
    """An op's argument names (schema order) and defaults, read once per op overload (not per step)."""
    arguments = func._schema.arguments
    defaults = {arg.name: arg.default_value for arg in arguments if arg.has_default_value()}
    return [arg.name for arg in arguments], defaults


class _Schema:
    """Arguments of an op by name (its schema order), for the tag replay."""

    def __init__(self, func: Any, a: list, kw: dict) -> None:
        self.names, self.defaults = _schema_of(func)
        self.a, self.kw = a, kw

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.kw:
            return self.kw[name]
        if name in self.names:
            i = self.names.index(name)
            if i < len(self.a):
                return self.a[i]
            return self.defaults.get(name, default)
        return default


class PairSpan(NamedTuple):
    keys: int  # the most keys that live (query, key) data of one query row spanned at once (lo..hi); 0: none
    row: int  # that query row
    lo: int
    hi: int
    at: int  # the op where that happened
    shapes: list[tuple[int, ...]]  # shapes of the live tensors holding (query, key) data then (largest first)
    unfollowed: str = ""  # why (query, key) data could not be followed (then keys is every key)


class _TagReplay:
    """The tag replay (module docstring): a tag storage per storage of the replay, viewed with the strides of
    each tensor; per op, the tags of what it wrote; per storage, what the algebra summarises of it (pair_keys:
    the keys its (query, key) elements span, a KeySpan). `tags`: the algebra (default PairTags; `rows` is then what
    numbers the inputs' rows; otherwise input ref -> the algebra's spec of that input)."""

    def __init__(self, rp: replay.Replayed, rows: dict[int, Any], lives: Lives, tags: Any = None) -> None:
        self.rp, self.lives = rp, lives
        self.alg = alg = tags if tags is not None else PairTags(rp, rows)
        self.width = alg.width
        self.tags: dict[int, torch.Tensor] = {}  # data pointer -> flat (elements, width); absent: all NONE
        self.unit: dict[int, int] = {}  # data pointer -> the element size its tag storage counts in
        self.span: dict[int, Any] = {}  # data pointer -> alg.summarise of its tags (pairs: a KeySpan)
        self.written_at: dict[int, list[int]] = {}  # data pointer -> the ops that write it
        self.unfollowed = ""
        self.timed_out = False
        self.without_rule: list[str] = []  # ops whose tags no rule followed (their outputs: reduced)
        self.tagged = 0  # elements of the live tag storages (bounded: alg.budget)
        self._views: dict[int, torch.Tensor] = {}  # id(tensor of the replay) -> its tag view (the env keeps them)
        self._ptr: dict[int, int | None] = {}  # id(tensor of the replay) -> its storage's data pointer
        self.version: dict[int, int] = {}  # data pointer -> writes so far
        self._reduced: dict[int, dict[tuple, torch.Tensor]] = {}  # data pointer -> cached matmul reductions
        self._views_of: dict[int, list[int]] = {}  # data pointer -> ids of the tensors whose views are cached
        for index, op in enumerate(rp.prepared):
            if not op.info.view:
                for leaf in op.leaves:
                    if type(leaf) is int and leaf in lives.of_ref:
                        self.written_at.setdefault(lives.of_ref[leaf], []).append(index)
        for ref, spec in rows.items():
            t = rp.env.get(ref)
            if not isinstance(t, torch.Tensor) or t.dim() == 0 or _storage(t) is None:
                continue
            self._write(t, alg.initial(t, spec))

    # -- tag views --------------------------------------------------------------------------------------

    def _ptr_of(self, t: torch.Tensor) -> int | None:
        ptr = self._ptr.get(id(t), 0)
        if ptr == 0:
            key = _storage(t)
            ptr = self._ptr[id(t)] = key[0] if key is not None else None
        return ptr

    def view(self, t: Any) -> torch.Tensor | None:
        """The tags of a tensor of the replay (None: all NONE)."""
        if not isinstance(t, torch.Tensor):
            return None
        hit = self._views.get(id(t))
        if hit is not None:
            return hit
        ptr = self._ptr_of(t)
        if ptr is None or ptr not in self.tags:
            return None
        flat = self.tags[ptr]
        w = self.width
        if t.element_size() != self.unit[ptr]:  # the same bytes as another dtype
            if bool(self.alg.marked(flat).any()):
                self.unfollowed = "scores viewed as another dtype"
            return self.alg.reduce_all(flat).expand(*t.shape, w)
        out = self._views[id(t)] = flat.as_strided((*t.shape, w), (*(w * s for s in t.stride()), 1),
                                                    w * t.storage_offset())
        self._views_of.setdefault(ptr, []).append(id(t))
        return out

    def reduced(self, t: torch.Tensor, dims: list[int]) -> torch.Tensor | None:
        """_reduce(view(t), dims, keepdim=False) (a matmul's rows or columns), cached until t's storage is
        written again: the same slices of q, k and v meet many tiles."""
        tv = self.view(t)
        if tv is None:
            return None
        ptr = self._ptr_of(t)
        key = (self.version.get(ptr, 0), tuple(t.shape), t.stride(), t.storage_offset(), tuple(dims))
        cache = self._reduced.setdefault(ptr, {})
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = self.alg.reduce(tv, dims, False)
        return hit

    def release(self, ptr: int) -> None:
        """Forget a storage that no later op reads (its tags, views and summary)."""
        flat = self.tags.pop(ptr, None)
        if flat is not None:
            self.tagged -= flat.shape[0]
        self.span.pop(ptr, None)
        self._reduced.pop(ptr, None)
        for i in self._views_of.pop(ptr, ()):
            self._views.pop(i, None)

    def _write(self, t: torch.Tensor, tags: torch.Tensor | None) -> None:
        """Write `tags` (broadcast to t's shape; None: NONE) into t's elements."""
        ptr = self._ptr_of(t)
        if ptr is None:
            return
        flat = self.tags.get(ptr)
        if flat is None:
            if tags is None or not bool(tags.any()):
                return
            n = t.untyped_storage().nbytes() // t.element_size()
            self.tagged += n
            if self.tagged > self.alg.budget:
                self.unfollowed = f"the call holds more than {self.alg.budget:,} elements made from its inputs"
                return
            flat = self.tags[ptr] = self.alg.zeros(n)
            self.unit[ptr] = t.element_size()
        self.version[ptr] = self.version.get(ptr, 0) + 1
        if t.element_size() != self.unit[ptr]:  # written as another dtype: every element gets what was written
            alg = self.alg
            if tags is not None and bool(alg.marked(tags).any()):
                self.unfollowed = "scores written as another dtype"
            flat.copy_(alg.combine(alg.reduce_all(flat), None if tags is None else alg.reduce_all(tags)).expand_as(flat))
        else:
            dest = self._views.get(id(t))
            if dest is None:
                w = self.width
                dest = self._views[id(t)] = flat.as_strided((*t.shape, w), (*(w * s for s in t.stride()), 1),
                                                             w * t.storage_offset())
                self._views_of.setdefault(ptr, []).append(id(t))
            if tags is None:
                dest.zero_()
            else:
                dest.copy_(tags)
        self._summarise(ptr)

    def _summarise(self, ptr: int) -> None:
        summary = self.alg.summarise(self.tags[ptr])
        if summary is None:
            self.span.pop(ptr, None)
        else:
            self.span[ptr] = summary

    # -- one op -------------------------------------------------------------------------------------------

    def step(self, index: int, op: Any) -> None:
        info = op.info
        if info.view or info.scalar_out:
            return
        env = self.rp.env
        outs = [env[leaf] for leaf in op.leaves if type(leaf) is int and isinstance(env.get(leaf), torch.Tensor)]
        if not outs:
            return
        read = [env[r] for r in op.reads]
        if all(self.view(t) is None for t in read) and all(self._untagged(t) for t in outs):
            return  # nothing tagged in, nothing tagged to overwrite
        try:
            self._step(index, op, read, outs)
        except (RuntimeError, IndexError, ValueError, TypeError, KeyError):  # arguments no rule foresaw
            self.without_rule.append(info.name)
            whole = self._whole(read)
            for t in outs:
                self._write(t, whole)

    def _whole(self, values: Iterable[Any]) -> torch.Tensor | None:
        """One tag reduced over every element of every tagged tensor among `values` (an op no rule follows,
        a trusted course function: each output element depends on all of them)."""
        whole = None
        for x in values:
            tv = self.view(x)
            if tv is not None:
                whole = self.alg.combine(whole, self.alg.reduce(tv.reshape(-1, self.width), [0], False, keep=False))
        return whole

    def _step(self, index: int, op: Any, read: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        info, env = op.info, self.rp.env
        short = _plain(info.short)
        kind = KINDS.get(short) if info.trusted is None else None
        overload = getattr(info.func, "_overloadname", "")
        if short in ("max", "min") and overload == "other":
            kind = "elementwise"
        if kind == "elementwise" and op.fast is not None:
            skip = {ref for name, ref in op.fast[3] if name == "out"}
            operands = [env[r] for r in op.reads if r not in skip] if skip else read
            shape = tuple(outs[0].shape)
            if short == "mul" and len(operands) == 2 and _outer_over_one(operands, shape):
                x, y = operands
                tags = self.alg.contract(*(None if (tv := self.view(t)) is None else
                                           tv.expand(*_broadcast_shape(tuple(t.shape), shape), self.width)
                                           for t in (x, y)))
            else:
                tags = self._elementwise(operands, shape)
            for t in outs:
                self._write(t, tags)
            return
        a = replay._dec(op.args, env)
        kw = {k: replay._dec(v, env) for k, v in op.kwargs.items()} if op.kwargs else {}
        if info.trusted is not None:  # a course function of its arguments: every output reduced over all of them
            whole = self._whole(_tensors([a, kw]))
            for t in outs:
                self._write(t, whole)
            return
        computed = self._compute(kind, short, overload, info, a, kw, outs, index)
        if computed is None:  # an op without a rule: its outputs reduced over all of its inputs
            self.without_rule.append(info.name)
            computed = [self._whole(_tensors([a, kw]))] * len(outs)
        for t, tags in zip(outs, computed):
            if tags is not None and tuple(tags.shape[:-1]) != tuple(t.shape):
                try:
                    tags = tags.expand(*t.shape, self.width)
                except RuntimeError:
                    tags = self.alg.reduce(tags.reshape(-1, self.width), [0], False, keep=False)
            self._write(t, tags)

    def _untagged(self, t: torch.Tensor) -> bool:
        ptr = self._ptr_of(t)
        return ptr is None or ptr not in self.tags

    def _elementwise(self, operands: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor | None:
        full = spread = None
        numbers_apart = self.alg.numbers_carry_nothing and math.prod(shape) > 1
        for x in operands:
            if numbers_apart and replay._effective_numel(x) <= 1:
                continue  # a number spread over the output: k + 0·S[0, 0] is still k's
            tv = self.view(x)
            if tv is None:
                continue
            if tuple(x.shape) != shape:
                tv = tv.expand(*_broadcast_shape(tuple(x.shape), shape), self.width)
            if _broadcast(x, shape):
                spread = self.alg.combine(spread, tv)
            else:
                full = self.alg.combine(full, tv)
        return self.alg.spread(full, spread)

    def _operands(self, a: list, kw: dict) -> list[torch.Tensor]:
        return _tensors([a, {k: v for k, v in kw.items() if k != "out"}])

    def _compute(self, kind: str | None, short: str, overload: str, info: Any, a: list, kw: dict,
                 outs: list[torch.Tensor], index: int) -> list[torch.Tensor | None] | None:
        view = self.view
        if kind == "creation":
            fill = a[1] if short == "fill" and len(a) > 1 else None  # fill_(self, value tensor)
            return [view(fill) if isinstance(fill, torch.Tensor) else None]
        if kind == "copy":  # copy_(self, src): overwritten by src
            return [view(a[1]) if len(a) > 1 else None]
        if kind == "elementwise":
            return [self._elementwise(self._operands(a, kw), tuple(outs[0].shape))] * len(outs)
        src = a[0] if a and isinstance(a[0], torch.Tensor) else None
        if kind in ("reduction", "softmax"):
            tv = view(src)
            if tv is None:
                return [None] * len(outs)
            args = _Schema(info.func, a, kw)
            nd = src.dim()
            if short == "sum_to_size":
                size = list(args.get("size") or [])
                lead = nd - len(size)
                dims = list(range(lead)) + [lead + i for i, n in enumerate(size) if n == 1 and src.shape[lead + i] != 1]
                red = self.alg.reduction(tv, dims, True)
                return [red.reshape(*outs[0].shape, self.width)]
            if kind == "softmax" or short == "cumsum":  # the shape stays: P = softmax(S) is S's (query, key)
                return [tv]
            dims = _dims(args.get("dim"), nd)
            red = self.alg.reduction(tv, dims, bool(args.get("keepdim", False)))
            return [red.reshape(*t.shape, self.width) for t in outs]
        if kind == "matmul":
            return [self._matmul(short, a, kw)]
        if kind == "move":
            return self._move(short, info, a, kw, outs, index)
        return None

    def _matmul(self, short: str, a: list, kw: dict) -> torch.Tensor | None:
        view = self.view
        base = None
        if short in ("addmm", "addmv", "addbmm", "baddbmm"):
            base, a = a[0], a[1:]
        x, y = a[0], a[1]
        red, alg, w = self.reduced, self.alg, self.width
        if view(x) is None and view(y) is None:
            prod = None
        elif short in ("dot", "vdot"):
            prod = alg.contract(red(x, [0]), red(y, [0]))
        elif short in ("mv", "addmv"):
            col = red(y, [0])  # (w,)
            prod = alg.contract(red(x, [1]), col.expand(x.shape[0], w) if col is not None else None)  # rows (m, w)
        else:  # mm, addmm: (m, n) @ (n, p); bmm, baddbmm, addbmm: (b, m, n) @ (b, n, p)
            nd = x.dim()
            rows = red(x, [nd - 1])  # (..., m, w)
            cols = red(y, [nd - 2])  # (..., p, w)
            shape = (*x.shape[:-1], y.shape[-1])
            prod = alg.contract(rows.unsqueeze(-2).expand(*shape, w) if rows is not None else None,
                                cols.unsqueeze(-3).expand(*shape, w) if cols is not None else None)
            if short == "addbmm" and prod is not None:
                prod = alg.reduce(prod, [0], False)
        tb = view(base) if isinstance(base, torch.Tensor) else None
        if tb is not None and prod is not None:
            return alg.combine(prod, tb.expand_as(prod) if tb.dim() <= prod.dim() else tb)
        return prod if prod is not None else tb

    def _move(self, short: str, info: Any, a: list, kw: dict, outs: list[torch.Tensor],
              index: int) -> list[torch.Tensor | None] | None:
        """Data movement: the same op on the tags. Index arguments are the replay's tensors; one written
        in place after this op no longer holds what this op read, and the rules cannot follow it. Index
        tensors that are tagged themselves (made from the data) go to alg.indexed."""
        tensors = _tensors([a, kw])
        moved = self._moved(short, info, a, kw, tensors, outs, index)
        index_tags = [tv for x in tensors if not x.is_floating_point() and (tv := self.view(x)) is not None]
        if moved is None or not index_tags:
            return moved
        return [self.alg.indexed(t, index_tags) for t in moved]

    def _moved(self, short: str, info: Any, a: list, kw: dict, tensors: list[torch.Tensor], outs: list[torch.Tensor],
               index: int) -> list[torch.Tensor | None] | None:
        view, alg, w = self.view, self.alg, self.width
        args = _Schema(info.func, a, kw)
        for x in tensors:  # the tensors of a and kw (_tensors)
            if not x.is_floating_point():
                ptr = self._ptr_of(x)
                if any(i > index for i in self.written_at.get(ptr, ())) and any(
                        (tv := view(y)) is not None and bool(alg.marked(tv).any()) for y in tensors):
                    self.unfollowed = "scores moved by an index tensor that is overwritten later"
        src = a[0] if a and isinstance(a[0], torch.Tensor) else None

        def tags_of(t: torch.Tensor) -> torch.Tensor:
            tv = view(t)
            return tv if tv is not None else alg.zeros(*t.shape)

        if short in ("cat", "stack"):
            tensors = [t for t in a[0] if isinstance(t, torch.Tensor)]
            if not any(view(t) is not None for t in tensors):
                return [None]
            nd = outs[0].dim()
            dim = args.get("dim", 0) % max(nd, 1)
            if short == "cat":
                tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
                return [torch.cat([tags_of(t) for t in tensors], dim)]
            return [torch.stack([tags_of(t) for t in tensors], dim)]
        if src is None:
            return None
        tv = view(src)
        if short in ("index_put", "index_copy", "index_add", "scatter"):
            values = args.get("values") if short == "index_put" else args.get("source") if short != "scatter" \
                else args.get("src")
            tval = view(values) if isinstance(values, torch.Tensor) else None
            if tv is None and tval is None:
                return [None]
            base = tags_of(src).clone()
            if short == "index_put":
                indices = args.get("indices")
                new = base.index_put(tuple(indices), tval if tval is not None else alg.zeros())
                if args.get("accumulate", False):
                    new = alg.combine(base, new)
                return [new]
            dim = args.get("dim") % max(src.dim(), 1)
            idx = args.get("index")
            if short == "scatter":
                if tval is None:
                    tval = alg.zeros(*idx.shape)
                else:
                    tval = tval[tuple(slice(0, n) for n in idx.shape)]
                new = base.scatter(dim, idx.unsqueeze(-1).expand(*idx.shape, w), tval)
                return [alg.combine(base, new) if args.get("reduce") is not None else new]
            if tval is None:
                tval = alg.zeros(*values.shape)
            if short == "index_copy":
                return [base.index_copy(dim, idx, tval)]
            moved = torch.zeros_like(base).index_copy(dim, idx, tval)
            return [alg.combine(base, moved)]
        if tv is None and short != "embedding":
            return [None] * len(outs)
        if short == "embedding":  # embedding(weight, indices)
            tw = view(a[0])
            return [None] if tw is None else [tw[a[1]]]
        if short == "index":
            return [tv[tuple(args.get("indices"))]]
        if short == "index_select":
            return [tv.index_select(args.get("dim") % max(src.dim(), 1), args.get("index"))]
        if short == "gather":
            idx = args.get("index")
            return [tv.gather(args.get("dim") % max(src.dim(), 1), idx.unsqueeze(-1).expand(*idx.shape, w))]
        if short in ("sort", "topk"):
            indices = outs[1]
            dim = args.get("dim", -1) % max(src.dim(), 1)
            g = alg.line(tv.gather(dim, indices.unsqueeze(-1).expand(*indices.shape, w)), tv, dim)
            return [g, g]
        if short == "repeat":
            return [tv.repeat(*args.get("repeats"), 1)]
        if short == "expand_copy":
            return [tv.expand(*args.get("size"), w).clone()]
        if short == "slice_copy":
            dim = args.get("dim", 0) % max(src.dim(), 1)
            start, end, step = args.get("start"), args.get("end"), args.get("step", 1) or 1
            return [tv[(slice(None),) * dim + (slice(start, end, step),)]]
        if short == "select_copy":
            dim = args.get("dim") % max(src.dim(), 1)
            return [tv.select(dim, args.get("index"))]
        if short in ("_unsafe_view", "flatten", "reshape"):
            return [tv.reshape(*outs[0].shape, w)]
        if short == "unfold":
            dim = args.get("dimension") % max(src.dim(), 1)
            u = tv.unfold(dim, args.get("size"), args.get("step"))  # (..., n, w, size)
            return [u.movedim(-2, -1)]
        return None


def follow(tr: _TagReplay, seconds: float, live: list[bool] | None = None,
           before: Any = None) -> Iterator[tuple[int, Any]]:
    """Step the tag replay `tr` through its program: yields (index, op) after each op's step (views and .item()
    are not stepped; with `live`, only the ops whose results reach the call's result are; `before(index, op)`
    runs just before a step), and after the caller is done with it releases the storages that no later op
    reads. Stops early, with tr.unfollowed set, past `seconds` of the judge's time or when the tags cannot
    follow the program."""
    rp, lives = tr.rp, tr.lives
    deadline = time.perf_counter() + seconds
    dies: dict[int, list[int]] = {}  # op -> the storages no op after it reads
    for ptr, s in lives.storages.items():
        if 0 <= s.last < lives.n_ops:
            dies.setdefault(s.last, []).append(ptr)
    with torch.no_grad():
        for index, op in enumerate(rp.prepared):
            if not index & 255 and time.perf_counter() > deadline:
                tr.unfollowed = tr.unfollowed or f"following the call took the judge over {seconds:g} s"
                tr.timed_out = True
                return
            stepped = not (op.info.view or op.info.scalar_out) and (live is None or live[index])
            if stepped:
                if before is not None:
                    before(index, op)
                tr.step(index, op)
            yield index, op
            for ptr in dies.pop(index, ()):
                tr.release(ptr)
            if tr.unfollowed:
                return


def pair_keys(rp: replay.Replayed, rows: dict[int, tuple[int, int]], lives: Lives | None = None) -> PairSpan:
    """The most keys that the live (query, key) data of one query row spans at one time (module docstring).

    rows: input ref -> (QUERY or KEY, the dim that numbers its rows), e.g. {0: (QUERY, -2), 1: (KEY, -2),
    2: (KEY, -2)} for flash_forward(q, k, v): q's rows are queries, k's and v's rows are keys."""
    lives = lives or lives_of(rp)
    tr = _TagReplay(rp, rows, lives)
    ends: dict[int, list[int]] = {}
    live: dict[int, KeySpan] = {}
    best = PairSpan(0, -1, -1, -1, -1, [])
    storages = lives.storages
    at = -1
    for index, op in follow(tr, TAG_SECONDS):
        at = index
        changed = False
        if not (op.info.view or op.info.scalar_out):
            for leaf in op.leaves:
                ptr = lives.of_ref.get(leaf) if type(leaf) is int else None
                if ptr is None:
                    continue
                span = tr.span.get(ptr)
                if span is not None and storages[ptr].last >= index:
                    if live.get(ptr) is not span:
                        live[ptr] = span
                        ends.setdefault(storages[ptr].last, []).append(ptr)
                        changed = True
                elif live.pop(ptr, None) is not None:
                    changed = True
        if changed and live:
            spans = live.values()
            # no row spans more keys than all the live storages together: where those are no more than the best
            # so far, no row can beat it (only more keys update best), and most ops end here, on two numbers each
            if max(s.last for s in spans) - min(s.first for s in spans) + 1 > best.keys:
                los, his = zip(*(s.rows() for s in spans))
                lo = torch.stack(los).amin(0) if len(los) > 1 else los[0]
                hi = torch.stack(his).amax(0) if len(his) > 1 else his[0]
                width = torch.where(hi >= 0, hi.long() - lo.long() + 1, 0)
                keys = int(width.max())
                if keys > best.keys:
                    row = int(width.argmax())
                    shapes = sorted((lives.shape(storages[p]) for p in live), key=lambda s: -math.prod(s))
                    best = PairSpan(keys, row, int(lo[row]), int(hi[row]), index, shapes[:4])
        for ptr in ends.pop(index, ()):
            if storages[ptr].last <= index:
                live.pop(ptr, None)
    if tr.timed_out:
        return PairSpan(_BIG, -1, -1, -1, at + 1, [], tr.unfollowed)
    if tr.unfollowed:
        shapes = sorted((lives.shape(storages[p]) for p in live), key=lambda s: -math.prod(s))
        return PairSpan(_BIG, -1, -1, -1, at, shapes[:4], tr.unfollowed)
    return best
