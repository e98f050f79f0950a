"""Part 3 public tests: the flash kernel on the simulated GPU (cases and checks in cases_part3.py)."""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part3 as C

pytestmark = pytest.mark.part3

# Values: ragged N (not a multiple of the blocks), Nq != Nk both ways with causal (bottom-right
# alignment; Nq > Nk gives fully masked rows), several heads, B_r != B_c.
OUTPUTS = [
    C.KernelCase(nq=64, nk=64, d=32, block_rows=32, block_cols=32, seed=1),
    C.KernelCase(nq=100, nk=100, d=16, causal=True, block_rows=32, block_cols=48, seed=2),
    C.KernelCase(nq=113, nk=203, d=16, causal=True, block_rows=32, block_cols=64, seed=3),
    C.KernelCase(nq=203, nk=113, d=16, causal=True, block_rows=64, block_cols=32, seed=4),
    C.KernelCase(lead=(2, 3), nq=40, nk=56, d=8, block_rows=16, block_cols=16, seed=5),
    # several heads with Nq != Nk, causal: every head's Q/O/L offset counts Nq rows and its K/V offset Nk
    C.KernelCase(lead=(3,), nq=48, nk=72, d=8, causal=True, block_rows=16, block_cols=16, seed=15),
    # peaked (q × 100): a row's scores span hundreds, so no shift fixed early (from its first tile) keeps
    # exp in float32's range for every row: only the running max of the online softmax does (§4.3)
    C.KernelCase(nq=64, nk=200, d=16, block_rows=32, block_cols=32, seed=14, q_mult=100.0),
    # a K/V tile of fewer float4s than threads (B_c·d = 64 < 4·B_r = 128): each thread's share of the
    # tile's loads is ⌈B_c·d / (4·B_r)⌉, not its floor (0 here: nothing would be loaded)
    C.KernelCase(nq=40, nk=48, d=8, block_rows=32, block_cols=8, seed=16),
]
# Exact DRAM bytes: the lecture's shape (N = 256, d = 64, B = 64: 656,384 bytes with no cache,
# 263,168 with an ideal cache) and a ragged one.
DRAM = [
    C.KernelCase(nq=256, nk=256, d=64, seed=6),
    C.KernelCase(nq=100, nk=100, d=32, block_rows=32, block_cols=48, seed=7),
]
# Causal skipping: N = 256, B = 64 reads 10 of 16 block pairs (327,680 of 524,288 K/V bytes).
CAUSAL = [
    C.KernelCase(nq=256, nk=256, d=64, causal=True, seed=8),
    C.KernelCase(nq=96, nk=160, d=16, causal=True, block_rows=32, block_cols=32, seed=9),
]
# On-chip state: Nk of 16 tiles and more, so that a block that keeps every key's K/V (or every score
# of a row) on chip exceeds FlashAttention's tile bounds (cases_part3, (d)); causal with Nq < Nk.
ON_CHIP = [
    C.KernelCase(nq=32, nk=256, d=8, block_rows=16, block_cols=16, seed=12),
    C.KernelCase(nq=64, nk=512, d=16, causal=True, block_rows=32, block_cols=32, seed=13),
]
# Races need >= 2 warps per block and >= 2 K/V blocks.
RACE = C.KernelCase(nq=130, nk=130, d=16, block_rows=64, block_cols=32, seed=10)


# first: a bug in the values is reported under the test of the values (the counter tests need o right)
@cases(*OUTPUTS, diagnosis=C.kernel_probe_hint)
def test_outputs(student, case):
    """o and lse read from the judge's replay of the kernel on its own simulated memory, against float64 attention."""
    C.check_outputs(student, case)


@cases(C.KernelCase(nq=128, nk=128, d=32, causal=True, seed=11))
def test_global_memory_only_q_k_v_o_l(student, case):
    """The kernel's global memory holds Q, K, V, O and L only: S and P stay on chip (§5.2)."""
    C.check_only_qkvol(student, case)


@cases(RACE)
def test_no_shared_memory_race(student, case):
    """No shared-memory race in the judge's replay (its race detector sees what lockstep execution hides): a barrier between writing a shared tile and reading it (§5.2)."""
    C.check_no_race(student, case)


@cases(*DRAM)
def test_dram_bytes_no_cache(student, case):
    """The DRAM bytes of the judge's replay with no cache, per buffer and in total, equal the closed form exactly (§5.2)."""
    C.check_dram(student, case, "no_cache")


@cases(*DRAM)
def test_dram_bytes_ideal_cache(student, case):
    """The DRAM bytes of the judge's replay with an ideal cache, per buffer and in total, equal the closed form exactly (§5.2)."""
    C.check_dram(student, case, "ideal_cache")


@cases(*CAUSAL)
def test_causal_block_skipping(student, case):
    """Causal: the K/V bytes the replay reads are at most those of the block pairs that hold an allowed pair, and at least those of the keys each Q block's rows may see (§6.2)."""
    C.check_causal_skipping(student, case)


@cases(*ON_CHIP)
def test_on_chip_state_bounded_by_tiles(student, case):
    """The judge's replay measures what a block keeps on chip: its threads (one per query row), the shared memory it declares and the most per-thread values (registers) a thread holds at once; all stay within FlashAttention's tiles (B_r threads; a Q tile and K/V tiles of B_c keys; a row's acc, m, ℓ and one tile), independent of Nk (§5.1–§5.2)."""
    C.check_on_chip_state(student, case)
