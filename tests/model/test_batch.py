"""Arrow rows -> GemBatch: point-in-time prefixes, candidates, user rows, sub-batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipelines.model.inputs import (
    ExampleSet,
    GemBatch,
    HistoryIndex,
    ad_catalog,
    build_candidate_batch,
    build_example_batch,
    build_user_batch,
)
from pipelines.schemas.layouts import CANDIDATES, HISTORY
from tests.model.factories import T0, event, examples_table, histories_table, random_batch

SEC = 1000


def _world() -> pa.Table:
    return histories_table(
        {
            10: [event(i, T0 + i * SEC, item=100 + i) for i in range(10)],
            20: [event(50 + i, T0 + 2 * i * SEC, item=200 + i, is_ad=i % 2 == 0) for i in range(3)],
        },
        evicted={10: 5},
    )


def test_example_sees_exactly_the_last_max_len_events_before_it() -> None:
    examples = examples_table(
        [
            {"user_id": 10, "item_id": 1, "event_time": T0 + 5500, "history_end": 6},
            {"user_id": 20, "item_id": 2, "event_time": T0 + 1, "history_end": 1},
            {"user_id": 10, "item_id": 3, "event_time": T0 - 1, "history_end": 0},
        ]
    )
    batch = build_example_batch(_world(), examples, max_len=4)
    assert batch.lengths.tolist() == [4, 1, 0]
    assert batch.item_id.tolist() == [102, 103, 104, 105, 200]
    assert torch.all(batch.age_s > 0)  # every input event is strictly older than its example
    assert batch.age_s[:4].tolist() == pytest.approx([3.5, 2.5, 1.5, 0.5])
    assert batch.clicked is not None and batch.clicked.tolist() == [1.0, 0.0, 1.0]


def test_no_future_event_reaches_any_example_on_random_histories() -> None:
    rng = np.random.default_rng(0)
    users = {
        u: [
            event(u * 1000 + i, int(t), item=int(u * 1000 + i))
            for i, t in enumerate(np.sort(rng.integers(T0, T0 + 10**6, rng.integers(1, 40))))
        ]
        for u in range(6)
    }
    rows = []
    for u, events in users.items():
        times = np.array([e["event_time"] for e in events])
        for t in rng.integers(T0 - 10, T0 + 10**6 + 10, 5):
            rows.append({"user_id": u, "item_id": 1, "event_time": int(t), "history_end": int((times < t).sum())})
    examples = examples_table(rows)
    index = HistoryIndex(histories_table(users))
    batch = ExampleSet(index, examples).batch(max_len=8)
    event_time = {e["item_id"]: e["event_time"] for evs in users.values() for e in evs}
    for b, r in enumerate(rows):
        items = batch.item_id[batch.offsets[b] : batch.offsets[b + 1]].tolist()
        before = [e["item_id"] for e in users[r["user_id"]] if e["event_time"] < r["event_time"]]
        assert items == before[-8:]
        assert all(event_time[i] < r["event_time"] for i in items)


def test_history_end_beyond_the_snapshot_is_an_error() -> None:
    examples = examples_table([{"user_id": 20, "item_id": 2, "event_time": T0 + 9 * SEC, "history_end": 4}])
    with pytest.raises(ValueError, match="different snapshots"):
        build_example_batch(_world(), examples, max_len=8)


def test_candidates_see_events_strictly_before_the_request() -> None:
    candidates = pa.Table.from_pylist(
        [
            {"request_id": "r1", "user_id": 10, "surface": 3, "request_time": T0 + 4 * SEC, "ad_ids": [200, 999]},
            {"request_id": "r2", "user_id": 77, "surface": 0, "request_time": T0, "ad_ids": [202]},
        ],
        schema=CANDIDATES.with_metadata(),
    )
    index = HistoryIndex(_world())
    batch = build_candidate_batch(index, candidates, max_len=3, catalog=ad_catalog(index))
    assert batch.user_id.tolist() == [10, 10, 77] and batch.target_item.tolist() == [200, 999, 202]
    assert batch.lengths.tolist() == [3, 3, 0]  # the event at exactly T0 + 4s is not before the request
    assert batch.item_id[:3].tolist() == [101, 102, 103]
    assert batch.history_length.tolist() == [5 + 4, 5 + 4, 0]  # evicted + stored before
    assert batch.target_advertiser.tolist() == [7, -1, 7] and batch.target_category.tolist() == [2, -1, 2]
    assert batch.request_surface.tolist() == [3, 3, 0] and batch.device.tolist() == [-1, -1, -1]


def test_user_batch_reads_the_most_recent_events_without_a_target() -> None:
    batch = build_user_batch(_world(), max_len=4)
    assert batch.user_id.tolist() == [10, 20] and batch.lengths.tolist() == [4, 3]
    assert batch.item_id[:4].tolist() == [106, 107, 108, 109]
    assert batch.target_item.tolist() == [-1, -1]
    assert torch.all(batch.age_s > 0)


def test_select_keeps_each_rows_history() -> None:
    examples = examples_table(
        [
            {"user_id": 10, "item_id": 1, "event_time": T0 + 9500, "history_end": 10},
            {"user_id": 20, "item_id": 2, "event_time": T0 + 9 * SEC, "history_end": 3},
        ]
    )
    full = build_example_batch(_world(), examples, max_len=16)
    sub = full.select(np.array([1]))
    assert sub.item_id.tolist() == [200, 201, 202] and sub.user_id.tolist() == [20]
    assert sub.offsets.tolist() == [0, 3]


def test_count_features_cover_the_whole_prefix_and_the_evicted_events() -> None:
    from pipelines.model.inputs import COUNT_FEATURES
    from pipelines.schemas.enums import CLICK, IMPRESSION

    users = {10: [event(i, T0 + i * SEC, event_type=CLICK if i % 3 == 0 else IMPRESSION) for i in range(10)]}
    table = histories_table(users)
    summary = table.column("summary").to_pylist()
    summary[0]["event_type_counts"] = [4] + [0] * 11  # 4 evicted impressions
    table = table.set_column(2, "summary", pa.array(summary, table.schema.field("summary").type))
    examples = examples_table(
        [
            {"user_id": 10, "item_id": 1, "event_time": T0 + 7 * SEC + 500, "history_end": 8},
            {"user_id": 10, "item_id": 1, "event_time": T0 - 1, "history_end": 0},
        ]
    )
    counts = build_example_batch(table, examples, max_len=2).counts.numpy()
    named = dict(zip(COUNT_FEATURES, counts[0], strict=True))
    assert np.expm1(named["log_clicks"]) == pytest.approx(3)  # events 0, 3, 6: beyond max_len too
    assert np.expm1(named["log_impressions"]) == pytest.approx(5 + 4)
    assert np.expm1(named["log_events"]) == pytest.approx(12)
    assert np.expm1(named["log_seconds_since_last"]) == pytest.approx(0.5)
    assert not counts[1].any()  # nothing before the first event


@pytest.mark.parametrize(("start", "stop"), [(0, 7), (2, 5), (4, 4), (6, 7)])
def test_slice_is_select_of_a_contiguous_range(start: int, stop: int) -> None:
    from dataclasses import fields

    batch = random_batch([3, 0, 5, 1, 4, 2, 6], seed=4, with_labels=True)
    sliced, selected = batch.slice(start, stop), batch.select(torch.arange(start, stop))
    for f in fields(GemBatch):
        torch.testing.assert_close(getattr(sliced, f.name), getattr(selected, f.name), equal_nan=True, msg=f.name)


def test_candidates_of_a_shard_without_histories_get_empty_prefixes() -> None:
    # A small or sparse snapshot has shards with no history file: precompute then reads an empty table.
    candidates = pa.Table.from_pylist(
        [
            {"request_id": "r1", "user_id": 10, "surface": 3, "request_time": T0, "ad_ids": [200, 201]},
            {"request_id": "r2", "user_id": 11, "surface": 0, "request_time": T0, "ad_ids": [202]},
        ],
        schema=CANDIDATES.with_metadata(),
    )
    empty = build_candidate_batch(HISTORY.schema.empty_table(), candidates, max_len=3)
    elsewhere = build_candidate_batch(histories_table({99: [event(0, T0 - SEC)]}), candidates, max_len=3)
    assert empty.lengths.tolist() == elsewhere.lengths.tolist() == [0, 0, 0]
    assert empty.history_length.tolist() == elsewhere.history_length.tolist() == [0, 0, 0]
    assert empty.user_id.tolist() == [10, 10, 11] and empty.target_item.tolist() == [200, 201, 202]
