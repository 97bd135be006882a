"""Rows that share a history (a candidate request's ads) encode it once and give what they gave alone."""

from __future__ import annotations

import pytest
import torch

from pipelines.model.config import GemConfig
from pipelines.model.gem import GemModel, shared_histories
from pipelines.model.inputs import GemBatch
from pipelines.model.jagged import gather_index
from tests.model.factories import random_batch, tiny_config


def _request_batch() -> GemBatch:
    """Three users' requests: rows 0-3 read user A's history, 4-5 user B's, 6 user C's; the ads differ."""
    users = random_batch([9, 20, 5], seed=3)
    batch = users.select(torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    batch.target_item[:] = torch.arange(100, 107)
    batch.target_category[:] = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    return batch


def test_gather_index_takes_rows_in_any_order_with_repeats() -> None:
    offsets = torch.tensor([0, 2, 2, 5])
    values = torch.tensor([10, 11, 30, 31, 32])
    index, new_offsets = gather_index(offsets, torch.tensor([2, 0, 2, 1]))
    assert values[index].tolist() == [30, 31, 32, 10, 11, 30, 31, 32]
    assert new_offsets.tolist() == [0, 3, 5, 8, 8]


def test_shared_histories_finds_each_requests_history() -> None:
    found = shared_histories(_request_batch())
    assert found is not None
    first, history_of = found
    assert sorted(first[history_of].tolist()) == [0, 0, 0, 0, 4, 4, 6]


def test_rows_alike_by_key_but_not_by_tokens_do_not_share() -> None:
    batch = _request_batch()
    batch.item_id[3] += 1  # row 0's history, one token changed: same user, time and length, other tokens
    assert shared_histories(batch) is None
    distinct = random_batch([4, 4, 4], seed=1)
    distinct.user_id[:] = torch.tensor([1, 2, 3])
    assert shared_histories(distinct) is None


def test_a_shared_history_gives_every_row_what_it_gives_alone() -> None:
    torch.manual_seed(0)
    model = GemModel(tiny_config(block_size=8)).eval()
    batch = _request_batch()
    with torch.no_grad():
        together = model(batch, share_histories=True)
        alone = [model(batch.select(torch.tensor([i]))) for i in range(batch.num_rows)]
    for name in ("click_logit", "conversion_logit", "user_embedding", "pair_embedding"):
        got = getattr(together, name)
        want = torch.cat([getattr(a, name) for a in alone])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_target_attention_once_per_history_equals_it_on_each_rows_copy(seed: int) -> None:
    """The fast path (target-free work once per history) against the reference (the model on each
    row's copy of its history), at the default width: equal within 1e-5 (float rounding: the first
    score layer is summed in three parts), on requests of random sizes, an empty history among them."""
    torch.manual_seed(seed)
    model = GemModel(GemConfig(max_len=64, block_size=16)).eval()
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 6, (4,), generator=g)
    users = random_batch([int(n) for n in torch.randint(0, 60, (4,), generator=g)] + [0], seed=seed)
    batch = users.select(torch.repeat_interleave(torch.arange(5), torch.cat([sizes, torch.tensor([2])])))
    batch.target_item[:] = torch.randint(0, 1000, (batch.num_rows,), generator=g)
    batch.target_category[:] = torch.randint(0, 50, (batch.num_rows,), generator=g)
    assert shared_histories(batch) is not None
    outputs = {}
    with torch.no_grad():
        for flag in (True, False):
            model.shared_target_attention = flag
            outputs[flag] = model(batch, share_histories=True)
    for name in ("click_logit", "conversion_logit", "user_embedding", "pair_embedding"):
        torch.testing.assert_close(getattr(outputs[True], name), getattr(outputs[False], name), rtol=1e-5, atol=1e-5)
