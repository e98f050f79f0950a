"""Part 2 public tests: flash_forward (cases and checks in cases_part2.py).

Shapes are the ones that expose the known bugs: N = 1 and N < block; N = 113, 203 with blocks that
do not divide N (ragged last block); Nq != Nk both ways (bottom-right alignment, fully masked rows);
peaked scores ×40 (rescaling); float64 (tight).
"""
import pytest

from autograder.engine.cases import cases

from autograder.tests import cases_part2 as C
from autograder.tests import diagnose as dg
from autograder.tests.cases_part2 import AttnCase
from autograder.tests.cases_part2 import one_torch_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.part2

VALUES = [
    AttnCase((), 1, 1, 8),  # N = 1
    AttnCase((), 20, 20, 8, block_q=64, block_k=64),  # N < block
    AttnCase((2,), 113, 113, 16, block_q=32, block_k=32),  # ragged, non-causal
    AttnCase((2, 3), 203, 203, 16, causal=True, block_q=64, block_k=32),  # ragged, causal, 2 leading dims
    AttnCase((2,), 113, 203, 16, causal=True, block_q=32, block_k=64),  # Nq < Nk: bottom-right alignment
    AttnCase((2,), 203, 113, 16, causal=True, block_q=64, block_k=64),  # Nq > Nk: fully masked rows
    AttnCase((1, 2), 70, 70, 8, causal=True, block_q=32, block_k=32, dtype="float64"),  # float64 is tight
    AttnCase((2,), 96, 96, 16, block_q=32, block_k=32, q_mult=40.0),  # peaked: rescaling matters
    AttnCase((2,), 33, 33, 8, causal=True, block_q=16, block_k=16),  # the last Q block's last visible key opens a K/V block
    AttnCase((2,), 80, 100, 16, causal=True, block_q=32, block_k=32, dv=8),  # v's head dim is not q's
    AttnCase((2,), 113, 113, 16, block_q=32, block_k=32, scale=0.3, seed=3),  # the scale argument, not 1/sqrt(d)
]
MASKED = [AttnCase((2,), 203, 113, 16, causal=True, block_q=32, block_k=32)]
TRACE = [
    AttnCase((2,), 512, 512, 16, block_q=64, block_k=64),  # 4·N²·d; naive would build 1 MiB per head
    AttnCase((2,), 256, 256, 16, causal=True, block_q=32, block_k=32),  # 36 of 64 block pairs
    AttnCase((), 128, 1024, 4, block_q=64, block_k=32),  # long rows: a B_r × Nk row panel is 7× the tiled peak
]


@cases(*VALUES, diagnosis=dg.hidden_forward)
def test_forward_values(student, case):
    """flash_forward's o and lse against float64 attention, then the structure of the same replay: tiled, no N×N tensor, whole blocks skipped (§5, §6)."""
    C.check_forward_values(student, case, hidden=student.hidden)


@cases(*MASKED, diagnosis=dg.hidden_forward)
def test_fully_masked_rows(student, case):
    """Causal rows that see no key (Nq > Nk) get o = 0 and lse = -inf, with no NaN (§4.4)."""
    C.check_fully_masked_rows(student, case)


@cases(*TRACE, diagnosis=dg.hidden_forward)
def test_forward_trace(student, case):
    """flash_forward's structure first (matmul FLOPs, storages, keys per matmul, no fused op), then its o (§5, §6)."""
    C.check_forward_trace(student, case, hidden=student.hidden)
