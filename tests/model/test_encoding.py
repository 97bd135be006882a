"""The user-side encoding cache: a hit gives what encoding the history again gives; anything that
changes a token's inputs is a miss; the cache stays within its capacity and age."""

from __future__ import annotations

import pytest
import torch

from pipelines.model.encoding import EncodingCache
from pipelines.model.gem import GemModel
from pipelines.model.inputs import GemBatch
from tests.model.factories import random_batch, tiny_config

OUTPUTS = ("click_logit", "conversion_logit", "user_embedding", "pair_embedding")


def _requests(users: GemBatch, rows: list[int], first_ad: int) -> GemBatch:
    """A candidate batch: ``rows`` of ``users`` (each repeated for its ads, adjacent), new ads from ``first_ad``."""
    batch = users.select(torch.tensor(rows))
    batch.target_item[:] = torch.arange(first_ad, first_ad + batch.num_rows)
    batch.target_category[:] = torch.arange(batch.num_rows) % 7
    return batch


def _assert_same(got: object, want: object) -> None:
    for name in OUTPUTS:
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture
def model() -> GemModel:
    torch.manual_seed(0)
    return GemModel(tiny_config(block_size=8)).eval()


def test_a_second_request_of_the_same_histories_hits_and_equals_encoding_again(model: GemModel) -> None:
    users = random_batch([9, 30, 0, 17], seed=4)
    cache = EncodingCache(capacity=16, max_age_s=60)
    first, again = _requests(users, [0, 0, 1, 1, 1, 2, 3], 100), _requests(users, [3, 1, 1, 0, 0, 0], 500)
    with torch.no_grad():
        _assert_same(model(first, cache=cache), model(first, share_histories=True))
        assert (cache.hits, cache.misses) == (0, 4)
        _assert_same(model(again, cache=cache), model(again, share_histories=True))
    assert (cache.hits, cache.misses, cache.tokens_saved) == (3, 4, 17 + 30 + 9)


def test_some_histories_cached_and_some_not_keep_their_rows_order(model: GemModel) -> None:
    users = random_batch([12, 5, 40], seed=6)
    cache = EncodingCache(capacity=16, max_age_s=60)
    with torch.no_grad():
        model(_requests(users, [1], 0), cache=cache)  # only the second user cached
        mixed = _requests(users, [2, 2, 1, 0, 0, 0], 50)
        _assert_same(model(mixed, cache=cache), model(mixed, share_histories=True))
    assert (cache.hits, cache.misses) == (1, 3)


def test_a_new_event_or_an_event_moved_to_another_age_bucket_misses(model: GemModel) -> None:
    users = random_batch([20], seed=2)
    cache = EncodingCache(capacity=16, max_age_s=60)
    with torch.no_grad():
        model(_requests(users, [0, 0], 0), cache=cache)
        changed = users.select(torch.tensor([0]))
        changed.item_id[-1] += 1  # the newest event differs
        changed = _requests(changed, [0, 0], 10)
        _assert_same(model(changed, cache=cache), model(changed, share_histories=True))
        later = users.select(torch.tensor([0]))
        later.age_s[:] = later.age_s * 4 + 1  # every event older: other age buckets
        later = _requests(later, [0, 0], 20)
        _assert_same(model(later, cache=cache), model(later, share_histories=True))
    assert (cache.hits, cache.misses) == (0, 3)
    assert len(cache) == 1  # the user's entry was replaced, not added to


def test_a_later_request_whose_ages_keep_their_buckets_hits_exactly(model: GemModel) -> None:
    users = random_batch([20], seed=5)
    users.age_s[:] = torch.linspace(5e5, 1e5, 20)  # days old: a second later keeps every bucket
    cache = EncodingCache(capacity=16, max_age_s=60)
    with torch.no_grad():
        model(_requests(users, [0, 0], 0), cache=cache)
        later = users.select(torch.tensor([0]))
        later.age_s[:] = later.age_s + 1.0
        later = _requests(later, [0, 0, 0], 10)
        _assert_same(model(later, cache=cache), model(later, share_histories=True))
    assert cache.hits == 1


def test_capacity_evicts_the_least_recently_used_and_age_expires() -> None:
    now = [0.0]
    cache = EncodingCache(capacity=2, max_age_s=10, clock=lambda: now[0])
    model = GemModel(tiny_config()).eval()
    with torch.no_grad():
        encoded = model.encode_histories(random_batch([3, 4, 5], seed=1))
    one = [encoded.select(torch.tensor([h])) for h in range(3)]
    cache.put(1, b"a", one[0])
    cache.put(2, b"b", one[1])
    assert cache.get(1, b"a") is one[0]  # 1 is now the most recently used
    cache.put(3, b"c", one[2])
    assert cache.get(2, b"b") is None and cache.get(1, b"a") is one[0] and len(cache) == 2
    now[0] = 10.5
    assert cache.get(1, b"a") is None  # older than max_age_s
    with pytest.raises(ValueError, match="one history"):
        cache.put(4, b"d", encoded)
    with pytest.raises(ValueError, match="capacity"):
        EncodingCache(capacity=0, max_age_s=1)
