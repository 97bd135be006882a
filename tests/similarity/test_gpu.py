"""The FAISS GPU path, where faiss sees a GPU: the GPU copy of an index finds the CPU index's neighbours."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.similarity import faiss_ops as ops

pytestmark = pytest.mark.skipif(ops.gpu_count("auto") == 0, reason="faiss sees no GPU here (faiss-cpu or no device)")


def test_gpu_flat_index_returns_the_cpu_neighbours() -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((5_000, 32)).astype(np.float32)
    queries = data[:64] + 0.01 * rng.standard_normal((64, 32)).astype(np.float32)
    cpu = ops.new_index("Flat", 32, "ip")
    cpu.add(data)
    gpu, on_gpu = ops.to_gpu(ops.new_index("Flat", 32, "ip"), "auto")
    gpu.add(data)
    assert on_gpu
    _, cpu_ids = cpu.search(queries, 10)
    _, gpu_ids = gpu.search(queries, 10)
    assert np.mean(cpu_ids == gpu_ids) > 0.99
