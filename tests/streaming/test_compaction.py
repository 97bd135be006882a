"""Compaction of a shard's flush files: the tiering policy, the merge (newest row wins), a crash
mid-compaction, writers and readers beside it, and a real `stream` run on Prism."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.parquet import conform, read_table
from pipelines.io.shards import once_per_user
from pipelines.schemas.layouts import HISTORY
from pipelines.streaming import state as state_module
from pipelines.streaming.state import (
    COMPACT_FANOUT,
    FlushFile,
    ShardStates,
    _uncovered,
    append_flush,
    compact_shard,
    flush_path,
    latest_histories,
    merge_shard,
    newest_rows,
    next_merge,
    write_flush,
)
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import generate, keyed, replay, same_histories, stream_cmd, wait_for_a_commit
from tests.streaming.test_stream_state import _events


def _digit_sum(n: int, base: int) -> int:
    total = 0
    while n:
        n, digit = divmod(n, base)
        total += digit
    return total


@pytest.mark.parametrize(
    ("tiers", "run"),
    [
        ([], None),
        ([0, 0, 0], None),
        ([0, 0, 0, 0], (0, 4)),
        ([1, 1, 1, 0, 0, 0, 0], (3, 7)),
        ([2, 1, 1, 1, 1, 1, 0], (1, 6)),  # a longer run (compactions skipped meanwhile) merges whole
        ([1, 0, 1, 1, 1, 0], None),  # a run is of consecutive files only
    ],
)
def test_next_merge_is_the_oldest_run_of_fanout_files_of_one_tier(tiers: list[int], run: tuple | None) -> None:
    assert next_merge(tiers, fanout=4) == run


@pytest.mark.parametrize("fanout", [2, 4])
def test_flushes_leave_a_file_count_of_the_digit_sum_of_their_number(fanout: int) -> None:
    """Merged after every flush, N flushes leave N's digits in base ``fanout`` as files: at most
    (fanout - 1) per tier, log_fanout(N) tiers, older files of higher tiers."""
    tiers: list[int] = []
    for n in range(1, 600):
        tiers.append(0)
        while (run := next_merge(tiers, fanout)) is not None:
            tiers[run[0] : run[1]] = [tiers[run[0]] + 1]
        assert len(tiers) == _digit_sum(n, fanout)
        assert tiers == sorted(tiers, reverse=True)


def _flushes(seed: int, count: int) -> list[tuple[pa.Table, pa.Table]]:
    """``count`` flushes of a shard: (the changed rows, the shard's state after it)."""
    rng, state, out = np.random.default_rng(seed), None, []
    for i in range(count):
        merged = merge_shard(_events(rng, int(rng.integers(1, 12)), f"e{i}-"), state, max_history=5)
        state = merged.state
        out.append((merged.changed, merged.state))
    return out


def test_the_merge_keeps_each_users_newest_row() -> None:
    (a, _), (b, _), (c, state) = _flushes(3, 3)
    assert newest_rows([a, b, c]).equals(state)
    assert newest_rows([newest_rows([a, b]), c]).equals(state)  # merging a run keeps its place in order


def test_a_user_flushed_twice_into_one_file_reads_as_its_last_row(tmp_path: Path) -> None:
    """A bundle that flushed a user twice writes both rows in flush order: the second is the newest,
    for the reader, the compaction and the first sight alike."""
    (a, _), (b, state) = _flushes(7, 2)
    both = pa.concat_tables([a, b, a.slice(0, 0)])
    twice = set(a.column("user_id").to_pylist()) & set(b.column("user_id").to_pylist())
    assert twice  # the seed flushes some user in both
    assert newest_rows([both]).equals(state)
    out = str(tmp_path)
    write_flush(both, flush_path(out, 0, clock_ns=1))
    assert latest_histories(out, 0).equals(state)
    write_flush(b.slice(0, 0), flush_path(out, 0, clock_ns=2))
    compact_shard(out, 0, fanout=2)
    assert latest_histories(out, 0).equals(state)


def test_a_bundles_rows_keep_their_order_unless_a_user_repeats() -> None:
    """``once_per_user`` (the history sinks' per-bundle step) copies nothing when every user is once."""
    (a, _), (b, state) = _flushes(7, 2)
    backwards = a.take(pa.array(np.arange(a.num_rows)[::-1]))
    assert a.num_rows > 1 and once_per_user([backwards], a.slice(0, 0)).equals(backwards)
    assert conform(once_per_user([a, b], a.slice(0, 0)), HISTORY).equals(state)
    assert once_per_user([a.slice(0, 0)], a.slice(0, 0)).num_rows == 0


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []

    def counted(path: str, layout: object) -> pa.Table:
        reads.append(path)
        return read_table(path, layout)  # type: ignore[arg-type]

    monkeypatch.setattr(state_module, "read_table", counted)
    return reads


def test_compacted_shards_read_like_every_flush_and_stay_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, reader, reads = str(tmp_path), ShardStates(), _count_reads(monkeypatch)
    for n, (changed, state) in enumerate(_flushes(5, 70), start=1):
        write_flush(changed, flush_path(out, 2, clock_ns=n))
        compact_shard(out, 2)
        reads.clear()
        assert reader.load(out, 2)[0].equals(state)  # a reader following the shard across merges ...
        assert len(reads) == 1, reads  # ... reads the new flush, or the merge that took it in, only
        assert latest_histories(out, 2).equals(state)
        assert len(list(tmp_path.glob("histories/shard=00002/*.parquet"))) == _digit_sum(n, COMPACT_FANOUT)


def test_a_reader_reads_the_shard_again_after_a_file_out_of_order_or_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, reader, reads = str(tmp_path), ShardStates(), _count_reads(monkeypatch)
    flushes = _flushes(9, 5)
    for n in (1, 2, 3, 5):
        write_flush(flushes[n - 1][0], flush_path(out, 0, clock_ns=n))
    assert reader.load(out, 0)[0].equals(latest_histories(out, 0))
    write_flush(flushes[3][0], flush_path(out, 0, clock_ns=4))  # stamped before the newest one read
    reads.clear()
    loaded = reader.load(out, 0)
    assert len(reads) == 5  # all again
    assert loaded == (latest_histories(out, 0), 5)
    compact_shard(out, 0)
    assert reader.load(out, 0) == (latest_histories(out, 0), 1)
    next(tmp_path.glob("histories/shard=00000/*.parquet")).unlink()  # gone, merged into nothing
    assert reader.load(out, 0) == (HISTORY.schema.empty_table(), 0)


def _file(name: str) -> FlushFile:
    parsed = FlushFile.parse(Path(name))
    assert parsed is not None
    return parsed


def test_a_file_is_covered_only_by_a_wider_range_or_a_higher_tier() -> None:
    merged = _file(f"flush-{5:020d}-aa-t1-{1:020d}-0f.parquet")
    inside = [_file(f"flush-{n:020d}-{tag}.parquet") for n, tag in [(1, "0f"), (3, "77"), (5, "aa")]]
    same_ns = _file(f"flush-{5:020d}-bb.parquet")  # another writer, same clock reading: not merged
    later, full = _file(f"flush-{9:020d}-01.parquet"), _file(f"full-{0:020d}-cc.parquet")  # a legacy base
    before_full = _file(f"flush-{0:020d}-0a.parquet")
    kept, covered = _uncovered([later, *inside, same_ns, merged, before_full, full])
    assert kept == [full, merged, same_ns, later]
    assert sorted(f.path.name for f in covered) == sorted(f.path.name for f in [*inside, before_full])


@pytest.mark.parametrize("crash_at", [("merged", 0), ("removed", 0), ("removed", COMPACT_FANOUT - 2)])
def test_a_crash_mid_compaction_reads_the_same_and_a_rerun_tidies_it(tmp_path: Path, crash_at: tuple) -> None:
    out, flushes = str(tmp_path), _flushes(7, COMPACT_FANOUT)
    for n, (changed, _) in enumerate(flushes, start=1):
        write_flush(changed, flush_path(out, 0, clock_ns=n))
    state, seen = flushes[-1][1], []

    def crash(step: str, path: Path) -> None:
        seen.append(step)
        if (step, seen.count(step) - 1) == crash_at:
            raise KeyboardInterrupt("killed")  # stands for SIGKILL: nothing after runs

    with pytest.raises(KeyboardInterrupt):
        compact_shard(out, 0, hook=crash)
    on_disk = list(tmp_path.glob("histories/shard=00000/*.parquet"))
    assert len(on_disk) > 1  # the merged file and what is left of its inputs
    assert latest_histories(out, 0).equals(state)
    assert ShardStates().load(out, 0) == (state, 1)  # readers see the merged file alone
    assert compact_shard(out, 0) == []  # the rerun merges nothing ...
    assert [p.name for p in tmp_path.glob("histories/shard=00000/*.parquet")] == [_merged(tmp_path)]  # ... but tidies
    assert latest_histories(out, 0).equals(state)


def _merged(root: Path) -> str:
    return next(p.name for p in root.glob("histories/shard=00000/*-t1-*.parquet"))


def test_writers_and_readers_beside_compactions_never_see_a_user_go_back(tmp_path: Path) -> None:
    """Two writers (disjoint users, as two workers of a keyed graph), each compacting after its flushes,
    and a reader: every read is whole, and no user's history ever shrinks between two reads."""
    out, failures, done = str(tmp_path), [], threading.Event()
    streams = [_flushes(seed, 60) for seed in (11, 12)]
    streams = [[(c.filter(_odd(c, k)), s.filter(_odd(s, k))) for c, s in flushes] for k, flushes in enumerate(streams)]

    def write(flushes: list[tuple[pa.Table, pa.Table]]) -> None:
        for changed, _ in flushes:
            if changed.num_rows:
                append_flush(changed, out, 0)
            compact_shard(out, 0)

    def read() -> None:
        newest: dict[int, int] = {}
        while not done.is_set():
            try:
                table = latest_histories(out, 0)
            except Exception as exc:
                failures.append(repr(exc))
                return
            for user, total in zip(table["user_id"].to_pylist(), table["num_events_total"].to_pylist(), strict=True):
                if total < newest.get(user, 0):
                    failures.append(f"user {user}: {newest[user]} events, then {total}")
                newest[user] = total

    writers = [threading.Thread(target=write, args=(s,)) for s in streams]
    reader = threading.Thread(target=read)
    for t in [reader, *writers]:
        t.start()
    for t in writers:
        t.join()
    done.set()
    reader.join()
    assert failures == []
    expected = pa.concat_tables([s[-1][1] for s in streams]).sort_by("user_id")
    assert latest_histories(out, 0).equals(expected.cast(HISTORY.schema))


def _odd(table: pa.Table, k: int) -> pa.Array:
    import pyarrow.compute as pc

    return pc.equal(pc.bit_wise_and(table["user_id"], 1), k)


@pytest.mark.integration
def test_a_long_stream_keeps_few_files_per_shard_and_equals_replay(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    """The topic arrives in 48 parts while the job runs (one shard, 0.05 s flushes): each part is a
    flush at least, so the shard's files are merged over and over (a tier-t file holds 4**t flushes)."""
    lines = generate(tmp_path, 120, seed=31)
    parts = [lines[i::48] for i in range(48)]
    topic, group = make_topic(2), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, parts[0], keys=keyed(parts[0]))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    cmd = stream_cmd(topic, group, out, "--idle-exit", "3", "--flush-interval", "0.05", "--num-shards", "1")
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        wait_for_a_commit(kafka, topic, group, 2, job, log, deadline=time.monotonic() + 120)
        for part in parts[1:]:
            produce(kafka, topic, part, keys=keyed(part))
            time.sleep(0.1)
        assert job.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        job.kill()
    files = [_file(str(p)) for p in (out / "histories" / "shard=00000").glob("*.parquet")]
    tiers = [f.tier for f in _uncovered(files)[0]]
    assert len(files) == len(tiers)  # nothing covered left behind
    assert max(tiers) >= 2, tiers
    assert tiers == sorted(tiers, reverse=True), tiers
    assert all(tiers.count(t) < COMPACT_FANOUT for t in set(tiers)), tiers
    same_histories(latest_histories(str(out)), replay(topic, tmp_path / "batch"))
