# CANARY-HIDDEN-87f7668dc5ee (release leak detector: hidden tests must never reach students)
"""Part 3 hidden cases for the checks of autograder/tests/test_part3_flash_kernel.py: more shapes, seeds and edge cases."""
from autograder.tests import cases_part3 as C

OUTPUTS = [
    C.KernelCase(nq=1, nk=1, d=8, block_rows=8, block_cols=8, seed=20),
    C.KernelCase(nq=1, nk=77, d=8, causal=True, block_rows=16, block_cols=16, seed=21),  # decode-like
    C.KernelCase(nq=77, nk=1, d=8, causal=True, block_rows=16, block_cols=16, seed=22),  # 76 masked rows
    C.KernelCase(nq=77, nk=77, d=24, causal=True, block_rows=16, block_cols=48, seed=23),
    C.KernelCase(nq=150, nk=90, d=32, block_rows=48, block_cols=24, seed=24, q_mult=20.0),  # peaked
    C.KernelCase(lead=(3,), nq=48, nk=48, d=16, causal=True, block_rows=16, block_cols=32, seed=25),
    C.KernelCase(nq=65, nk=129, d=8, block_rows=64, block_cols=64, seed=26),
    # peaked rows spanning hundreds: only the running max keeps exp in range (a fixed shift does not)
    C.KernelCase(nq=90, nk=300, d=16, causal=True, block_rows=32, block_cols=48, seed=42, q_mult=100.0),
    C.KernelCase(lead=(2,), nq=40, nk=160, d=32, block_rows=16, block_cols=32, seed=43, q_mult=60.0),
]
DRAM = [
    C.KernelCase(nq=120, nk=120, d=16, block_rows=40, block_cols=24, seed=27),
    C.KernelCase(nq=203, nk=72, d=8, block_rows=16, block_cols=16, seed=28),
    C.KernelCase(lead=(2,), nq=64, nk=100, d=16, block_rows=32, block_cols=64, seed=29),
    C.KernelCase(nq=113, nk=113, d=32, causal=True, block_rows=32, block_cols=32, seed=30),
]
CAUSAL = [
    C.KernelCase(nq=128, nk=128, d=16, causal=True, block_rows=16, block_cols=16, seed=31),  # T = 8: 36 of 64
    C.KernelCase(nq=113, nk=203, d=8, causal=True, block_rows=32, block_cols=64, seed=32),
    C.KernelCase(nq=203, nk=113, d=8, causal=True, block_rows=64, block_cols=32, seed=33),
    C.KernelCase(nq=100, nk=100, d=16, causal=True, block_rows=24, block_cols=40, seed=34),
]
RACES = [
    C.KernelCase(nq=96, nk=200, d=8, block_rows=96, block_cols=16, seed=35),
    C.KernelCase(nq=70, nk=70, d=32, causal=True, block_rows=64, block_cols=16, seed=36),
]
# Long Nk (16 to 64 tiles): a block that keeps every key's K/V or every score of a row on chip
# exceeds the tile bounds (cases_part3, (d)); ragged, causal with Nq < Nk, several heads, d = 64.
ON_CHIP = [
    C.KernelCase(nq=24, nk=272, d=8, block_rows=8, block_cols=16, seed=38),
    C.KernelCase(nq=48, nk=777, d=16, causal=True, block_rows=16, block_cols=32, seed=39),
    C.KernelCase(lead=(2,), nq=40, nk=400, d=8, block_rows=8, block_cols=24, seed=40),
    C.KernelCase(nq=64, nk=1024, d=64, block_rows=64, block_cols=64, seed=41),
]

HIDDEN = {
    "test_outputs": OUTPUTS,
    "test_dram_bytes_no_cache": DRAM,
    "test_dram_bytes_ideal_cache": DRAM,
    "test_causal_block_skipping": CAUSAL,
    "test_no_shared_memory_race": RACES,
    "test_on_chip_state_bounded_by_tiles": ON_CHIP,
    "test_global_memory_only_q_k_v_o_l": [C.KernelCase(lead=(2,), nq=72, nk=72, d=16, block_rows=24, block_cols=24, seed=37)],
}
