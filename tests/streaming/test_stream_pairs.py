"""Candidate sets inside the stream graph (``stream --candidates-topic``, or ``solaris``, its thin entry):
they meet their user's keyed state, their pairs go to the store equal to batch ``precompute`` on the same
histories, late sets are dropped and counted, other stages and unreadable sets are acknowledged (the
latter as dead letters), the offsets of both topics are committed, and pairs fresh in the store are not
computed again. Real broker, Prism; the pure parts without either."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire, decode_candidate_sets
from pipelines.io.kafka.config import KafkaConnection
from pipelines.schemas.enums import FUNNEL_STAGE_CODE
from pipelines.schemas.layouts import CANDIDATE_SET, CANDIDATES
from pipelines.store import open_store
from pipelines.streaming.pairs import candidate_work, keyed_sets, newest_rows, pending_tokens, shed_count
from pipelines.streaming.user_merge import merge_user
from tests.features.factories import event, events_table
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import committed, keyed, replay, send_sets, stream_cmd
from tests.streaming.test_stream_refresh import world_with_model

_MS = pa.timestamp("ms", tz="UTC")


def candidate_sets(rows: list[tuple[str, int, str, int, int, list[int]]]) -> pa.Table:
    """CANDIDATE_SET rows from (request_id, user, stage, stage_time ms, needed_by ms, ads)."""
    columns = list(zip(*rows, strict=True))
    return pa.table(
        {
            "request_id": list(columns[0]),
            "user_id": pa.array(columns[1], pa.int64()),
            "surface": pa.array([0] * len(rows), pa.int8()),
            "stage": pa.array([FUNNEL_STAGE_CODE[s] for s in columns[2]], pa.int8()),
            "stage_time": pa.array(columns[3], pa.int64()).cast(_MS),
            "needed_by": pa.array(columns[4], pa.int64()).cast(_MS),
            "ad_ids": pa.array(columns[5], pa.list_(pa.field("item", pa.int64(), nullable=False))),
        }
    ).cast(CANDIDATE_SET.schema)


# -- the pure parts ------------------------------------------------------------------------------------------


def test_keyed_sets_keep_the_stage_key_by_user_and_acknowledge_the_rest() -> None:
    sets = candidate_sets(
        [
            ("a", 7, "early", 1, 9, [1, 2]),
            ("b", 8, "late", 1, 9, [1]),
            ("c", 7, "early", 2, 9, [3]),
            ("d", 9, "early", 3, 9, [4]),
        ]
    )
    payloads = [v for _, v in candidate_sets_to_wire(sets)]
    decoded = decode_candidate_sets([payloads[0], b"{nope", *payloads[1:]])
    keyed_tables, others, shed = keyed_sets(decoded, 3, np.arange(100, 105), "early")
    assert others.tolist() == [102]  # the late-stage set: acknowledged at once
    assert shed.num_rows == 0
    users = dict(keyed_tables)
    assert sorted(users) == [7, 9]
    work = candidate_work(users[7])
    assert [(w.request_id, w.partition, w.offset, w.ad_ids.tolist()) for w in work] == [
        ("a", 3, 100, [1, 2]),
        ("c", 3, 103, [3]),
    ]
    assert candidate_work(users[9])[0].offset == 104


def test_keyed_sets_shed_the_sets_already_past_their_deadline() -> None:
    sets = candidate_sets(
        [
            ("a", 7, "early", 1, 50, [1, 2]),
            ("b", 7, "early", 1, 200, [3]),
            ("c", 8, "late", 1, 10, [4]),
            ("d", 9, "early", 1, 99, [5, 6, 7]),
        ]
    )
    decoded = decode_candidate_sets([v for _, v in candidate_sets_to_wire(sets)])
    keyed_tables, done, shed = keyed_sets(decoded, 0, np.arange(10, 14), "early", shed_after_ms=100)
    assert done.tolist() == [10, 12, 13]  # a and d shed, c of another stage: all acknowledged at once
    assert shed_count(shed) == (2, 5)
    assert [(user, t.column("request_id").to_pylist()) for user, t in keyed_tables] == [(7, ["b"])]


def test_newest_rows_keep_each_users_latest_state_and_tokens_weigh_history_and_ads() -> None:
    first = merge_user(events_table([event("a", 7, 100)]), None, max_history=8)
    later = merge_user(events_table([event("b", 7, 200)]), first, max_history=8)
    other = merge_user(events_table([event("c", 8, 150)]), None, max_history=8)
    rows = newest_rows([later, other.slice(0, 0), first, other])
    assert rows.column("user_id").to_pylist() == [7, 8]
    assert [len(e) for e in rows.column("events").to_pylist()] == [2, 1]
    assert newest_rows([]).num_rows == 0
    sets = candidate_sets([("a", 7, "early", 1, 9, [1, 2, 3])])
    assert pending_tokens((later, sets)) == 2 + 3
    assert pending_tokens((later.slice(0, 0), sets.slice(0, 0))) == 1  # never weightless


def test_a_candidates_topic_needs_a_model_and_a_store(tmp_path: Path) -> None:
    from pipelines.errors import ConfigError
    from pipelines.streaming.config import StreamConfig

    with pytest.raises(ConfigError, match="--candidates-topic"):
        StreamConfig(topic="t", output=str(tmp_path), group="g", candidates_topic="c")
    with pytest.raises(ConfigError, match="events topic"):
        StreamConfig(topic="t", output=str(tmp_path), group="g", model="m", store="s", candidates_topic="t")
    config = StreamConfig(topic="t", output=str(tmp_path), group="g", model="m", store="s", candidates_topic="c")
    assert config.topics == ("t", "c")


# -- the graph, on Prism against the real broker ---------------------------------------------------------------


def write_catalog(histories: pa.Table, path: Path) -> Path:
    from pipelines.model.inputs import ad_catalog

    pq.write_table(ad_catalog(histories), path)
    return path


def funnel_sets(
    histories: pa.Table, now_ms: int, seed: int = 3, live_sets: int = 10
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(``live_sets`` sets in time, 3 past their deadline, 1 of a later stage) of users of ``histories``
    (a user at most once), their ads drawn from the ads those histories hold, plus two ids no history holds."""
    from pipelines.model.inputs import ad_catalog

    rng = np.random.default_rng(seed)
    ads = ad_catalog(histories).column("item_id").to_numpy()
    users = histories.column("user_id").to_numpy()
    picked = rng.choice(users, size=live_sets + 4, replace=False).tolist()

    def draw(n: int) -> list[int]:
        return [*rng.choice(ads, size=n, replace=False).tolist(), 9_000_000_001, 9_000_000_002]

    hour = 3_600_000
    live = [(f"live-{i}", u, "early", now_ms, now_ms + hour, draw(12)) for i, u in enumerate(picked[:live_sets])]
    late = [(f"late-{i}", u, "early", now_ms - 90_000, now_ms - 60_000, draw(5)) for i, u in enumerate(picked[-4:-1])]
    other = [("later-stage", picked[-1], "late", now_ms, now_ms + hour, draw(3))]
    return candidate_sets(live), candidate_sets(late), candidate_sets(other)


