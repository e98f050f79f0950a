"""Part 3 (flash_kernel): cases and checks shared by the public and the hidden tests.

The student's run_flash_kernel runs in the worker (autograder/scenarios/part3.py), which only RECORDS
what its kernels did (course.gpusim.trace: buffers, launches, memory instructions, and the numpy
arithmetic on loaded values) and sends that program back as plain data. Nothing the worker measured
or returned is used. The judge replays the program on its own simulated GPU, with Q, K and V holding
ITS OWN inputs (same shapes, a seed derived from the program's digest), and takes every counter and
the o and lse it grades from that replay (O and L read back after it). A value the recording does
not trace (host-side compute, constants, float()/.item()) is frozen into the program and is wrong
on the judge's inputs; the counter tests grade only a program whose replayed o is right (lse has its own tests).
Everything expected is computed here:
(a) o and lse against course.reference.attention_reference (float64), tolerance rule
    err <= 2·err_plain + atol(n_k) with the plain float32 implementation (attention_plain) and a
    rounding bound for the online softmax's sequential updates (see `tolerances`);
(b) conventions: lse incl. m in natural log, bottom-right causal, fully masked rows (Nq > Nk);
(c) counters, exactly (docs/gpusim_guide.md): global memory holds only Q, K, V, O, L (S and P
    never leave the chip); DRAM bytes equal the closed form; causal K/V bytes at most those of the
    block pairs that hold an allowed (query, key) pair, at least those of the visible keys; no
    shared-memory race;
(d) on-chip state bounded by the tiles (§5.2), measured in the replay: the threads of a block (one
    per query row, B_r rounded up to a warp), the shared memory a block declares, and the most words
    of per-thread values (registers) live at once in one thread and in one block.
Every replay also keeps each thread's registers to that thread (course/gpusim/lanes.py): register
arithmetic that reads across the thread axis (numpy's reductions, gathers, reshapes over it: free
shuffles a GPU does not have) is refused, so threads exchange values only through shared memory,
under the race detector; a dense kernel with one thread per key and numpy as its shuffles is refused.

On-chip state (d). The counters of (c) do not see what a block KEEPS: a kernel that loads all the
keys a block needs into shared memory in one sweep, or into registers with broadcast loads, and then
does a dense two-pass softmax over its whole score row reads the same bytes and writes the same O
and L as FlashAttention. What makes FlashAttention is that its on-chip state per block is bounded by
its tiles, independent of Nk: it streams K/V in tiles of B_c keys and keeps only the running
(m, ℓ, acc) of each row between tiles (§5.1–§5.2). The replay measures (course.gpusim.trace):
- `shared_bytes_per_block`: every shared array a block declares (declarations are never freed);
- `live_words_per_thread`: the most words of per-thread values live at one time (from the
  instruction that makes a value to the last one that reads it; views count once with their base).
  A value whose last axis is not the thread (a (B_c, d) tile read from shared memory with a uniform
  index, the reference's own layout) is the same in every thread, so each thread holds all of it.
- `live_words_per_block`: the same count for the whole block: a value alike in every thread (free in
  the register rule of course/gpusim/lanes.py: a tile read with a uniform index) once, a per-thread
  value once per thread (T × its words); an elementwise product that only a reduction in the next
  operation reads ((k_j[:, :, None] * q).sum(1), a multiply-add whose terms a GPU never holds) counts
  as nothing, its sum counts. The per-thread bound must allow whole tiles held as broadcast values
  in every thread; without a block count, B_r threads could each keep Nk·d/B_r words of K and of V
  (exchanged through shared memory, every thread reading only its own words) and the block would
  hold all of K/V, a few words in each thread, within every other bound.
- the threads of a block: B_r (the launcher's block = (B_r,)), at most 32·⌈B_r/32⌉; with more (one
  per key), the block's registers could hold every key's K/V, a few words in each thread.
The bounds (`on_chip_bounds`) are FlashAttention's tiles with room for every legal layout, in words:
    shared     2·B_r·(d+4) + 4·B_c·(d+4) + 2·B_r·B_c + 8·B_r + 256
               a Q tile and a separate O tile, rows padded by up to 4 words (d + 1 for conflict-free
               columns, d + 4 to keep float4 alignment); K and V tiles double-buffered, padded the
               same way; an S tile and a P̃ tile in shared memory; per-row statistics (m, ℓ, α, ...)
               and scratch. The reference declares B_r·(d+1) + 2·B_c·d.
    per thread 4·B_c·(d+4) + 8·(d+B_c) + 64
               tile-sized values: a K tile and a V tile read from shared memory as broadcast values
               (B_c·d each, padded rows included), and two tile-sized temporaries of the products
               (k_j·q or P̃·v_j written as a broadcast multiply before its sum); row-sized values: q,
               acc, the rescaled acc and o (d each), the B_c scores, P̃ and the masks and temporaries
               of the update (B_c each), 8 of each kind; 64 scalars (m, ℓ, α, m_new, ...). The
               reference holds B_c·d + 2·B_c + 3·d + ... (one tile at a time).
    per block  2·B_c·(d+4) + T·(3·d + 3·B_c + 16)          (T: the block's threads, ≤ 32·⌈B_r/32⌉)
               the K and V tiles once (broadcast values alike in every thread, padded rows
               included); in each thread its row's state: q, acc and the rescaled acc or o (d each),
               the scores, P̃ and one temporary of the update (B_c each), 16 scalars (m, ℓ, α, m_new,
               masks, ...). Tile-sized per-thread products count as their sums (above). The reference
               holds at most B_c·d + T·(2·d + 2·B_c + 8); every legal kernel (solutions, the kernel_*
               equivalents) stays within 0.72 of the bound on the cases of this check, and a block
               that keeps all of K/V spread over its B_r threads (2·Nk·d words,
               instructor/redteam/part3_dense_spread_registers) exceeds it 2.6× to 7× (Nk = 16 tiles
               and more). Padding its block to a full warp of threads (T = 32·⌈B_r/32⌉, which the
               bound allows for) leaves it above by 1.28× at the least (its K/V alone).
No bound depends on Nk, so a kernel that holds all the keys' K/V (2·d words a key) or all the
scores of a row exceeds them once Nk is a few tiles long: the cases of this check have Nk ≥ 16·B_c.
With Nk of one or two tiles, dense attention IS a one-tile FlashAttention, and passes.

The closed form (one head; every case keeps d and B_r multiples of 8 so that tiles start on
32-byte sectors, and with several heads Nq a multiple of 8):
    no cache : 4·(2·Nq·d + 2·d·Σ_i keys_i) + L_bytes,  keys_i = Nk (non-causal): 2Nd + 2Nd·⌈N/B_r⌉ + N
    ideal    : 4·(2·Nq·d + 2·d·max_i keys_i) + L_bytes                          : 4Nd + N
    L_bytes  : 4·Nq when Nq is a multiple of 8, else 32·⌈Nq/8⌉ (DRAM moves whole 32-byte sectors)
where keys_i counts the keys of the K/V blocks that Q block i reads. The judge derives keys_i from
the causal mask itself (the blocks that hold at least one allowed pair), independently of the
T(T+1)/2 formula it reproduces when Nq = Nk = T·B.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from autograder.engine.checks import CheckFailure, check, check_close, one_thread
from course import gpusim
from course.reference import causal_mask

from .remember import attention_plain, attention_reference  # course.reference's, remembered across grades

from . import diagnose as dg
from . import probes as pb

EXPECTED_BUFFERS = ("Q", "K", "V", "O", "L")

HINT_ON_CHIP = ("global memory may hold only Q, K, V, O and L: S and P must stay on chip, in registers or "
                "shared memory, and never be written to a global buffer (§5.3)")
HINT_RACE = ("a shared-memory race: a syncthreads() is missing between a cooperative write to shared memory "
             "and its use by other warps — after loading K_j/V_j (or Q_i) before reading them, and again "
             "before the next K/V block overwrites them (§5.2)")
HINT_SKIP = ("your kernel reads K/V blocks that lie entirely above the diagonal: skip them whole — end the "
             "K/V loop after the last block that a row of the Q block may see, never load the rest (§6.2)")
HINT_OVERSKIP = ("your kernel skips keys that some row of the Q block may still see: the diagonal "
                 "block must be loaded and masked element-wise (§6.2)")
HINT_KV = ("each Q block must read every K/V block exactly once, the ragged last one included: K/V "
           "traffic is 2·Nk·d·⌈Nq/B_r⌉ elements (§5.4)")
HINT_ONCE = ("Q must be read once, and O and L written once, by the block that owns the rows (§5.3); "
             "rows past Nq must not be touched")
HINT_UNTRACED = ("o and lse are right for the inputs your code was called with, but not when the grader replays "
                 "your kernels' recorded program on its own inputs: O and L must be written by the kernel from "
                 "values it loaded and computed with numpy (no host-side compute; no float(), .item(), np.asarray() or "
                 "index assignment into a plain numpy array of loaded values; no register kept from another thread "
                 "block; see docs/gpusim_guide.md, 'What the grader measures itself')")
HINT_NO_STORE = ("your kernels never store to O (or L): o and lse are read from the O and L buffers after the "
                 "grader's own replay of your kernels, not from what run_flash_kernel returns or writes on the host")
HINT_PROGRAM = ("run_flash_kernel must launch the kernel on a simulated GPU whose buffers Q, K, V hold q, k, v "
                "(heads one after another) and O, L receive the results, as the given launcher does")
HINT_VALUES = ("o = softmax(scale·q kᵀ) v row by row with the online softmax (§5.1): rescale acc and ℓ by "
               "exp(m - m_new) when the max grows, divide by ℓ once at the end, lse = m + log ℓ")


HINT_ON_CHIP_STATE = ("FlashAttention's on-chip state is bounded by its tiles, independent of Nk: stream K/V "
                      "through shared memory in tiles of B_c keys and keep only the running (m, ℓ, acc) of each "
                      "row between tiles (online softmax, §5.1–§5.2); never all the keys' K, V or scores at once "
                      "(not in shared memory, not in registers)")


def _coalesce_hint(name: str) -> str:
    return (f"uncoalesced access to {name}: its loads/stores touch 32-byte sectors they only partly use. Let "
            f"consecutive threads access consecutive addresses (stage through shared memory, §5.2) and move "
            f"K/V as float4 from 16-byte aligned addresses")


@dataclass(frozen=True)
class KernelCase:
    """One input of run_flash_kernel: q (*lead, nq, d), k/v (*lead, nk, d), float32, fixed seed."""

    lead: tuple[int, ...] = ()
    nq: int = 64
    nk: int = 64
    d: int = 32
    causal: bool = False
    block_rows: int = 64
    block_cols: int = 64
    seed: int = 0
    q_mult: float = 1.0  # > 1 makes attention peaked
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # The exact byte counts below assume tiles that start on 32-byte sectors (see the docstring).
        assert self.d % 8 == 0 and self.block_rows % 8 == 0, "test bug: d and block_rows must be multiples of 8"
        assert not self.lead or self.nq % 8 == 0, "test bug: with several heads Nq must be a multiple of 8"

    @property
    def id(self) -> str:
        lead = "x".join(map(str, self.lead)) + "-" if self.lead else ""
        kind = "causal" if self.causal else "full"
        peaked = f"-peaked{self.q_mult:g}" if self.q_mult != 1 else ""
        return f"{lead}{self.nq}x{self.nk}x{self.d}-{kind}-b{self.block_rows}-{self.block_cols}{peaked}-s{self.seed}"

    @property
    def heads(self) -> int:
        return math.prod(self.lead)

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        q, k, v = (torch.randn(*self.lead, n, self.d, generator=g, dtype=torch.float64).float()
                   for n in (self.nq, self.nk, self.nk))
        return q * self.q_mult, k, v

    def kwargs(self) -> dict[str, Any]:
        return dict(causal=self.causal, block_rows=self.block_rows, block_cols=self.block_cols)

    def shown(self, q, k, v) -> dict[str, Any]:
        return {"q": q, "k": k, "v": v, **self.kwargs()}


# ---------------------------------------------------------------------------------------------------
# Expected counters


def keys_per_q_block(case: KernelCase) -> list[int]:
    """Keys read by each Q block: all Nk, or (causal) those of the K/V blocks holding an allowed pair."""
    if not case.causal:
        return [case.nk] * math.ceil(case.nq / case.block_rows)
    allowed = causal_mask(case.nq, case.nk)
    out = []
    for r0 in range(0, case.nq, case.block_rows):
        rows = allowed[r0:r0 + case.block_rows]
        out.append(sum(min(case.block_cols, case.nk - c0) for c0 in range(0, case.nk, case.block_cols)
                       if bool(rows[:, c0:c0 + case.block_cols].any())))
    return out


def visible_keys_per_q_block(case: KernelCase) -> list[int]:
    """Causal: the keys the last row of each Q block may see (every row sees a prefix of the keys, the
    last row the longest): the fewest a block can read, with its last K/V tile cut at that key."""
    return [max(0, min(case.nk, min(r0 + case.block_rows, case.nq) + case.nk - case.nq))
            for r0 in range(0, case.nq, case.block_rows)]


def expected_bytes(case: KernelCase) -> dict[str, dict[str, int]]:
    """Per buffer: DRAM bytes with no cache and with an ideal cache (module docstring)."""
    H, nq, d = case.heads, case.nq, case.d
    keys = keys_per_q_block(case)
    l_bytes = 4 * H * nq if nq % 8 == 0 else 32 * math.ceil(nq / 8)
    qo = 4 * H * nq * d
    kv_nc, kv_ideal = 4 * H * d * sum(keys), 4 * H * d * max(keys)
    return {
        "Q": {"no_cache": qo, "ideal_cache": qo},
        "K": {"no_cache": kv_nc, "ideal_cache": kv_ideal},
        "V": {"no_cache": kv_nc, "ideal_cache": kv_ideal},
        "O": {"no_cache": qo, "ideal_cache": qo},
        "L": {"no_cache": l_bytes, "ideal_cache": l_bytes},
    }


def diagnose(stats: dict, case: KernelCase, hidden: bool = False) -> str:
    """The most specific hint that the counters (of the judge's replay) support (first match wins).
    Names from the recording (buffers, lines: identifiers the replay validated) only in public tests."""
    extra = [b for b in stats.get("buffers", {}) if b not in EXPECTED_BUFFERS]
    if extra:
        return HINT_ON_CHIP
    if stats.get("races"):
        r = stats["race_reports"][0]
        return HINT_RACE if hidden else f"{HINT_RACE} [reported: {r['kind']} on {r['buffer']} at {r['line']}]"
    exp = expected_bytes(case)
    bufs = stats.get("buffers", {})
    for name in EXPECTED_BUFFERS:
        b = bufs.get(name)
        if b is None:
            continue
        want = exp[name]["no_cache"]
        useful = b["global_load_bytes"] + b["global_store_bytes"]
        if b["dram_bytes_no_cache"] == want:
            continue
        if useful <= want < b["dram_bytes_no_cache"]:
            return _coalesce_hint(name)
        if name in ("K", "V"):
            if case.causal:
                return HINT_SKIP if b["dram_bytes_no_cache"] > want else HINT_OVERSKIP
            return HINT_KV
        return HINT_ONCE
    return HINT_VALUES


# ---------------------------------------------------------------------------------------------------
# Tolerances


def tolerances(case: KernelCase, v: torch.Tensor) -> tuple[float, float]:
    """atol for o and for lse, added to 2 x the plain float32 error (FlashAttention's rule).

    The 2x-plain rule alone assumes the plain code's summation order. An online softmax may fold
    the n_k keys in with up to n_k SEQUENTIAL updates (one key at a time is legal, §4.3), and its
    rounding grows with that number (part 1's analysis, cases_part1.softmax_rtol): each update
    ℓ <- ℓ·α + Σp costs a rounded exp for α and for each p and a rounded multiply and add, about
    2u per term and per rebase, so |Δℓ|/ℓ <= 4(n_k+2)·u; we allow 4(n_k+2)·eps = 8(n_k+2)·u.
    - lse = m + log ℓ: m is a max (exact), so |Δlse| <= |Δℓ|/ℓ + the roundings of log and +, which
      the plain code has too: atol_lse = 4(n_k+2)·eps + 1e-6.
    - o = acc/ℓ with acc = Σ_j p_j v_j under the same updates: |Δacc_c| <= 4(n_k+2)·u·Σ_j p_j|v_jc|
      and |Δℓ|/ℓ as above, so |Δo_c| <= 8(n_k+2)·u·max|v| = 4(n_k+2)·eps·max|v|: atol_o is that + 1e-6.
    Measured: a per-key update kernel at N = 4096 has lse error 3.8e-6 (2x plain alone allowed
    2.6e-6); the bound there is 2.0e-3. Injected bugs err by 1e-2 and more at the tested sizes
    (n_k <= 256: atol_lse <= 1.2e-4)."""
    eps = torch.finfo(torch.float32).eps
    seq = 4 * (case.nk + 2) * eps
    vmax = float(v.abs().max()) if v.numel() else 0.0
    return 1e-6 + seq * vmax, 1e-6 + seq


# ---------------------------------------------------------------------------------------------------
# Running: record in the worker, replay in the judge


@dataclass
class Judged:
    """What the judge measured by replaying the program on inputs (q, k, v): o, lse and the stats,
    or the reason it refused the program (``error``; then o, lse and stats are None)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    stats: dict | None = None
    error: str | None = None
    values: CheckFailure | None | bool = False  # False: not checked yet; None: right; else the failure
    o_values: CheckFailure | None | bool = False  # the same, of o alone (what the counter tests need)


# (program digest, case id) -> (program, judged): the DRAM tests with and without cache record the
# same program for the same case, so the judge replays it once.
_CACHE: dict[tuple[str, str], tuple[dict, Judged]] = {}
_CACHE_SIZE = 16


def judge_inputs(case: KernelCase, program_digest: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The judge's own q, k, v: the case's shapes and scale, a seed the worker cannot know before it
    has fixed its program (it is derived from the program's digest)."""
    seed = int(program_digest[:15], 16)
    return KernelCase(**{**case.__dict__, "seed": seed}).qkv()


def replay_on(case: KernelCase, program: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Judged:
    """Replay `program` with Q, K, V holding (q, k, v); read o and lse from O and L afterwards.
    Whatever the worker sent, the result is a Judged: with the values, or with the refusal."""
    try:
        return _replay_on(case, program, q, k, v)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, RuntimeError):
        return Judged(q, k, v, error="the recording is malformed")


def _replay_on(case: KernelCase, program: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Judged:
    j = Judged(q, k, v)
    if type(program) is dict and "body" in program:
        try:
            program = gpusim.trace.unpack(program)
        except gpusim.GpuSimError as e:
            j.error = str(e)
            return j
    gpus = program.get("gpus") if type(program) is dict else None
    if type(gpus) is not list:
        j.error = "the recording holds no simulated GPU"
        return j
    graded = [i for i, g in enumerate(gpus) if type(g) is dict and type(g.get("buffers")) is list
              and set(EXPECTED_BUFFERS) <= {b.get("name") for b in g["buffers"] if type(b) is dict and type(b.get("name")) is str}]
    if not graded:
        j.error = "no simulated GPU with the global buffers Q, K, V, O and L was made"
        return j
    g = graded[-1]
    H, nq, nk, d = case.heads, case.nq, case.nk, case.d
    bufs = {b["name"]: b for b in gpus[g]["buffers"] if type(b) is dict and type(b.get("name")) is str
            and b["name"] in EXPECTED_BUFFERS}
    want = {"Q": H * nq * d, "K": H * nk * d, "V": H * nk * d, "O": H * nq * d, "L": H * nq}
    for name, n in want.items():
        shape = bufs[name].get("shape")
        if type(shape) is not list or any(type(s) is not int for s in shape) or math.prod(shape) != n:
            j.error = f"buffer {name} does not have {n} elements"
            return j
    # The worker's Q, K, V must have held the inputs it was given (in the launcher's layout): the
    # judge then puts its own inputs in their place.
    seen = case.qkv()
    arrays = program.get("arrays") if type(program.get("arrays")) is list else []
    for name, x in zip("QKV", seen):
        k_ = bufs[name].get("data")
        a = arrays[k_] if type(k_) is int and 0 <= k_ < len(arrays) else None
        if not (isinstance(a, torch.Tensor) and a.dtype == torch.float32 and a.numel() == x.numel()
                and torch.equal(a.reshape(-1), x.reshape(-1))):
            j.error = f"buffer {name} did not hold {name.lower()} (heads one after another) when the kernel ran"
            return j
    replace = {(g, n): x.reshape(-1).numpy() for n, x in zip("QKV", (q, k, v))}
    try:
        r = gpusim.replay(program, replace)
    except gpusim.GpuSimError as e:
        j.error = str(e)
        return j
    out = r.buffers[g]
    j.o = torch.from_numpy(out["O"].astype(np.float32)).reshape(*case.lead, nq, d)
    j.lse = torch.from_numpy(out["L"].astype(np.float32)).reshape(*case.lead, nq)
    stats = r.stats
    stats.pop("lines", None)
    j.stats = stats
    return j


def run(student, case: KernelCase) -> tuple[dict, Judged]:
    """Record run_flash_kernel in the worker, replay it in the judge on the judge's own inputs."""
    q, k, v = case.qkv()
    out = student.scenario("part3.flash_kernel", q=q, k=k, v=v, **case.kwargs())
    shown = None if student.hidden else case.shown(q, k, v)
    check(type(out) is dict and out.get("returns_triple") is True, what="run_flash_kernel returns (o, lse, stats)",
          detail="it returned something else", hint="return the launcher's (o, lse, gpu.report()) unchanged",
          inputs=shown)
    program = out.get("program")
    try:
        key = (gpusim.digest(program), case.id)
        program = gpusim.trace.unpack(program)  # parsed once; every replay of this test uses it
    except (gpusim.GpuSimError, TypeError, ValueError, RuntimeError):  # e.g. a tensor numpy cannot read
        key = None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    if key is None:
        j = Judged(q, k, v, error="the recording is not a program")
    else:
        j = replay_on(case, program, *judge_inputs(case, key[0]))
    check(j.error is None, what="the grader replays your kernels' recorded program on its own simulated GPU",
          detail=f"refused: {j.error}", hint=HINT_PROGRAM, inputs=shown)
    res = (program, j)
    if key is not None:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))  # the oldest entry
        _CACHE[key] = res
    return res


def _values_failure(j: Judged, case: KernelCase, inputs, only_o: bool = False) -> CheckFailure | None:
    """o and lse (only_o: o alone) of a replay against float64 attention on that replay's inputs (None: right)."""
    if (j.o_values if only_o else j.values) is not False:
        return j.o_values if only_o else j.values
    with one_thread():
        ref_o, ref_lse = attention_reference(j.q, j.k, j.v, case.causal)
        plain_o, plain_lse = attention_plain(j.q, j.k, j.v, case.causal)
    atol_o, atol_lse = tolerances(case, j.v)
    hint = HINT_VALUES
    if case.causal and case.nq > case.nk:
        hint += "; a row that sees no key (causal, Nq > Nk) gets o = 0 and lse = -inf, never NaN"
    try:
        check_close(j.o, ref_o, what="o of run_flash_kernel against float64 attention", inputs=inputs,
                    plain=plain_o, factor=2.0, atol=atol_o, hint=hint)
        j.o_values = None
        if only_o:
            return None
        check_close(j.lse, ref_lse, what="lse of run_flash_kernel: log Σ_j exp(S_ij), natural log, including m",
                    inputs=inputs, plain=plain_lse, factor=2.0, atol=atol_lse, hint=hint)
        j.values = None
    except CheckFailure as failure:
        if j.o_values is False:  # o itself failed
            j.o_values = failure
        if only_o:
            return j.o_values
        j.values = failure
    return j.values


def _explained(failure: CheckFailure, stats: dict, case: KernelCase, student) -> CheckFailure:
    """Wrong values: the probes of part 2's ladder, run through the kernel, say where the values first
    go wrong; beneath them, counters that show a known bug (e.g. the diagonal block skipped: fewer K/V
    bytes than the allowed block pairs need) name that bug."""
    if failure.kind in ("type", "dtype", "shape"):
        return failure
    if pb.in_hidden_test(student):
        return failure
    found = diagnose(stats, case, student.hidden)
    try:
        probe = kernel_probe_hint(student)
    except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
        probe = f"(diagnosis unavailable: {type(exc).__name__})"
    hint = dg._compose(probe, found if found != HINT_VALUES else None)
    if hint:
        failure.hint = hint
        failure.args = (failure.message(),)
    return failure


def _values_right(student, case: KernelCase, program: dict, j: Judged, only_o: bool = False) -> None:
    """Fail unless the replay on the judge's inputs gives the right o and lse (only_o: o). Then, to say
    why, replay on the inputs the worker saw: right there means the outputs did not come from the
    recorded arithmetic (host compute, smuggled constants); wrong there is an ordinary bug, shown
    with those inputs (the student can reproduce them)."""
    if _values_failure(j, case, None, only_o) is None:
        return
    seen = replay_on(case, program, *case.qkv())
    shown = None if student.hidden else case.shown(seen.q, seen.k, seen.v)
    check(seen.error is None, what="the grader replays your kernels' recorded program on its own simulated GPU",
          detail=f"refused: {seen.error}", hint=HINT_PROGRAM, inputs=shown)
    failure = _values_failure(Judged(seen.q, seen.k, seen.v, seen.o, seen.lse, seen.stats), case, shown, only_o)
    bufs = seen.stats.get("buffers", {})
    no_store = any(bufs.get(n, {}).get("global_store_requests", 0) + bufs.get(n, {}).get("atomic_requests", 0) == 0
                   for n in ("O", "L"))
    if failure is None:
        raise CheckFailure("o and lse come from the kernel: the grader's replay of the recorded program on its own "
                           "inputs gives the right values", detail="right on the inputs of the call, wrong on the "
                           "grader's own inputs", hint=HINT_NO_STORE if no_store else HINT_UNTRACED, inputs=shown)
    if no_store:
        failure.hint = HINT_NO_STORE
        failure.args = (failure.message(),)
        raise failure
    raise _explained(failure, seen.stats, case, student)


def _counted(student, case: KernelCase) -> tuple[dict, KernelCase]:
    """The replay's stats, for the counter tests: they grade only a kernel that computes attention, o
    (lse has tests of its own: a kernel whose lse alone is wrong loses those, not its counters)."""
    program, j = run(student, case)
    try:
        _values_right(student, case, program, j, only_o=True)
    except CheckFailure as failure:
        failure.what = f"the counters are graded on a kernel whose o is right; {failure.what}"
        failure.args = (failure.message(),)
        raise
    return j.stats, case


# ---------------------------------------------------------------------------------------------------
# Checks


def check_outputs(student, case: KernelCase) -> None:
    """o and lse (from the judge's replay) against float64 attention (2 × plain float32 error + atol)."""
    program, j = run(student, case)
    _values_right(student, case, program, j)


def kernel_probe_hint(student) -> str:
    """The forward ladder through the student's kernel (run(), the part-3 check path), with the recognisers of
    known forward bugs on the failed probe's inputs beneath it."""
    unwritten: dict[tuple, list] = {}

    def run_case(*, nq, nk, d, causal, block_rows, block_cols, lead, q_mult):
        case = KernelCase(lead=tuple(lead), nq=nq, nk=nk, d=d, causal=causal, block_rows=block_rows,
                          block_cols=block_cols, seed=21, q_mult=q_mult)
        _, j = run(student, case)  # the judge's replay on its own inputs j.q, j.k, j.v
        unwritten[(nq, nk, block_rows, block_cols, causal, tuple(lead))] = (j.stats or {}).get("unwritten_reads") or []
        return {"o": j.o, "lse": j.lse, "qkv": (j.q, j.k, j.v)}
    finding = pb.kernel_ladder(run_case, hidden=getattr(student, "hidden", True) is not False)
    rec = dg.forward_probe_hint(finding, tiles=True)
    if rec is None and finding.failed is not None:
        rec = unwritten_hint(finding.inputs[3], unwritten)
    if rec is not None and not dg._fitted(rec):  # a known bug, proved on the probe's inputs: not the rung's guess
        return finding.message(proven=rec)
    return dg._compose(finding.message(), rec)


def unwritten_hint(spec: dict, unwritten: dict[tuple, list]) -> str | None:
    """Where the failed probe's tiles are all full (no ragged block, whose rows a correct kernel may read
    unstored and discard) and its replay read shared words no thread had stored (the simulator's
    unwritten_reads: NaN here, garbage on a GPU): which, and the rule."""
    key = (spec["nq"], spec["nk"], spec["bq"], spec["bk"], spec.get("causal", False), tuple(spec.get("lead", (2,))))
    reports = unwritten.get(key) or []
    if not reports or spec["nq"] % spec["bq"] or spec["nk"] % spec["bk"]:
        return None
    r = reports[0]
    return (f"with every tile full, the kernel reads shared words no thread stored ({r['example']} at "
            f"{r['line']}, {r['words']} words in all): a tile's loads must use the layout its stores used, and "
            "its stores must fill every word the loads read (each thread its float4s, the ragged guard on rows, "
            "not on the tile's columns)")


def check_only_qkvol(student, case: KernelCase) -> None:
    """Global memory holds Q, K, V, O, L and nothing else: S and P never appear there."""
    stats, _ = _counted(student, case)
    shown = None if student.hidden else case.shown(*case.qkv())
    bufs = stats["buffers"]
    extra = {n: b["elements"] for n, b in bufs.items() if n not in EXPECTED_BUFFERS}
    big = [n for n, e in extra.items() if e >= case.heads * case.nq * case.nk]
    detail = (f"global buffers: {sorted(bufs)}; extra: {extra}"
              + (f" ({', '.join(big)} as large as Nq×Nk: the scores or probabilities)" if big else ""))
    check(not extra, what="global memory holds only Q, K, V, O, L (S and P never leave the chip)",
          detail=detail, hint=HINT_ON_CHIP, inputs=shown)
    check(stats["launches"] >= 1, what="run_flash_kernel launches a kernel on the simulated GPU",
          detail="no launch was recorded", hint="run the kernel with gpu.launch(...)", inputs=shown)


def check_dram(student, case: KernelCase, cache: str = "no_cache") -> None:
    """DRAM bytes, per buffer and in total, equal the closed form exactly."""
    stats, _ = _counted(student, case)
    shown = None if student.hidden else case.shown(*case.qkv())
    exp = expected_bytes(case)
    want_total = sum(e[cache] for e in exp.values())
    got = {n: stats["buffers"].get(n, {}).get(f"dram_bytes_{cache}", 0) for n in EXPECTED_BUFFERS}
    rule = "each Q block re-reads K/V: 2Nd + 2Nd·⌈N/B_r⌉ + N" if cache == "no_cache" else "every byte once: 4Nd + N"
    detail = (f"expected {want_total} bytes ({rule}; per buffer {{{', '.join(f'{n}: {e[cache]}' for n, e in exp.items())}}}), "
              f"got {stats[f'dram_bytes_{cache}']} ({{{', '.join(f'{n}: {b}' for n, b in got.items())}}})")
    ok = stats[f"dram_bytes_{cache}"] == want_total and all(got[n] == exp[n][cache] for n in EXPECTED_BUFFERS)
    check(ok, what=f"DRAM bytes ({cache.replace('_', ' ')}) equal the closed form exactly", detail=detail,
          hint=diagnose(stats, case, student.hidden) if not ok else None, inputs=shown)


def check_causal_skipping(student, case: KernelCase) -> None:
    """Causal: the K/V bytes read are at most those of the block pairs that hold an allowed pair (T(T+1)/2
    of T²) and at least those of the keys each Q block's last row may see (a tile cut there is legal)."""
    assert case.causal
    stats, _ = _counted(student, case)
    shown = None if student.hidden else case.shown(*case.qkv())
    keys = keys_per_q_block(case)
    per_key = 2 * 4 * case.heads * case.d  # K and V, float32
    most, fewest = per_key * sum(keys), per_key * sum(visible_keys_per_q_block(case))
    got = sum(stats["buffers"].get(n, {}).get("dram_bytes_no_cache", 0) for n in ("K", "V"))
    full = per_key * case.nk * len(keys)
    pairs = sum(math.ceil(x / case.block_cols) for x in keys)
    total = len(keys) * math.ceil(case.nk / case.block_cols)
    ok = fewest <= got <= most
    hint = None
    if not ok:
        found = diagnose(stats, case, student.hidden)  # extra buffers or a race explain more than the skipping does
        hint = found if found == HINT_ON_CHIP or found.startswith(HINT_RACE) else HINT_SKIP if got > most else HINT_OVERSKIP
    check(ok, what="causal: K/V bytes read = those of the block pairs that hold an allowed (query, key) pair, at "
                   "most, and of the keys each Q block's rows may see, at least",
          detail=f"expected {fewest} to {most} bytes ({pairs} of {total} block pairs; all pairs would be {full}), "
                 f"got {got}", hint=hint, inputs=shown)


def on_chip_bounds(case: KernelCase) -> dict[str, int]:
    """FlashAttention's on-chip state per block, in 4-byte words, with room for every legal layout
    (module docstring, (d)): shared memory per block and live per-thread values. Independent of Nk."""
    br, bc, d = case.block_rows, case.block_cols, case.d
    return {"shared": 2 * br * (d + 4) + 4 * bc * (d + 4) + 2 * br * bc + 8 * br + 256,
            "per_thread": 4 * bc * (d + 4) + 8 * (d + bc) + 64}


def block_register_bound(case: KernelCase, threads: int) -> int:
    """FlashAttention's registers per block, in words (module docstring, (d)): the K and V tiles once
    (broadcast values, alike in every thread) and each of the block's ``threads`` its row's state."""
    bc, d = case.block_cols, case.d
    return 2 * bc * (d + 4) + threads * (3 * d + 3 * bc + 16)


def check_on_chip_state(student, case: KernelCase) -> None:
    """The shared memory of a block, the live per-thread values of a thread and the registers of a block,
    measured in the judge's replay, stay within FlashAttention's tiles (on_chip_bounds,
    block_register_bound): K/V streamed in tiles of B_c keys."""
    stats, _ = _counted(student, case)
    shown = None if student.hidden else case.shown(*case.qkv())
    bound = on_chip_bounds(case)
    d, bc, br = case.d, case.block_cols, case.block_rows
    shared = int(stats.get("shared_bytes_per_block", 0)) // 4
    per_thread = int(stats.get("live_words_per_thread", 0))
    tiles = f"B_r = {br}, B_c = {bc}, d = {d}"
    # The launch (§5.2): one thread per query row of the Q block, block = (B_r,); the last warp may be
    # padded. More threads would hold more of K/V in their registers at once than the tiles allow.
    threads = max((math.prod(p["block"]) for p in stats.get("per_launch", []) if type(p.get("block")) is list), default=0)
    most = -(-br // 32) * 32
    check(threads <= most, what="a block has one thread per query row of its Q block (§5.2, §6.4: split-Q)",
          detail=(f"a block runs {threads} threads for a Q block of B_r = {br} rows: the launcher's block is (B_r,), "
                  f"at most {most} threads with its last warp padded; every thread more holds more of K/V at once "
                  f"({tiles}; Nk = {case.nk})"),
          hint=HINT_ON_CHIP_STATE, inputs=shown)
    check(shared <= bound["shared"], what="shared memory per block stays within FlashAttention's tiles (§5.2)",
          detail=(f"a block declares {shared} words of shared memory, as much as the K/V of {shared // (2 * d)} keys "
                  f"({2 * d} words a key) at once: FlashAttention streams K/V in tiles of B_c = {bc} keys, with a Q "
                  f"tile beside them, and needs at most {bound['shared']} words here ({tiles}; Nk = {case.nk})"),
          hint=HINT_ON_CHIP_STATE, inputs=shown)
    check(per_thread <= bound["per_thread"], what="the values a thread holds at once stay within one tile and its "
          "row's state (§5.1–§5.2)",
          detail=(f"a thread holds {per_thread} words of values at once, as much as the K/V of {per_thread // (2 * d)} "
                  f"keys ({2 * d} words a key) or {per_thread} scores: FlashAttention's thread holds its row's acc, m "
                  f"and ℓ and one tile of B_c = {bc} keys, at most {bound['per_thread']} words here "
                  f"({tiles}; Nk = {case.nk})"),
          hint=HINT_ON_CHIP_STATE, inputs=shown)
    block = int(stats.get("live_words_per_block", 0))
    regs = block_register_bound(case, max(threads, 1))
    check(block <= regs, what="the registers of a block hold at once its K/V tiles and its rows' state (§5.1–§5.2)",
          detail=(f"the block held {block} words in registers at once (a value alike in every thread once, a "
                  f"per-thread value once per thread), as much as the K/V of {block // (2 * d)} keys: a block's on-chip "
                  f"state is its tiles, one K/V tile of B_c = {bc} keys and each row's q, acc, m and ℓ, at most {regs} "
                  f"words here for {threads} threads ({tiles}; Nk = {case.nk})"),
          hint=HINT_ON_CHIP_STATE, inputs=shown)


def check_no_race(student, case: KernelCase) -> None:
    """No shared-memory race (the judge's replay runs the race detector; lockstep hides races otherwise)."""
    stats, _ = _counted(student, case)
    shown = None if student.hidden else case.shown(*case.qkv())
    reports = stats["race_reports"]
    detail = "; ".join(f"{r['kind']} on {r['buffer']} at {r['line']} ({r['accesses']} accesses): {r['example']}"
                       for r in reports[:3])
    check(stats["races"] == 0, what="no shared-memory race between the warps of a block", detail=detail,
          hint=diagnose(stats, case, student.hidden) if stats["races"] else None, inputs=shown)
