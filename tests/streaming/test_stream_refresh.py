"""Streaming histories hand their users to precompute: representations in a real Redis, real broker, Prism."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.store import default_redis_cluster_url, open_store
from pipelines.store.redis_store import default_redis_url
from tests.conftest import require_redis, require_redis_cluster
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import committed, generate, keyed, replay, stream_cmd

pytestmark = pytest.mark.integration


def world_with_model(tmp_path: Path) -> tuple[list[bytes], Path, Path]:
    """Events (JSON lines, a few malformed), candidate sets and an untrained tiny model."""
    import torch

    from pipelines.model import GemConfig, GemModel, save_checkpoint

    candidates = tmp_path / "candidates.parquet"
    lines = generate(tmp_path, 80, 31, "--candidates-output", str(candidates), "--requests", "60")
    torch.manual_seed(0)
    config = GemConfig(d_model=16, num_heads=2, num_layers=2, max_len=48, block_size=16, representation_dim=8)
    save_checkpoint(GemModel(config), tmp_path / "model")
    return lines, candidates, tmp_path / "model"


def _user_rows(store_uri: str, users: list[int]) -> dict[str, np.ndarray]:
    with open_store(store_uri) as store:
        got = store.read_batch([(u, None) for u in users])
    return {"found": got.found, "embedding": got.embedding, "watermark": got.history_watermark_ms}


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
def test_streamed_users_get_the_batch_precompute_representation_before_their_offsets_commit(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str, backend: str
) -> None:
    base = default_redis_url() if backend == "redis" else default_redis_cluster_url()
    store = f"{base}?namespace=gem-test:{uuid.uuid4().hex}:"
    if backend == "redis":
        require_redis(base)
    else:
        require_redis_cluster(store)
    lines, candidates, model = world_with_model(tmp_path)
    topic, group = make_topic(2), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out = tmp_path / "stream"
    done = subprocess.run(
        stream_cmd(
            topic,
            group,
            out,
            "--idle-exit",
            "3",
            "--model",
            str(model),
            "--store",
            store,
            "--candidates",
            str(candidates),
            "--candidate-ttl",
            "3600",
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)
    assert_store_equals_precompute(tmp_path, topic, store, candidates, model)


def assert_store_equals_precompute(tmp_path: Path, topic: str, store: str, candidates: Path, model: Path) -> pa.Table:
    """The store holds, for every user of ``topic``, the batch ``precompute`` of the replayed
    histories (user level, float16 tolerance, watermark = last event) and exactly the recent pairs;
    returns those histories."""
    # the same histories replayed in batch, then the batch precompute's user-level rows
    histories = replay(topic, tmp_path / "batch")
    batch_reps = tmp_path / "reps"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "precompute",
            "--features",
            str(tmp_path / "batch"),
            "--candidates",
            str(candidates),
            "--model",
            str(model),
            "--output",
            str(batch_reps),
            "--all-users",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    reps = pa.concat_tables(pq.read_table(f) for f in sorted((batch_reps / "representations").glob("*/*.parquet")))
    reps = reps.filter(reps.column("ad_id").is_null()).sort_by("user_id")
    users = reps.column("user_id").to_pylist()
    assert users == histories.column("user_id").to_pylist()

    streamed = _user_rows(store, users)
    assert streamed["found"].all()  # every user of the topic has a user-level representation
    want = np.asarray(reps.column("embedding").combine_chunks().flatten(), np.float32).reshape(len(users), -1)
    np.testing.assert_allclose(streamed["embedding"], want, atol=2e-3)
    # each row says which events it has seen: up to the user's last one
    assert streamed["watermark"].tolist() == histories.column("last_event_time").cast(pa.int64()).to_pylist()

    # pairs: a user whose latest candidate set is recent at their last event (request at most the TTL,
    # 3,600 s, before it) has them all; one whose set is older than the TTL before their first event, none
    latest: dict[int, dict] = {}
    for row in sorted(pq.read_table(candidates).to_pylist(), key=lambda r: r["request_time"]):
        latest[row["user_id"]] = row
    ttl = np.timedelta64(3600, "s").item()
    recent, stale = [], []
    for user, last, events in zip(
        users, histories.column("last_event_time").to_pylist(), histories.column("events").to_pylist(), strict=True
    ):
        if user in latest:
            request = latest[user]["request_time"]
            if request >= last - ttl:
                recent.append(latest[user])
            elif request < min(e["event_time"] for e in events) - ttl:
                stale.append(latest[user])
    assert recent and stale
    with open_store(store) as s:
        assert s.read_batch([(r["user_id"], a) for r in recent for a in r["ad_ids"]]).found.all()
        assert not s.read_batch([(r["user_id"], a) for r in stale for a in r["ad_ids"]]).found.any()
    return histories
