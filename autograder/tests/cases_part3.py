"""Part 3 (flash_kernel): cases and checks shared by the public and the hidden tests.

The student's run_flash_kernel runs in the worker (autograder/scenarios/part3.py); the simulator's
own counters of every launch come back as plain data. Everything expected is computed here:
(a) o and lse against course.reference.attention_reference (float64), tolerance rule
    err <= 2·err_plain + 1e-6 with the plain float32 implementation (attention_plain);
(b) conventions: lse incl. m in natural log, bottom-right causal, fully masked rows (Nq > Nk);
(c) counters, exactly (docs/gpusim_guide.md): global memory holds only Q, K, V, O, L (S and P
    never leave the chip); DRAM bytes equal the closed form; causal K/V bytes are those of the
    block pairs that hold an allowed (query, key) pair; no shared-memory race.

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

import torch

from autograder.engine.checks import CheckFailure, check, check_close
from course.reference import attention_plain, attention_reference, causal_mask

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
HINT_OVERSKIP = ("your kernel skips K/V blocks that some row of the Q block may still see: the diagonal "
                 "block must be loaded and masked element-wise (§6.2)")
HINT_KV = ("each Q block must read every K/V block exactly once, the ragged last one included: K/V "
           "traffic is 2·Nk·d·⌈Nq/B_r⌉ elements (§5.4)")
HINT_ONCE = ("Q must be read once, and O and L written once, by the block that owns the rows (§5.3); "
             "rows past Nq must not be touched")
HINT_VALUES = ("o = softmax(scale·q kᵀ) v row by row with the online softmax (§5.1): rescale acc and ℓ by "
               "exp(m - m_new) when the max grows, divide by ℓ once at the end, lse = m + log ℓ")


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


def diagnose(stats: dict, case: KernelCase) -> str:
    """The most specific hint that the counters support (first match wins)."""
    extra = [b for b in stats.get("buffers", {}) if b not in EXPECTED_BUFFERS]
    if extra:
        return HINT_ON_CHIP
    if stats.get("races"):
        r = stats["race_reports"][0]
        return f"{HINT_RACE} [reported: {r['kind']} on {r['buffer']} at {r['line']}]"
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
# Running and checking


def run(student, case: KernelCase) -> tuple[dict, tuple[torch.Tensor, ...]]:
    """The scenario's result and the inputs it ran on; checks the return shape (o, lse, stats)."""
    q, k, v = case.qkv()
    out = student.scenario("part3.flash_kernel", q=q, k=k, v=v, **case.kwargs())
    check(out["result_type"] in ("tuple of length 3", "list of length 3"),
          what="run_flash_kernel returns (o, lse, stats)", detail=f"got a {out['result_type']}",
          hint="return the launcher's (o, lse, gpu.report()) unchanged", inputs=case.shown(q, k, v))
    for name in ("o", "lse"):
        check(out[name] is not None, what=f"{name} returned by run_flash_kernel is a torch.Tensor",
              detail=f"got a {out[name + '_type']}", hint="convert the buffers with torch.from_numpy(buf.numpy())",
              inputs=case.shown(q, k, v))
    return out, (q, k, v)


def check_outputs(student, case: KernelCase) -> None:
    """o and lse against float64 attention (2 × plain float32 error + 1e-6)."""
    out, (q, k, v) = run(student, case)
    ref_o, ref_lse = attention_reference(q, k, v, case.causal)
    plain_o, plain_lse = attention_plain(q, k, v, case.causal)
    inputs = case.shown(q, k, v)
    hint = HINT_VALUES
    if case.causal and case.nq > case.nk:
        hint += "; a row that sees no key (causal, Nq > Nk) gets o = 0 and lse = -inf, never NaN"
    try:
        check_close(out["o"], ref_o, what="o of run_flash_kernel against float64 attention", inputs=inputs,
                    plain=plain_o, factor=2.0, hint=hint)
        check_close(out["lse"], ref_lse, what="lse of run_flash_kernel: log Σ_j exp(S_ij), natural log, including m",
                    inputs=inputs, plain=plain_lse, factor=2.0, hint=hint)
    except CheckFailure as failure:
        # Wrong values whose counters also show a known bug (e.g. the diagonal block skipped:
        # fewer K/V bytes than the allowed block pairs need): name that bug; else the probes of
        # part 2's ladder, run through the kernel, say where the values first go wrong.
        if failure.kind not in ("type", "dtype", "shape"):
            found = diagnose(out["stats"], case)
            try:
                probe = kernel_probe_hint(student)
            except Exception as exc:  # noqa: BLE001 -- a diagnosis must never hide the failure itself
                probe = f"(diagnosis unavailable: {type(exc).__name__})"
            failure.hint = dg._compose(probe, found if found != HINT_VALUES else None)
            failure.args = (failure.message(),)
        raise


