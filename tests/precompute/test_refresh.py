"""The streaming job's precompute step (pure): token chunks, recent candidate sets, refreshed rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.durations import DAY_MS
from pipelines.model.checkpoint import load_model
from pipelines.model.inputs import HistoryIndex, build_user_batch
from pipelines.precompute.records import representation_table
from pipelines.precompute.refresh import RecentCandidates, Refresher, token_chunks
from pipelines.schemas.layouts import CANDIDATES
from tests.precompute.conftest import World


def _candidates(rows: list[tuple[str, int, int, list[int]]]) -> pa.Table:
    names = ["request_id", "user_id", "request_time", "ad_ids"]
    table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
    return pa.table(
        {
            "request_id": table["request_id"],
            "user_id": table["user_id"],
            "surface": pa.array([0] * len(rows), pa.int8()),
            "request_time": table["request_time"],
            "ad_ids": table["ad_ids"],
        }
    ).cast(CANDIDATES.schema)


def test_token_chunks_cover_every_row_in_order_within_the_budget(world: World) -> None:
    batch = build_user_batch(world.histories, max_len=48)
    chunks = list(token_chunks(batch, 200))
    assert len(chunks) > 1
    assert np.concatenate([c.user_id.numpy() for c in chunks]).tolist() == batch.user_id.numpy().tolist()
    assert all(c.num_tokens <= 200 or c.num_rows == 1 for c in chunks)
    assert [c.num_rows for c in token_chunks(batch, 1)] == [1] * batch.num_rows  # a row over the budget goes alone
    assert list(token_chunks(batch.select(np.zeros(0, np.int64)), 10)) == []


def test_recent_candidates_keep_each_users_latest_valid_request() -> None:
    table = _candidates(
        [
            ("a", 1, 10 * DAY_MS, [7]),
            ("b", 1, 12 * DAY_MS, [8, 9]),
            ("c", 2, 5 * DAY_MS, [4]),
            ("bad", 2, 20 * DAY_MS, []),
            ("d", 3, 11 * DAY_MS, [5]),
        ]
    )
    recent = RecentCandidates.from_table(table, ttl_s=86_400)
    assert recent.latest.column("request_id").to_pylist() == ["b", "c", "d"]  # the empty "bad" set is dropped
    last_event = np.array([12 * DAY_MS + 5, 7 * DAY_MS, 11 * DAY_MS - 1, 12 * DAY_MS])
    rows = recent.for_users(np.array([1, 2, 3, 4]), last_event)
    # user 2's set is two days older than their last event; user 4 has none
    assert rows.column("request_id").to_pylist() == ["b", "d"]
    # the request moves to just after the user's last event, never before the request itself
    assert rows.column("request_time").cast(pa.int64()).to_pylist() == [12 * DAY_MS + 6, 11 * DAY_MS]


def test_refresh_gives_the_batch_precompute_user_rows_and_each_users_own_watermark(world: World) -> None:
    model = load_model(world.model, device="cpu")
    histories = world.histories
    refreshed = Refresher(model, model.model_version, token_budget=300).refresh(histories, computed_at_ms=123)
    batch = build_user_batch(HistoryIndex(histories), max_len=model.config.max_len)
    expected = representation_table(
        model.represent(batch), model_version=model.model_version, watermark_ms=0, computed_at_ms=123
    )
    assert refreshed.column("user_id").to_pylist() == expected.column("user_id").to_pylist()
    assert refreshed.column("ad_id").null_count == refreshed.num_rows
    got = np.asarray(refreshed.column("embedding").combine_chunks().flatten(), np.float32)
    want = np.asarray(expected.column("embedding").combine_chunks().flatten(), np.float32)
    np.testing.assert_allclose(got, want, atol=2e-3)
    assert refreshed.column("history_watermark").equals(
        histories.column("last_event_time").cast(refreshed.schema.field("history_watermark").type)
    )


def test_refresh_adds_pairs_for_users_with_a_recent_candidate_set(world: World) -> None:
    model = load_model(world.model, device="cpu")
    histories = world.histories.slice(0, 20)
    users = histories.column("user_id").to_pylist()
    last = histories.column("last_event_time").cast(pa.int64()).to_pylist()
    candidates = _candidates(
        [
            ("r0", users[0], last[0] - 1000, [2_000_000_001, 2_000_000_002]),
            ("r1", users[1], last[1] - 3 * DAY_MS, [2_000_000_003]),
        ]
    )
    recent = RecentCandidates.from_table(candidates, ttl_s=86_400)
    refreshed = Refresher(model, model.model_version, candidates=recent).refresh(histories, computed_at_ms=1)
    pairs = refreshed.filter(refreshed.column("ad_id").is_valid())
    assert sorted(zip(pairs.column("user_id").to_pylist(), pairs.column("ad_id").to_pylist(), strict=True)) == [
        (users[0], 2_000_000_001),
        (users[0], 2_000_000_002),
    ]
    assert refreshed.num_rows == 20 + 2


def test_refresher_rejects_a_bad_budget(world: World) -> None:
    model = load_model(world.model, device="cpu")
    with pytest.raises(ValueError, match="token_budget"):
        Refresher(model, "v", token_budget=0)


def _assert_batches(elements: list, kwargs: dict, name: int) -> None:
    """Beam's BatchElements, with a handler's ``batch_elements_kwargs``, makes no empty batch of
    ``elements`` and keeps each (``element[name]`` tells them apart) once."""
    import apache_beam as beam
    from apache_beam.testing.util import BeamAssertException, assert_that

    def check(batches: list[list]) -> None:
        if not all(batches) or sorted(e[name] for b in batches for e in b) != sorted(e[name] for e in elements):
            raise BeamAssertException(f"batches of sizes {[len(b) for b in batches]}")

    with beam.Pipeline("DirectRunner") as p:
        batches = p | beam.Create(elements, reshuffle=False) | beam.BatchElements(**kwargs)
        assert_that(batches, check)


def test_no_batch_is_empty_when_an_element_outweighs_the_target(world: World) -> None:
    """``BatchElements`` emits an empty batch before an element heavier than its target that comes
    first in a bundle (an empty batch fails ``KeyedModelHandler``): both handlers cap an element's
    weight at the target."""
    from pipelines.precompute.handler import GemModelHandler
    from pipelines.streaming.config import StreamConfig
    from pipelines.streaming.refresh import BATCH_ROWS, RefreshModelHandler

    batch = build_user_batch(HistoryIndex(world.histories), max_len=48)
    heavy = (0, batch)  # every user's history in one element: over a 64-token budget
    precompute = GemModelHandler(str(world.model), token_budget=64).batch_elements_kwargs()
    _assert_batches([heavy, (1, batch.select(np.arange(1))), (2, batch.select(np.arange(1)))], dict(precompute), name=0)

    big = pa.concat_tables([world.histories] * (BATCH_ROWS // world.histories.num_rows + 1))
    assert big.num_rows > BATCH_ROWS
    flushed = [(big, "b"), (world.histories.slice(0, 3), "a"), (world.histories.slice(0, 0), "c")]
    config = StreamConfig(topic="t", group="g", output=str(world.root / "s"), model=str(world.model), store="lmdb:///x")
    _assert_batches(flushed, dict(RefreshModelHandler(config).batch_elements_kwargs()), name=1)


class _Recorder:
    """A stand-in for the loaded refresh (what RunInference's ``load_model`` gives): records calls."""

    model_version = "v-test"

    def __init__(self) -> None:
        self.calls: list[pa.Table] = []

    def refresh(self, histories: pa.Table) -> None:
        self.calls.append(histories)


def test_the_stream_handler_refreshes_a_batch_once_and_gives_every_elements_acks_back(world: World) -> None:
    from pipelines.streaming.config import StreamConfig
    from pipelines.streaming.refresh import RefreshModelHandler

    config = StreamConfig(topic="t", group="g", output=str(world.root / "s"), model=str(world.model), store="lmdb:///x")
    handler, loaded = RefreshModelHandler(config), _Recorder()
    h = world.histories
    batch = [(h.slice(0, 2), ["acks-1"]), (h.slice(0, 0), ["tick"]), (h.slice(2, 3), ["acks-2"])]
    results = list(handler.run_inference(batch, loaded))  # type: ignore[arg-type]
    assert [r.example for r in results] == [acks for _, acks in batch]  # in order, the empty one's too
    assert len(loaded.calls) == 1 and loaded.calls[0].num_rows == 5
    assert loaded.calls[0].column("user_id").to_pylist() == h.slice(0, 5).column("user_id").to_pylist()
    assert list(handler.run_inference([(h.slice(0, 0), [])], loaded)) and len(loaded.calls) == 1  # type: ignore[arg-type]
