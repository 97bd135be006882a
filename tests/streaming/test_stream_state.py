"""Pure streaming state: the offset ledger, shard merges, flush files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.features.histories import build_histories
from pipelines.io.parquet import rows_of_user
from pipelines.schemas.layouts import HISTORY
from pipelines.streaming.state import (
    OffsetLedger,
    ShardHistories,
    ShardStates,
    compact_shard,
    flush_path,
    history_of,
    latest_histories,
    merge_shard,
    write_flush,
)
from tests.features.factories import event, events_table


@given(st.integers(0, 50), st.integers(0, 60), st.randoms(use_true_random=False), st.integers(1, 7))
def test_ledger_next_is_the_first_offset_not_yet_durable(start: int, count: int, rng, chunks: int) -> None:
    offsets = list(range(start, start + count))
    rng.shuffle(offsets)
    reported = offsets[: rng.randint(0, count)] if count else []
    ledger = OffsetLedger(start)
    for part in np.array_split(np.asarray(reported, dtype=np.int64), chunks):
        ledger.add(part)
        ledger.add(part)  # reported twice (a retried bundle): no effect
        assert ledger.next >= start
    durable = set(reported)
    expected = start
    while expected in durable:
        expected += 1
    assert ledger.next == expected
    assert set(ledger.pending.tolist()) == {o for o in durable if o > expected}


def _events(rng: np.random.Generator, n: int, prefix: str) -> pa.Table:
    return events_table(
        [
            event(
                f"{prefix}{i}",
                int(rng.integers(0, 6)),
                int(rng.integers(0, 10_000)),
                event_type=int(rng.integers(0, 3)),
            )
            for i in range(n)
        ]
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(1, 30), min_size=1, max_size=5), st.sampled_from([1, 3, 8, 1000]))
def test_flushing_in_pieces_equals_one_build(seed: int, sizes: list[int], max_history: int) -> None:
    rng = np.random.default_rng(seed)
    pieces = [_events(rng, n, f"p{k}-") for k, n in enumerate(sizes)]
    if max_history == 1000:
        # Redeliveries (same event_id) of events still in the history are dropped. (One that
        # was already evicted into the summary would count again: histories.py says so.)
        pieces.append(pieces[0].slice(0, max(1, pieces[0].num_rows // 2)))
    state = None
    for piece in pieces:
        if piece.num_rows:
            state = merge_shard(piece, state, max_history=max_history).state
    whole = build_histories(pa.concat_tables(pieces), max_history=max_history).histories
    assert state is not None
    assert state.drop_columns(["watermark"]).equals(whole.drop_columns(["watermark"]))


def test_latest_histories_keep_the_newest_row_per_user(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    first = merge_shard(_events(rng, 20, "a"), None, max_history=50)
    second = merge_shard(_events(rng, 5, "b"), first.state, max_history=50)
    write_flush(first.changed, flush_path(str(tmp_path), 3, clock_ns=1))
    write_flush(second.changed, flush_path(str(tmp_path), 3, clock_ns=2))
    assert latest_histories(str(tmp_path), 3).equals(second.state)
    assert latest_histories(str(tmp_path)).equals(second.state)
    assert latest_histories(str(tmp_path), 4).num_rows == 0
    assert not list(tmp_path.rglob(".*.tmp"))


def test_a_full_file_starts_the_state_and_older_files_are_ignored(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    first = merge_shard(_events(rng, 20, "a"), None, max_history=50)
    write_flush(first.changed, flush_path(str(tmp_path), 0, clock_ns=1))
    second = merge_shard(_events(rng, 20, "b"), first.state, max_history=50)
    write_flush(second.state, flush_path(str(tmp_path), 0, clock_ns=2, full=True))
    third = merge_shard(_events(rng, 3, "c"), second.state, max_history=50)
    write_flush(third.changed, flush_path(str(tmp_path), 0, clock_ns=3))
    # A stale flush file older than the full one must not win over it.
    write_flush(first.changed, flush_path(str(tmp_path), 0, clock_ns=0))
    assert latest_histories(str(tmp_path), 0).equals(third.state)


def test_cached_shard_state_follows_the_files_whoever_writes_them(tmp_path: Path) -> None:
    out, rng = str(tmp_path), np.random.default_rng(3)
    states, other = ShardStates(), ShardStates()  # this job, and a second writer (another process)
    state, files = states.load(out, 0)
    assert (state.num_rows, files) == (0, 0)
    clock = iter(range(1, 100))
    for k, (writer, full) in enumerate(
        [
            (states, False),
            (states, False),
            (other, False),
            (states, True),
            (states, False),
            (other, True),
            (states, False),
        ]
    ):
        state, _ = writer.load(out, 0)
        merged = merge_shard(_events(rng, 15, f"w{k}-"), state, max_history=40)
        path = write_flush(merged.state if full else merged.changed, flush_path(out, 0, next(clock), full=full))
        writer.wrote(out, 0, path, merged.state, full=full)
        for reader in (states, other):
            assert reader.load(out, 0)[0].equals(latest_histories(out, 0))
        assert latest_histories(out, 0).equals(merged.state)
    # A file named before the newest one the cache knows (a late writer) is not missed either.
    late = merge_shard(_events(rng, 5, "late-"), None, max_history=40)
    write_flush(late.changed, flush_path(out, 0, 50))
    write_flush(late.changed, flush_path(out, 0, 0))
    assert states.load(out, 0)[0].equals(latest_histories(out, 0))
    assert states.load(out, 0)[1] == 3  # the last full file (stamp 6), then stamps 7 and 50; 0 is before it


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_shard_histories_hold_each_users_newest_row_through_compactions(seed: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(seed)
    histories, reference = ShardHistories(), HISTORY.schema.empty_table()
    for k, n in enumerate(sizes):  # every flush's changed rows, as the stream adds them
        merged = merge_shard(_events(rng, n, f"f{k}-"), reference, max_history=20)
        histories.add(merged.changed)
        reference = merged.state
        assert histories.table().equals(reference)
        assert histories.num_users == reference.num_rows
    asked = np.asarray([5, 0, 3, 99], np.int64)  # 99 is nobody: left out
    wanted = reference.filter(pc.is_in(reference["user_id"], value_set=pa.array(asked)))
    assert histories.rows_of(asked).equals(wanted)
    assert histories.rows_of([]).num_rows == 0


def test_path_lock_serialises_threads(tmp_path: Path) -> None:
    import threading
    import time

    from pipelines.streaming.state import path_lock

    inside, overlaps = [0], [0]

    def work() -> None:
        for _ in range(20):
            with path_lock(tmp_path / "shard"):
                inside[0] += 1
                overlaps[0] = max(overlaps[0], inside[0])
                time.sleep(0.001)
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps[0] == 1


def test_one_users_row_read_from_the_files_equals_the_whole_shard_read(tmp_path: Path, monkeypatch) -> None:
    """Flush files, a merged one and a user absent from the shard: ``history_of`` equals the row of
    ``latest_histories``, and a merged file (sorted by user) is read one row group at a time."""
    out, rng = str(tmp_path), np.random.default_rng(4)
    events = events_table(
        [event(f"e{i}", int(u), int(rng.integers(0, 10_000))) for i, u in enumerate(rng.integers(0, 600, 3_000))]
    )
    state = None
    for k, piece in enumerate(np.array_split(np.arange(events.num_rows), 6)):
        merged = merge_shard(events.take(pa.array(piece)), state, max_history=20)
        write_flush(merged.changed, flush_path(out, 0, clock_ns=k + 1))
        state = merged.state
    compact_shard(out, 0, fanout=4)  # the first four files become one sorted file
    whole = latest_histories(out, 0)
    assert whole.equals(state)
    for user in [0, 1, 299, 599, *rng.integers(0, 600, 20).tolist()]:
        expected = whole.filter(pc.equal(whole.column("user_id"), user))
        assert history_of(out, 0, user).equals(expected)
    assert history_of(out, 0, 10_000).num_rows == 0

    groups_read: list[list[int]] = []
    read = pq.ParquetFile.read_row_groups

    def counted(parquet: pq.ParquetFile, groups: list[int], *args: Any, **kwargs: Any) -> pa.Table:
        groups_read.append(groups)
        return read(parquet, groups)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counted)
    merged_file = next(p for p in (tmp_path / "histories").rglob("*.parquet") if "-t" in p.name)
    assert pq.ParquetFile(merged_file).metadata.num_row_groups > 2
    rows_of_user(str(merged_file), 300, HISTORY)
    assert groups_read == [[groups_read[0][0]]]  # one row group of the sorted file
