"""The streaming job's flushes: flush_shard's files and acknowledgements, the background Coalescer."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.streaming.flush import Coalescer, ShardFlush, flush_shards
from pipelines.streaming.refresh import RefreshQueue
from pipelines.streaming.state import OFFSET, PARTITION, ShardStates, latest_histories, newest_rows
from tests.features.factories import event, events_table


def _buffered(n: int, partition: int, first_offset: int, prefix: str) -> pa.Table:
    table = events_table([event(f"{prefix}{i}", i % 11, 1_000 + i) for i in range(n)])
    table = table.append_column(PARTITION, pa.array(np.full(n, partition, np.int32)))
    return table.append_column(OFFSET, pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)))


def test_flush_shards_writes_each_shard_and_returns_the_offsets_per_partition(tmp_path: Path) -> None:
    from pipelines.io.shards import split_by_shard
    from pipelines.streaming.state import merge_shard

    out, num_shards = str(tmp_path), 4
    buffered = pa.concat_tables([_buffered(40, 0, 10, "a"), _buffered(0, 1, 0, "x"), _buffered(30, 1, 7, "b")])
    by_shard = {s: [t] for s, t in split_by_shard(buffered, num_shards)}
    assert len(by_shard) > 1
    done = flush_shards(out, by_shard, num_shards=num_shards, max_history=10)
    assert {p: sorted(o.tolist()) for p, o in done.acks} == {0: list(range(10, 50)), 1: list(range(7, 37))}
    for s, tables in by_shard.items():  # each shard alone would have built the same histories
        alone = merge_shard(pa.concat_tables(tables), None, max_history=10).state
        assert latest_histories(out, s).drop_columns(["watermark"]).equals(alone.drop_columns(["watermark"]))
        assert latest_histories(out, s).equals(ShardStates().load(out, s)[0])
    assert latest_histories(out).num_rows == buffered.group_by("user_id").aggregate([]).num_rows
    assert sorted(done.histories.column("user_id").to_pylist()) == sorted(set(buffered.column("user_id").to_pylist()))
    before = latest_histories(out).drop_columns(["watermark"])
    again = flush_shards(out, by_shard, num_shards=num_shards, max_history=10)  # a replay: all duplicates
    assert sorted(again.histories.column("user_id").to_pylist()) == sorted(done.histories.column("user_id").to_pylist())
    assert latest_histories(out).drop_columns(["watermark"]).equals(before)
    empty = flush_shards(out, {0: [_buffered(0, 0, 0, "x")]}, num_shards=num_shards, max_history=10)
    assert empty.acks == [] and empty.histories.num_rows == 0


def test_flusher_coalesces_requests_while_busy_and_hands_back_acks() -> None:
    release, calls = threading.Event(), []

    def flush(shards: list[int]) -> list[tuple[int, np.ndarray]]:
        calls.append(shards)
        release.wait(5)
        return [(s, np.asarray([len(calls)])) for s in shards]

    flusher = Coalescer(flush, "flush")
    flusher.request(0)
    while not calls:  # the first flush (shard 0) is running
        threading.Event().wait(0.01)
    for shard in (0, 2, 0, 1):
        flusher.request(shard)  # all wait for one flush, which takes everything buffered by then
    release.set()
    acks = flusher.wait()
    assert calls == [[0], [0, 1, 2]]
    assert [(s, o.tolist()) for s, o in acks] == [(0, [1]), (0, [2]), (1, [2]), (2, [2])]
    assert flusher.finished() == []


def test_a_failed_flush_fails_the_next_call_once() -> None:
    def flush(shards: list[int]) -> list[tuple[int, np.ndarray]]:
        if 1 in shards:
            raise OSError("disk full")
        return [(s, np.asarray([5])) for s in shards]

    flusher = Coalescer(flush, "flush")
    flusher.request(1)
    with pytest.raises(OSError, match="disk full"):
        flusher.wait()
    flusher.request(0)
    assert [s for s, _ in flusher.wait()] == [0]


def _flushed(users: list[int], events: int, partition: int, offset: int) -> ShardFlush:
    """A flush that touched ``users``, each now holding ``events`` events (HISTORY rows)."""
    from tests.model.factories import T0, event, histories_table

    histories = histories_table({u: [event(i, T0 + i) for i in range(events)] for u in users})
    return ShardFlush([(partition, np.asarray([offset]))], histories)


def _users_and_sizes(histories: pa.Table) -> list[tuple[int, int]]:
    return list(
        zip(histories.column("user_id").to_pylist(), histories.column("num_events_total").to_pylist(), strict=True)
    )


def test_newest_rows_keeps_each_users_row_from_the_latest_flush() -> None:
    first, second = _flushed([3, 1], 1, 0, 0).histories, _flushed([1, 2], 2, 0, 1).histories
    assert _users_and_sizes(newest_rows([first, second])) == [(1, 2), (2, 2), (3, 1)]


def test_refresh_queue_hands_acks_back_only_after_the_refresh_and_takes_a_backlog_at_once() -> None:
    release, refreshed = threading.Event(), []

    def refresh(histories: pa.Table) -> None:
        refreshed.append(sorted(histories.column("user_id").to_pylist()))
        release.wait(5)

    queue = RefreshQueue(refresh)
    queue.submit(_flushed([1], 1, 0, 10))
    while not refreshed:  # the first refresh is running: nothing acknowledged yet
        threading.Event().wait(0.01)
    assert queue.finished() == []
    queue.submit(_flushed([2, 1], 2, 1, 20))
    queue.submit(_flushed([3], 1, 0, 11))
    queue.submit(ShardFlush([], _flushed([], 0, 0, 0).histories))  # nothing to acknowledge
    release.set()
    acks = queue.wait()
    assert refreshed == [[1], [1, 2, 3]]  # the two waiting flushes in one refresh, each user once
    assert sorted((p, o.tolist()) for p, o in acks) == [(0, [10]), (0, [11]), (1, [20])]


def test_a_failed_refresh_fails_the_next_call_and_never_acknowledges() -> None:
    def refresh(histories: pa.Table) -> None:
        raise ConnectionError("store down")

    queue = RefreshQueue(refresh)
    queue.submit(_flushed([1], 1, 0, 10))
    with pytest.raises(ConnectionError, match="store down"):
        queue.wait()
    assert queue.finished() == []


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"model": "m"}, "--store"),
        ({"store": "lmdb:///tmp/s"}, "--model"),
        ({"candidates": ("c.parquet",)}, "--candidates"),
        ({"model": "m", "store": "lmdb:///tmp/s", "candidate_ttl_s": 0}, "--candidate-ttl"),
        ({"model": "m", "store": "lmdb:///tmp/s", "torch_threads": 0}, "--torch-threads"),
        ({"model": "m", "store": "lmdb:///tmp/s", "device": "tpu"}, "--device"),
        ({"broker_timeout_s": 0}, "--broker-timeout"),
    ],
)
def test_a_bad_refresh_setting_names_its_flag(changes: dict, flag: str) -> None:
    from pipelines.errors import ConfigError
    from pipelines.streaming.job import StreamConfig

    with pytest.raises(ConfigError, match=flag):
        StreamConfig(topic="t", output="o", group="g", **changes)
    assert StreamConfig(topic="t", output="o", group="g", model="m", store="lmdb:///tmp/s").refresh
