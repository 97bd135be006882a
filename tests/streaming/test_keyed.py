"""The per-user keyed step's pure parts: cutting a batch by user, the flush slots, and the first-sight cache."""

from __future__ import annotations

from pathlib import Path

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


def test_first_sight_reads_the_users_newest_row_and_keeps_few_shards(tmp_path: Path) -> None:
    out = str(tmp_path)
    first = merge_shard(events_table([event("a", 7, 100), event("b", 8, 100)]), None, max_history=5)
    write_flush(first.changed, flush_path(out, 0, 1))
    later = merge_shard(events_table([event("c", 7, 200)]), first.state, max_history=5)
    write_flush(later.changed, flush_path(out, 0, 2))
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
