"""Fixtures shared by the project's test modules."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small tensors: one torch thread is faster on a shared 2-core machine (and deterministic).
    A module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
