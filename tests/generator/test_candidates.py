"""Candidate sets: layout, sizes, distinct ads, retrieval-like bias, determinism."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.durations import DAY_MS
from pipelines.generator import GeneratedEvents, generate_candidates, rngs
from pipelines.generator.candidates import MAX_ADS, MIN_ADS
from pipelines.schemas.layouts import CANDIDATES, layout_of


@pytest.fixture(scope="module")
def candidates(small: GeneratedEvents) -> pa.Table:
    return generate_candidates(small.world, 600, rngs(small.world.config.seed)["candidates"])


def _sizes(table: pa.Table) -> np.ndarray:
    return np.diff(table["ad_ids"].combine_chunks().offsets.to_numpy())


def test_layout_and_ids(candidates: pa.Table) -> None:
    assert candidates.schema.equals(CANDIDATES.schema)
    assert layout_of(candidates.schema) == ("candidates", CANDIDATES.version)
    assert candidates.num_rows == 600
    assert len(set(candidates["request_id"].to_pylist())) == 600


def test_requests_are_spread_over_the_period_in_time_order(small: GeneratedEvents, candidates: pa.Table) -> None:
    config = small.world.config
    time = candidates["request_time"].cast(pa.int64()).to_numpy()
    assert np.all(np.diff(time) >= 0)
    assert config.start_ms < time.min() and time.max() < config.end_ms
    days = (time - config.start_ms) // DAY_MS
    assert len(np.unique(days)) == config.days
    assert set(candidates["user_id"].to_pylist()) <= set(small.world.users.user_id.tolist())


def test_sizes_are_tens_to_hundreds_and_ads_distinct(small: GeneratedEvents, candidates: pa.Table) -> None:
    sizes = _sizes(candidates)
    assert sizes.min() >= MIN_ADS and sizes.max() <= MAX_ADS
    assert 30 <= np.median(sizes) <= 120 and sizes.max() >= 150
    ads = set(small.world.items.item_id[small.world.items.is_ad].tolist())
    for row in candidates["ad_ids"].to_pylist():
        assert len(set(row)) == len(row)
        assert set(row) <= ads


def test_candidates_lean_towards_the_users_interests(small: GeneratedEvents, candidates: pa.Table) -> None:
    world = small.world
    category_of = dict(zip(world.items.item_id.tolist(), world.items.category.tolist(), strict=True))
    chosen, baseline = [], []
    ad_categories = world.items.category[world.items.is_ad]
    for user, ads in zip(candidates["user_id"].to_pylist(), candidates["ad_ids"].to_pylist(), strict=True):
        interest = world.users.interest[np.searchsorted(world.users.user_id, user)]
        chosen.append(np.mean([interest[category_of[ad]] for ad in ads]))
        baseline.append(interest[ad_categories].mean())
    assert np.mean(chosen) > 2 * np.mean(baseline)


def test_deterministic_for_a_seed(small: GeneratedEvents, candidates: pa.Table) -> None:
    again = generate_candidates(small.world, 600, rngs(small.world.config.seed)["candidates"])
    assert again.equals(candidates)
    other = generate_candidates(small.world, 600, rngs(small.world.config.seed + 1)["candidates"])
    assert not other.equals(candidates)


def test_zero_requests_give_an_empty_table(small: GeneratedEvents) -> None:
    table = generate_candidates(small.world, 0, rngs(0)["candidates"])
    assert table.num_rows == 0 and table.schema.equals(CANDIDATES.schema)