def batch_pairs(tmp_path: Path, features: Path, sets: pa.Table, model: Path) -> pa.Table:
    """Batch ``precompute`` of ``sets`` (each request at its stage time) on the ``features`` histories."""
    requests = pa.table(
        {
            "request_id": sets.column("request_id"),
            "user_id": sets.column("user_id"),
            "surface": sets.column("surface"),
            "request_time": sets.column("stage_time"),
            "ad_ids": sets.column("ad_ids"),
        }
    ).cast(CANDIDATES.schema)
    pq.write_table(requests, tmp_path / "requests.parquet")
    out = tmp_path / "batch-reps"
    cmd = [sys.executable, "-m", "pipelines", "precompute", "--features", str(features)]
    cmd += ["--candidates", str(tmp_path / "requests.parquet"), "--model", str(model), "--output", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    reps = pa.concat_tables(pq.read_table(f) for f in sorted((out / "representations").glob("*/*.parquet")))
    return reps.filter(reps.column("ad_id").is_valid()).sort_by([("user_id", "ascending"), ("ad_id", "ascending")])


def assert_pairs_equal_batch(store_uri: str, want: pa.Table, histories: pa.Table) -> None:
    """The store holds ``want``'s pairs (batch precompute's), within float16 tolerance, each saying it
    has seen its user's history up to the last event (batch rows carry the snapshot's watermark)."""
    keys = list(zip(want.column("user_id").to_pylist(), want.column("ad_id").to_pylist(), strict=True))
    with open_store(store_uri) as store:
        got = store.read_batch(keys)
    assert got.found.all()
    embeddings = np.asarray(want.column("embedding").combine_chunks().flatten(), np.float32).reshape(len(keys), -1)
    np.testing.assert_allclose(got.embedding, embeddings, atol=2e-3)
    last = dict(
        zip(
            histories.column("user_id").to_pylist(),
            histories.column("last_event_time").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    )
    assert got.history_watermark_ms.tolist() == [last[u] for u, _ in keys]


def pair_keys_of(sets: pa.Table) -> list[tuple[int, int]]:
    return [(u, a) for u, ads in zip(sets["user_id"].to_pylist(), sets["ad_ids"].to_pylist(), strict=True) for a in ads]


@pytest.mark.integration
def test_candidate_sets_meet_the_users_state_and_their_pairs_equal_batch_precompute(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    lines, _, model = world_with_model(tmp_path)
    topic, sets_topic, group = make_topic(2), make_topic(2), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out, store = tmp_path / "stream", f"lmdb://{tmp_path}/store"
    first = subprocess.run(
        stream_cmd(topic, group, out, "--idle-exit", "3"), capture_output=True, text=True, timeout=240
    )
    assert first.returncode == 0, first.stderr[-3000:]
    histories = replay(topic, tmp_path / "batch")  # the same events, in batch: the histories the sets meet

    live, late, other = funnel_sets(histories, int(time.time() * 1000))
    sent = send_sets(kafka, sets_topic, live, late, other, bad=[b"{not json"])
    catalog = write_catalog(histories, tmp_path / "catalog.parquet")
    extra = ["--idle-exit", "3", "--model", str(model), "--store", store, "--ad-catalog", str(catalog)]

    def solaris(candidates: str) -> None:
        cmd = stream_cmd(topic, group, out, "--candidates-topic", candidates, *extra, command="solaris")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]

    solaris(sets_topic)

    assert sum(c or 0 for c in committed(kafka, sets_topic, group, 2)) == sent  # every set, each acknowledged
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)
    assert_pairs_equal_batch(store, batch_pairs(tmp_path, tmp_path / "batch", live, model), histories)
    with open_store(store) as s:  # past their deadline, or of another stage: never computed
        assert not s.read_batch(pair_keys_of(late) + pair_keys_of(other)).found.any()
    dead = pa.concat_tables(pq.read_table(p) for p in sorted((out / "dead_letters").glob("*.parquet")))
    dead = dead.filter(pa.compute.equal(dead.column("stage"), "candidates"))
    assert dead["reason"].to_pylist() == ["bad_json"] and dead["payload"].to_pylist() == [b"{not json"]

    # the same sets once more (a new topic): every pair is fresh in the store, so none is written again
    before = computed_at(store, live)
    again_topic = make_topic(1)
    send_sets(kafka, again_topic, live)
    solaris(again_topic)
    assert committed(kafka, again_topic, group, 1) == [live.num_rows]
    np.testing.assert_array_equal(computed_at(store, live), before)


def computed_at(store_uri: str, sets: pa.Table) -> np.ndarray:
    """Each pair's ``computed_at`` (ms) in the store, in the order of ``pair_keys_of(sets)``."""
    with open_store(store_uri) as store:
        got = store.read_batch(pair_keys_of(sets))
    assert got.found.all()
    return got.computed_at_ms
