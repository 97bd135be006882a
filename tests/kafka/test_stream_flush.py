"""The streaming job's flushes: flush_shard's files and acknowledgements, the background Flusher."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.kafka.stream_flush import Flusher, flush_shards
from pipelines.kafka.stream_state import OFFSET, PARTITION, ShardStates, latest_histories
from tests.features.factories import event, events_table


def _buffered(n: int, partition: int, first_offset: int, prefix: str) -> pa.Table:
    table = events_table([event(f"{prefix}{i}", i % 11, 1_000 + i) for i in range(n)])
    table = table.append_column(PARTITION, pa.array(np.full(n, partition, np.int32)))
    return table.append_column(OFFSET, pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)))


def test_flush_shards_writes_each_shard_and_returns_the_offsets_per_partition(tmp_path: Path) -> None:
    from pipelines.features.sharding import split_by_shard
    from pipelines.kafka.stream_state import merge_shard

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

    flusher = Flusher(flush)
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

    flusher = Flusher(flush)
    flusher.request(1)
    with pytest.raises(OSError, match="disk full"):
        flusher.wait()
    flusher.request(0)
    assert [s for s, _ in flusher.wait()] == [0]
