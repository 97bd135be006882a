"""The CUDA path, where torch sees a GPU: the same model gives the same outputs there as on the CPU."""

from __future__ import annotations

import pytest
import torch

from pipelines.model.gem import GemModel
from tests.model.factories import random_batch, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")


def test_forward_on_cuda_matches_the_cpu() -> None:
    torch.manual_seed(0)
    model = GemModel(tiny_config()).eval()
    batch = random_batch([3, 0, 9, 17, 64])
    with torch.inference_mode():
        cpu = model(batch)
        gpu = model.to("cuda")(batch.to("cuda"))
    for name in ("click_logit", "conversion_logit", "user_embedding", "pair_embedding"):
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), rtol=1e-4, atol=1e-4)
