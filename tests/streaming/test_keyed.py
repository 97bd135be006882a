"""The per-user keyed step's pure parts: cutting a batch by user, the flush slots, and the first sight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pipelines.streaming.keyed import FirstSight, flush_slot, split_by_user
from pipelines.streaming.state import flush_path, merge_shard, write_flush
from tests.features.factories import event, events_table


def test_split_by_user_gives_each_user_its_rows_in_order() -> None:
    table = pa.table({"user_id": [3, 1, 3, 2, 1], "i": [0, 1, 2, 3, 4]})
    parts = split_by_user(table)
    assert [u for u, _ in parts] == [1, 2, 3]
    assert {u: t.column("i").to_pylist() for u, t in parts} == {1: [1, 4], 2: [3], 3: [0, 2]}
    assert split_by_user(table.slice(0, 0)) == []


def test_flush_slots_are_aligned_and_every_stamp_flushes_within_one_interval() -> None:
    second = 1_000_000
    assert flush_slot(0, 0.25) == (0, 250_000)
    assert flush_slot(249_999, 0.25) == (0, 250_000)
    assert flush_slot(250_000, 0.25) == (1, 500_000)  # a stamp on a boundary opens the next slot
    assert flush_slot(1_700_000_000 * second + 1, 1.0) == (1_700_000_000, 1_700_000_001 * second)
    stamps = np.random.default_rng(3).integers(0, 10**12, 1000)
    for stamp in stamps.tolist():
        slot = flush_slot(stamp, 0.3)
        assert stamp < slot.end_micros <= stamp + 300_000
        assert flush_slot(slot.end_micros - 1, 0.3) == slot  # every stamp of a slot shares its timer


def _two_flushes(tmp_path: Path) -> str:
    """Shard 0 of an output with two flush files: user 7 in both (2 events in all), user 8 in the first."""
    out = str(tmp_path)
    first = merge_shard(events_table([event("a", 7, 100), event("b", 8, 100)]), None, max_history=5)
    write_flush(first.changed, flush_path(out, 0, 1))
    later = merge_shard(events_table([event("c", 7, 200)]), first.state, max_history=5)
    write_flush(later.changed, flush_path(out, 0, 2))
    return out


def test_first_sight_reads_the_users_newest_row_and_keeps_few_shards(tmp_path: Path) -> None:
    out = _two_flushes(tmp_path)
    sight = FirstSight(max_shards=1)
    row = sight.row_of(out, 0, 7)
    assert row.num_rows == 1 and len(row.column("events")[0]) == 2
    assert sight.row_of(out, 0, 99).num_rows == 0  # a user the files never held
    assert sight.row_of(out, 1, 7).num_rows == 0  # another shard: the first one leaves the cache
    assert len(sight._shards) == 1 and np.all([k[1] == 1 for k in sight._shards])


class _UnreadableState:
    """A user's bag that fails the test if read: the keyed step must answer late sets without it."""

    def read(self) -> list:
        raise AssertionError("the state was read")


def test_sets_all_past_their_deadline_skip_the_state_read(tmp_path: Path) -> None:
    import time

    from pipelines.streaming.config import StreamConfig
    from pipelines.streaming.keyed import AppendUserHistoryFn
    from tests.streaming.test_stream_pairs import candidate_sets

    config = StreamConfig(topic="t", output=str(tmp_path), group="g")
    step = AppendUserHistoryFn(config)
    now = int(time.time() * 1000)
    late = candidate_sets([("a", 7, "early", now - 5_000, now - 1_000, [1])])
    assert step._row_for(7, late, _UnreadableState()).num_rows == 0
    live = candidate_sets([("a", 7, "early", now - 5_000, now - 1_000, [1]), ("b", 7, "early", now, now + 60_000, [2])])
    with pytest.raises(AssertionError, match="was read"):  # one set in time: its user's state is read
        step._row_for(7, live, _UnreadableState())


class _Bag:
    """A user's bag in memory, as the runner keeps it: read, add, clear."""

    def __init__(self) -> None:
        self.items: list = []

    def read(self) -> list:
        return list(self.items)

    def add(self, item: object) -> None:
        self.items.append(item)

    def clear(self) -> None:
        self.items = []


