"""The streaming job's flushes: flush_shard's files and acknowledgements, the background Flusher."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.kafka.stream_flush import Flusher, flush_shard
from pipelines.kafka.stream_state import OFFSET, PARTITION, ShardStates, latest_histories
from tests.features.factories import event, events_table


def _buffered(n: int, partition: int, first_offset: int, prefix: str) -> pa.Table:
    table = events_table([event(f"{prefix}{i}", i % 3, 1_000 + i) for i in range(n)])
    table = table.append_column(PARTITION, pa.array(np.full(n, partition, np.int32)))
    return table.append_column(OFFSET, pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)))


def test_flush_shard_writes_the_histories_and_returns_the_offsets_per_partition(tmp_path: Path) -> None:
    out = str(tmp_path)
    acks = flush_shard(out, 2, [_buffered(4, 0, 10, "a"), _buffered(0, 1, 0, "x"), _buffered(3, 1, 7, "b")],
                       max_history=10)
    assert {p: o.tolist() for p, o in acks} == {0: [10, 11, 12, 13], 1: [7, 8, 9]}
    state = latest_histories(out, 2)
    assert sorted(state.column("user_id").to_pylist()) == [0, 1, 2]
    assert sum(state.column("num_events_total").to_pylist()) == 7
    assert state.equals(ShardStates().load(out, 2)[0])
    assert flush_shard(out, 2, [_buffered(0, 0, 0, "x")], max_history=10) == []  # nothing to write


def test_flusher_coalesces_requests_for_a_busy_shard_and_hands_back_acks() -> None:
    release, calls = threading.Event(), []

    def flush(shard: int) -> list[tuple[int, np.ndarray]]:
        calls.append(shard)
        release.wait(5)
        return [(shard, np.asarray([len(calls)]))]

    flusher = Flusher(flush)
    flusher.request(0)
    while not calls:  # the first flush of shard 0 is running
        threading.Event().wait(0.01)
    for _ in range(3):
        flusher.request(0)  # queued once: the next flush takes everything buffered by then
    flusher.request(1)
    release.set()
    acks = flusher.wait()
    assert calls == [0, 0, 1]
    assert [(s, o.tolist()) for s, o in acks] == [(0, [1]), (0, [2]), (1, [3])]
    assert flusher.finished() == []


def test_a_failed_flush_fails_the_next_call_once() -> None:
    def flush(shard: int) -> list[tuple[int, np.ndarray]]:
        if shard == 1:
            raise OSError("disk full")
        return [(shard, np.asarray([5]))]

    flusher = Flusher(flush)
    flusher.request(1)
    with pytest.raises(OSError, match="disk full"):
        flusher.wait()
    flusher.request(0)
    assert [s for s, _ in flusher.wait()] == [0]
