"""Model tests run torch on one thread: their tensors are small, and on a shared
machine OpenMP threads that spin-wait on each other make tiny ops many times slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