class _Timer:
    def __init__(self) -> None:
        self.set_at: list[int] = []

    def set(self, at: object, dynamic_timer_tag: str = "") -> None:
        self.set_at.append(at.micros)  # type: ignore[attr-defined]


def _arrivals(user: int, batches: list[list[tuple[str, int]]]) -> list[pa.Table]:
    """Each batch of (event_id, t) as the reader emits it: one user's EVENT rows with their offsets."""
    from pipelines.streaming.state import OFFSET, PARTITION

    out, offset = [], 0
    for batch in batches:
        table = events_table([event(e, user, t) for e, t in batch])
        offsets = np.arange(offset, offset + len(batch), dtype=np.int64)
        offset += len(batch)
        table = table.append_column(PARTITION, pa.array(np.zeros(len(batch), np.int32)))
        out.append(table.append_column(OFFSET, pa.array(offsets)))
    return out


def test_flush_on_arrival_merges_each_batch_at_once_and_equals_the_timer_flush(tmp_path: Path) -> None:
    from pipelines.streaming.config import StreamConfig
    from pipelines.streaming.keyed import ROW, AppendUserHistoryFn

    batches = _arrivals(7, [[("a", 300), ("b", 100)], [("c", 200), ("a", 300)], [("d", 50)]])  # late, duplicate
    now = AppendUserHistoryFn(StreamConfig(topic="t", output=str(tmp_path), group="g", flush_interval_s=0))
    bag, timer, flushed = _Bag(), _Timer(), []
    for table in batches:
        out: list = list(now.process((7, table), stamp=1_000, state=bag, reps=None, flush=timer))
        assert len(out) == 1 and [kind for kind, _ in bag.items] == [ROW]  # merged now: nothing buffered
        flushed.append(out[0])
    assert timer.set_at == []
    assert [acks[0][1].tolist() for _, acks in flushed] == [[0, 1], [2, 3], [4]]  # each batch acknowledged
    ids = [e["event_id"] for e in flushed[-1][0].column("events")[0].as_py()]
    assert ids == ["d", "b", "c", "a"]  # late events in their place, the redelivered "a" once

    later = AppendUserHistoryFn(StreamConfig(topic="t", output=str(tmp_path), group="g", flush_interval_s=1))
    bag2, timer2 = _Bag(), _Timer()
    for table in batches:
        assert list(later.process((7, table), stamp=1_000, state=bag2, reps=None, flush=timer2)) == []
    assert len(timer2.set_at) == 3
    (row, acks), *_ = list(later.on_flush(user=7, state=bag2, reps=None))  # type: ignore[misc]
    assert row.equals(flushed[-1][0]) and acks[0][1].tolist() == [0, 1, 2, 3, 4]


def test_a_zero_flush_interval_is_accepted_and_a_negative_one_refused(tmp_path: Path) -> None:
    from pipelines.errors import ConfigError
    from pipelines.streaming.config import StreamConfig

    assert StreamConfig(topic="t", output=str(tmp_path), group="g", flush_interval_s=0).flush_on_arrival
    assert not StreamConfig(topic="t", output=str(tmp_path), group="g").flush_on_arrival
    for bad in (-1.0, 0.001, 4000.0):
        with pytest.raises(ConfigError, match="--flush-interval"):
            StreamConfig(topic="t", output=str(tmp_path), group="g", flush_interval_s=bad)


def test_first_sight_reads_a_big_shard_per_user_and_never_loads_it_whole(tmp_path: Path) -> None:
    out = _two_flushes(tmp_path)

    def refuse(output: str, shard: int) -> Any:
        raise AssertionError("a big shard was loaded whole")

    small = FirstSight()
    big = FirstSight(load=refuse, whole_bytes=0)  # every shard counts as big
    for user in (7, 8, 99):
        assert big.row_of(out, 0, user).equals(small.row_of(out, 0, user))
    assert len(big.row_of(out, 0, 7).column("events")[0]) == 2
    assert not big._shards and len(small._shards) == 1