def kernel_probe_hint(student) -> str:
    """The forward ladder through the student's kernel (run(), the part-3 check path), with the recognisers of
    known forward bugs on the failed probe's inputs beneath it."""
    def run_case(*, nq, nk, d, causal, block_rows, block_cols, lead, q_mult):
        case = KernelCase(lead=tuple(lead), nq=nq, nk=nk, d=d, causal=causal, block_rows=block_rows,
                          block_cols=block_cols, seed=21, q_mult=q_mult)
        out, qkv = run(student, case)
        return {"o": out["o"], "lse": out["lse"], "qkv": qkv}
    finding = pb.kernel_ladder(run_case)
    return dg._compose(finding.message(), dg.forward_probe_hint(finding))


def check_only_qkvol(student, case: KernelCase) -> None:
    """Global memory holds Q, K, V, O, L and nothing else: S and P never appear there."""
    out, (q, k, v) = run(student, case)
    bufs = out["stats"]["buffers"]
    extra = {n: b["elements"] for n, b in bufs.items() if n not in EXPECTED_BUFFERS}
    big = [n for n, e in extra.items() if e >= case.heads * case.nq * case.nk]
    detail = (f"global buffers: {sorted(bufs)}; extra: {extra}"
              + (f" ({', '.join(big)} as large as Nq×Nk: the scores or probabilities)" if big else ""))
    check(not extra, what="global memory holds only Q, K, V, O, L (S and P never leave the chip)",
          detail=detail, hint=HINT_ON_CHIP, inputs=case.shown(q, k, v))
    check(out["stats"]["launches"] >= 1, what="run_flash_kernel launches a kernel on the simulated GPU",
          detail="no launch was recorded", hint="run the kernel with gpu.launch(...)", inputs=case.shown(q, k, v))


def check_dram(student, case: KernelCase, cache: str = "no_cache") -> None:
    """DRAM bytes, per buffer and in total, equal the closed form exactly."""
    out, (q, k, v) = run(student, case)
    stats = out["stats"]
    exp = expected_bytes(case)
    want_total = sum(e[cache] for e in exp.values())
    got = {n: stats["buffers"].get(n, {}).get(f"dram_bytes_{cache}", 0) for n in EXPECTED_BUFFERS}
    rule = "each Q block re-reads K/V: 2Nd + 2Nd·⌈N/B_r⌉ + N" if cache == "no_cache" else "every byte once: 4Nd + N"
    detail = (f"expected {want_total} bytes ({rule}; per buffer {{{', '.join(f'{n}: {e[cache]}' for n, e in exp.items())}}}), "
              f"got {stats[f'dram_bytes_{cache}']} ({{{', '.join(f'{n}: {b}' for n, b in got.items())}}})")
    ok = stats[f"dram_bytes_{cache}"] == want_total and all(got[n] == exp[n][cache] for n in EXPECTED_BUFFERS)
    check(ok, what=f"DRAM bytes ({cache.replace('_', ' ')}) equal the closed form exactly", detail=detail,
          hint=diagnose(stats, case) if not ok else None, inputs=case.shown(q, k, v))


def check_causal_skipping(student, case: KernelCase) -> None:
    """Causal: the K/V bytes read are those of the block pairs that hold an allowed pair (T(T+1)/2 of T²)."""
    assert case.causal
    out, (q, k, v) = run(student, case)
    stats = out["stats"]
    keys = keys_per_q_block(case)
    want = 2 * 4 * case.heads * case.d * sum(keys)
    got = sum(stats["buffers"].get(n, {}).get("dram_bytes_no_cache", 0) for n in ("K", "V"))
    full = 2 * 4 * case.heads * case.d * case.nk * len(keys)
    pairs = sum(math.ceil(x / case.block_cols) for x in keys)
    total = len(keys) * math.ceil(case.nk / case.block_cols)
    hint = None
    if got != want:
        found = diagnose(stats, case)  # extra buffers or a race explain more than the skipping does
        hint = found if found == HINT_ON_CHIP or found.startswith(HINT_RACE) else HINT_SKIP if got > want else HINT_OVERSKIP
    check(got == want, what="causal: K/V bytes read = the block pairs that hold an allowed (query, key) pair",
          detail=f"expected {want} bytes ({pairs} of {total} block pairs; all pairs would be {full}), got {got}",
          hint=hint, inputs=case.shown(q, k, v))


def check_no_race(student, case: KernelCase) -> None:
    """No shared-memory race (the simulator's detector; lockstep execution hides them otherwise)."""
    out, (q, k, v) = run(student, case)
    stats = out["stats"]
    reports = stats["race_reports"]
    detail = "; ".join(f"{r['kind']} on {r['buffer']} at {r['line']} ({r['accesses']} accesses): {r['example']}"
                       for r in reports[:3])
    check(stats["races"] == 0, what="no shared-memory race between the warps of a block", detail=detail,
          hint=diagnose(stats, case) if stats["races"] else None, inputs=case.shown(q, k, v))
