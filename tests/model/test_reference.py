"""The jagged fast path equals the padded reference (explicit masks) on random jagged batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipelines.model.gem import GemModel
from tests.model.factories import random_batch, tiny_config

BLOCK = 8  # tiny_config's block size


def _assert_close(model: GemModel, lengths: list[int], seed: int) -> None:
    batch = random_batch(lengths, seed=seed)
    with torch.no_grad():
        fast, ref = model(batch), model(batch, reference=True)
    for name in ("click_logit", "conversion_logit", "user_embedding", "pair_embedding"):
        torch.testing.assert_close(
            getattr(fast, name), getattr(ref, name), atol=2e-5, rtol=1e-4, msg=f"{name} differs for lengths {lengths}"
        )


@pytest.fixture(
    scope="module",
    params=[
        ({"component_skip": True}, 64),
        ({"component_skip": True}, 1),
        ({"component_skip": False, "attend_previous_block": False}, 2),
        ({"component_skip": False, "num_layers": 3, "target_attention": False, "target_match": False}, 3),
    ],
    ids=["skip", "skip-one-block-chunks", "no-skip-no-prev", "three-layers-no-target"],
)
def model(request: pytest.FixtureRequest) -> GemModel:
    """Models with the jagged path run in chunks of 64, 1, 2 and 3 blocks (CPU chunking)."""
    changes, chunk_blocks = request.param
    torch.manual_seed(0)
    model = GemModel(tiny_config(**changes)).eval()
    model.cpu_chunk_blocks = chunk_blocks
    return model


@settings(max_examples=25, derandomize=True, deadline=None)
@given(lengths=st.lists(st.integers(0, 3 * BLOCK + 2), min_size=1, max_size=6), seed=st.integers(0, 3))
@example(lengths=[1], seed=0)
@example(lengths=[BLOCK], seed=1)
@example(lengths=[BLOCK + 1], seed=2)
@example(lengths=[1, BLOCK, BLOCK + 1, 0, 2 * BLOCK], seed=3)
def test_jagged_matches_padded_reference(model: GemModel, lengths: list[int], seed: int) -> None:
    _assert_close(model, lengths, seed)


def test_a_batch_of_empty_histories_gives_finite_outputs(model: GemModel) -> None:
    batch = random_batch([0, 0, 0])
    with torch.no_grad():
        out = model(batch)
    assert torch.isfinite(out.click_logit).all() and torch.isfinite(out.user_embedding).all()
    _assert_close(model, [0, 0, 0], 0)
