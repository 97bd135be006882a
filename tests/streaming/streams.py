"""Helpers of the streaming tests (Prism and Flink): generated events, the stream and replay
commands as subprocesses, committed offsets, and the comparison of histories."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io.kafka.config import KafkaConnection
from tests.fixtures.kafka import BOOTSTRAP, produce


def generate(tmp_path: Path, users: int, seed: int, *extra: str) -> list[bytes]:
    """Two days of ``users``' events as JSON lines (a few malformed, some redelivered); ``extra``
    flags go to ``generate`` as they are (e.g. ``--candidates-output PATH``)."""
    events = tmp_path / f"events-{seed}.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "generate",
            "--users",
            str(users),
            "--days",
            "2",
            "--seed",
            str(seed),
            "--output",
            str(events),
            "--bad-fraction",
            "0.01",
            "--duplicate-fraction",
            "0.03",
            *extra,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return [raw for raw in events.read_bytes().splitlines() if raw.strip()]


def skewed(lines: list[bytes], hot_user: int = 999_999, share: int = 10) -> list[bytes]:
    """``lines`` with about one event in ``share`` moved to ``hot_user`` (one user with a tenth of
    the events: a Zipf-like head). Chosen by event_id, so a redelivered event moves with its first
    delivery; malformed lines stay as they are."""
    import json
    import zlib

    out = []
    for raw in lines:
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and "user_id" in obj and zlib.crc32(str(obj.get("event_id")).encode()) % share == 0:
            obj["user_id"] = hot_user
            raw = json.dumps(obj, separators=(",", ":")).encode()
        out.append(raw)
    return out


def keyed(lines: list[bytes]) -> list[bytes | None]:
    from pipelines.io.kafka.produce import _key_of

    return [_key_of(v) for v in lines]


def stream_cmd(
    topic: str, group: str, output: Path, *extra: str, bootstrap: str = BOOTSTRAP, command: str = "stream"
) -> list[str]:
    """``stream`` (or ``solaris``, its thin entry with candidate sets) with the tests' shards and flush interval."""
    return [
        sys.executable,
        "-m",
        "pipelines",
        command,
        "--topic",
        topic,
        "--group",
        group,
        "--output",
        str(output),
        "--num-shards",
        "4",
        "--flush-interval",
        "0.3",
        "--bootstrap-servers",
        bootstrap,
        *extra,
    ]


def replay(topic: str, output: Path, bootstrap: str = BOOTSTRAP) -> pa.Table:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "replay",
            "--topic",
            topic,
            "--output",
            str(output),
            "--num-shards",
            "4",
            "--bootstrap-servers",
            bootstrap,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    tables = [pq.read_table(f) for f in sorted((output / "histories").glob("*/*.parquet"))]
    return pa.concat_tables(tables).sort_by("user_id")


def committed(connection: KafkaConnection, topic: str, group: str, partitions: int) -> list[int | None]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**connection.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        return [consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        consumer.close()


def same_histories(streamed: pa.Table, batch: pa.Table) -> None:
    # The watermark says when a history was complete: it differs by design (a flush
    # knows the events seen so far, a batch run the whole range).
    left = streamed.drop_columns(["watermark"])
    right = batch.drop_columns(["watermark"]).cast(left.schema)
    assert left.num_rows == right.num_rows
    assert left.equals(right)


def trickle(connection: KafkaConnection, topic: str, lines: list[bytes], pause_s: float) -> threading.Thread:
    """A thread (not started) that produces ``lines`` in 10 chunks, ``pause_s`` apart: the rest of a
    topic arriving while a job runs, so that a kill lands mid-topic."""

    def run() -> None:
        for chunk in range(10):
            part = lines[chunk::10]
            produce(connection, topic, part, keys=keyed(part))
            time.sleep(pause_s)

    return threading.Thread(target=run)


def wait_for_a_commit(
    connection: KafkaConnection,
    topic: str,
    group: str,
    partitions: int,
    job: subprocess.Popen,
    log: Path,
    deadline: float,
) -> None:
    """Until the running ``job`` (its stderr in ``log``) has committed an offset of ``topic``."""
    while not any(committed(connection, topic, group, partitions)):
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the job committed nothing in time"
        time.sleep(0.2)


# -- candidate sets of the precompute tests' `world` (tests.precompute.conftest) -------------------------------


def world_funnel(requests: int, *, seed: int = 5, sizes: tuple[int, ...] = (120, 30, 8, 2)) -> pa.Table:
    """A ranking funnel of ``requests`` over the `world` fixture's world (same flags: same events), with
    ``sizes`` ads per stage (early first)."""
    from pipelines.generator import WorldConfig, generate_events, rngs
    from pipelines.generator.funnel import FunnelConfig, generate_funnel

    generated = generate_events(WorldConfig(users=300, days=5, seed=seed))
    funnel = FunnelConfig(sizes=sizes)
    return generate_funnel(generated.world, generated.events, requests, rngs(seed)["funnel"], funnel)


def retimed(sets: pa.Table, needed_in_s: float) -> pa.Table:
    """``sets`` asked for now, each needed ``needed_in_s`` from now (negative: already late)."""
    now = int(time.time() * 1000)
    stamp = pa.timestamp("ms", tz="UTC")
    sets = sets.set_column(
        sets.schema.get_field_index("stage_time"), "stage_time", pa.array([now] * sets.num_rows).cast(stamp)
    )
    needed = pa.array([now + int(needed_in_s * 1000)] * sets.num_rows).cast(stamp)
    return sets.set_column(sets.schema.get_field_index("needed_by"), "needed_by", needed)


def send_sets(kafka: KafkaConnection, topic: str, *tables: pa.Table, bad: Sequence[bytes] = ()) -> int:
    """``tables``' sets to ``topic`` as CANDIDATE_SET JSON (key = user_id), then the ``bad`` payloads
    (no key); returns how many messages."""
    from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire

    messages = [m for t in tables for m in candidate_sets_to_wire(t)]
    produce(kafka, topic, [v for _, v in messages] + list(bad), keys=[k for k, _ in messages] + [None] * len(bad))
    return len(messages) + len(bad)


def send_events(kafka: KafkaConnection, topic: str, events: Path) -> int:
    """The events Parquet file ``events`` to ``topic`` as JSON, key = user_id; returns how many."""
    from pipelines.io.kafka.encode import events_to_wire

    table = pq.read_table(events)
    produce(kafka, topic, events_to_wire(table), keys=[str(u).encode() for u in table["user_id"].to_pylist()])
    return table.num_rows
