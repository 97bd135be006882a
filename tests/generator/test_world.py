"""The simulated world: layout, ids, order, and the behaviour later stages rely on."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.durations import DAY_MS
from pipelines.generator import GeneratedEvents, WorldConfig, generate_events
from pipelines.generator.config import EVENTS_PER_USER_DAY
from pipelines.generator.summary import events_per_user
from pipelines.generator.truth import users_table
from pipelines.schemas.enums import CONVERSION_TYPES, EVENT_TYPE_CODE, EVENT_TYPES
from pipelines.schemas.layouts import EVENT, layout_of


def _column(generated: GeneratedEvents, name: str) -> np.ndarray:
    column = generated.events[name]
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return column.to_numpy()


def test_events_have_the_event_layout(small: GeneratedEvents) -> None:
    assert small.events.schema.equals(EVENT.schema)
    assert layout_of(small.events.schema) == ("event", EVENT.version)
    for field in EVENT.schema:
        if not field.nullable:
            assert small.events[field.name].null_count == 0, field.name


def test_event_ids_are_unique_and_events_sorted_in_the_period(small: GeneratedEvents) -> None:
    ids = small.events["event_id"].to_pylist()
    assert len(set(ids)) == len(ids)
    time = _column(small, "event_time")
    assert np.all(np.diff(time) >= 0)
    config = small.world.config
    assert config.start_ms <= time.min() and time.max() < config.start_ms + config.days * DAY_MS


def test_same_seed_same_events_other_seed_other_events(small: GeneratedEvents) -> None:
    again = generate_events(WorldConfig(users=400, days=5, seed=3))
    assert again.events.equals(small.events)
    other = generate_events(WorldConfig(users=400, days=5, seed=4))
    assert not other.events.equals(small.events)
    assert not set(other.events["event_id"].to_pylist()) & set(small.events["event_id"].to_pylist())


def test_items_are_consistent_with_the_ground_truth(small: GeneratedEvents) -> None:
    items = small.world.items
    sorter = np.argsort(items.item_id)
    index = sorter[np.searchsorted(items.item_id, _column(small, "item_id"), sorter=sorter)]
    assert np.array_equal(items.item_id[index], _column(small, "item_id"))
    assert np.array_equal(items.is_ad[index], _column(small, "is_ad"))
    assert np.array_equal(items.category[index], _column(small, "item_category"))
    advertiser = small.events["advertiser_id"]
    is_ad = _column(small, "is_ad")
    assert np.array_equal(advertiser.is_null().to_numpy(zero_copy_only=False), ~is_ad)
    assert np.array_equal(
        advertiser.to_numpy(zero_copy_only=False)[is_ad].astype(np.int64), items.advertiser_id[index][is_ad]
    )


def test_every_event_type_and_some_nulls_occur(medium: GeneratedEvents) -> None:
    kinds = np.bincount(_column(medium, "event_type"), minlength=len(EVENT_TYPES))
    assert np.all(kinds > 0), dict(zip(EVENT_TYPES, kinds.tolist(), strict=True))
    assert kinds[EVENT_TYPE_CODE["impression"]] > 0.7 * kinds.sum()
    for name in ("device", "value"):
        share = medium.events[name].null_count / medium.events.num_rows
        assert 0 < share < 0.9, name
    assert 0 < medium.events["device"].null_count / medium.events.num_rows < 0.05


def test_activity_is_a_power_law(medium: GeneratedEvents) -> None:
    counts = events_per_user(medium)
    median = np.median(counts)
    assert 10 <= median <= 60  # "most users tens of events" over 14 days
    assert counts.max() > 100 * median
    top = np.sort(counts)[::-1][: len(counts) // 100]
    assert top.sum() > 0.15 * counts.sum()  # the top 1% of users make a large share of the events
    per_day = counts.mean() / medium.world.config.days
    assert 0.7 * EVENTS_PER_USER_DAY < per_day < 1.3 * EVENTS_PER_USER_DAY


def test_sessions_gaps_are_seconds_within_and_hours_between(medium: GeneratedEvents) -> None:
    impressions = _column(medium, "event_type") == EVENT_TYPE_CODE["impression"]
    user, time = _column(medium, "user_id")[impressions], _column(medium, "event_time")[impressions]
    order = np.lexsort((time, user))
    same_user = user[order][1:] == user[order][:-1]
    gaps_s = np.diff(time[order])[same_user] / 1000
    assert np.mean(gaps_s < 60) > 0.7
    assert np.mean(gaps_s > 3600) > 0.03
    assert np.mean((gaps_s > 120) & (gaps_s < 600)) < 0.02  # bimodal: little in between


def test_click_rate_rises_with_affinity(medium: GeneratedEvents) -> None:
    truth = users_table(medium.world)
    interest = np.stack(truth["interest"].to_numpy(zero_copy_only=False))
    row = np.searchsorted(truth["user_id"].to_numpy(), _column(medium, "user_id"))
    affinity = interest[row, _column(medium, "item_category")]
    kind = _column(medium, "event_type")
    impressions, clicks = affinity[kind == EVENT_TYPE_CODE["impression"]], affinity[kind == EVENT_TYPE_CODE["click"]]
    edges = np.quantile(impressions, [0.2, 0.4, 0.6, 0.8])
    ctr = np.bincount(np.digitize(clicks, edges), minlength=5) / np.bincount(
        np.digitize(impressions, edges), minlength=5
    )
    assert np.all(np.diff(ctr) > 0), ctr
    assert ctr[-1] > 5 * ctr[0], ctr


def test_conversions_follow_a_click_on_the_same_item(medium: GeneratedEvents) -> None:
    kind = _column(medium, "event_type")
    user, item, time = (_column(medium, n) for n in ("user_id", "item_id", "event_time"))
    is_ad = _column(medium, "is_ad")
    conversion = np.isin(kind, [EVENT_TYPE_CODE[name] for name in CONVERSION_TYPES])
    assert 0 < conversion.sum() < 0.005 * len(kind)  # rare
    assert np.all(is_ad[conversion])
    clicks: dict[tuple[int, int], list[int]] = {}
    for u, i, t in zip(user[kind == 1], item[kind == 1], time[kind == 1], strict=True):
        clicks.setdefault((int(u), int(i)), []).append(int(t))
    delays = []
    for u, i, t in zip(user[conversion], item[conversion], time[conversion], strict=True):
        before = [c for c in clicks.get((int(u), int(i)), []) if c < t]
        assert before, f"conversion of user {u} on item {i} without an earlier click"
        delays.append(t - max(before))
    minutes = np.array(delays) / 60_000
    assert minutes.min() >= 1.0 and minutes.max() > 12 * 60  # minutes to (half) days


@pytest.mark.parametrize("bad", [{"users": 0}, {"days": 0}, {"seed": -1}, {"seed": 2**32}, {"categories": 1}])
def test_config_rejects_nonsense(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        WorldConfig(**({"users": 10, "days": 1} | bad))


def test_the_documented_world_has_a_million_events_and_a_few_power_users() -> None:
    counts = events_per_user(generate_events(WorldConfig(users=20_000, days=14, seed=7)))
    assert 0.85e6 < counts.sum() < 1.25e6
    assert 15 <= np.median(counts) <= 40
    assert 2 <= (counts > 20_000).sum() <= 10
