"""End to end: produce a generator file into a topic, replay it, compare with the features run on the file."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.features.pipeline import FeaturesConfig, run_features
from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.consume import open_fetcher, open_lookup
from pipelines.io.kafka.ranges import PartitionRange, Position, resolve_ranges
from pipelines.runners import pipeline_options, runner_for
from tests.fixtures.kafka import BOOTSTRAP, MakeTopic

pytestmark = pytest.mark.integration


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _file_run(events: Path, output: Path, num_shards: int = 4) -> dict:
    import argparse

    from pipelines.cli.flags import add_runner

    parser = argparse.ArgumentParser()
    add_runner(parser)
    args = parser.parse_args([])
    config = FeaturesConfig(inputs=[str(events)], output=str(output), num_shards=num_shards)
    return run_features(config, pipeline_options(args), runner_for(args))


def _messages(connection: KafkaConnection, topic: str) -> list[tuple[int, int, bytes | None, bytes]]:
    lookup = open_lookup(connection)
    try:
        ranges = resolve_ranges(lookup, topic, Position("earliest"), Position("latest"))
    finally:
        lookup.close()
    return _fetch(connection, ranges)


def _fetch(connection: KafkaConnection, ranges: list[PartitionRange]) -> list[tuple[int, int, bytes | None, bytes]]:
    fetcher = open_fetcher(connection)
    out: list[tuple[int, int, bytes | None, bytes]] = []
    try:
        for part in ranges:
            for batch in fetcher.fetch(part):
                out += [(part.partition, int(o), None, batch.payloads.get(i)) for i, o in enumerate(batch.offsets)]
    finally:
        fetcher.close()
    return out


def test_replay_equals_the_features_run_on_the_same_file(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    _cli(
        "generate",
        "--users",
        "150",
        "--days",
        "3",
        "--seed",
        "7",
        "--output",
        str(events),
        "--bad-fraction",
        "0.02",
        "--duplicate-fraction",
        "0.02",
    )
    lines = [raw for raw in events.read_bytes().splitlines() if raw.strip()]
    topic, histories_topic, dead_topic = make_topic(3), make_topic(3), make_topic(1)
    out = _cli("produce", "--input", str(events), "--topic", topic, "--no-progress", "--bootstrap-servers", BOOTSTRAP)
    assert f"produce: {len(lines):,} messages acknowledged to {topic!r} (existing, 3 partitions" in out

    replay = tmp_path / "replay"
    out = _cli(
        "replay",
        "--topic",
        topic,
        "--from",
        "earliest",
        "--to",
        "latest",
        "--output",
        str(replay),
        "--num-shards",
        "4",
        "--max-split",
        "300",
        "--to-topic",
        histories_topic,
        "--dead-letter-topic",
        dead_topic,
        "--bootstrap-servers",
        BOOTSTRAP,
    )
    from_file = _file_run(events, tmp_path / "file")
    from_kafka = json.loads((replay / "summary.json").read_text())

    # Same counts, same histories and training examples, shard by shard.
    ignore = {"inputs", "seconds", "published", "max_event_time_ms"}  # the last: each run's clock + 1d
    assert {k: v for k, v in from_kafka.items() if k not in ignore} == {
        k: v for k, v in from_file.items() if k not in ignore
    }
    assert from_kafka["records_in"] == len(lines) and from_kafka["dead_letters"] > 0
    for kind in ("histories", "training_examples"):
        shards = sorted((tmp_path / "file" / kind).glob("*/*.parquet"))
        assert len(shards) == 4
        for shard in shards:
            assert pq.read_table(replay / kind / shard.parent.name / shard.name).equals(pq.read_table(shard)), shard

    # Same dead letters, each naming the partition and offset of its message.
    dead_file = pq.read_table(tmp_path / "file" / "dead_letters" / "part-00000.parquet").to_pylist()
    dead_kafka = pq.read_table(replay / "dead_letters" / "part-00000.parquet").to_pylist()
    strip = sorted((d["reason"], d["detail"], d["payload"]) for d in dead_file)
    assert sorted((d["reason"], d["detail"], d["payload"]) for d in dead_kafka) == strip
    stored = {(p, o): v for p, o, _, v in _messages(kafka, topic)}
    for d in dead_kafka:
        partition, _, offset = d["source"].removeprefix(f"kafka:{topic}/").partition("/")
        assert stored[(int(partition), int(offset))].startswith(d["payload"])  # kept payloads are capped

    # The topics: one history per user, the dead letters with reason, source and payload.
    histories = _messages(kafka, histories_topic)
    assert len(histories) == from_kafka["histories"]
    assert f"; {len(histories)} messages to {histories_topic!r}" in out.splitlines()[-1]
    one = json.loads(histories[0][3])
    assert set(one) == {"user_id", "events", "summary", "num_events_total", "last_event_time", "watermark"}
    dead = [json.loads(v) for *_, v in _messages(kafka, dead_topic)]
    assert sorted(d["source"] for d in dead) == sorted(d["source"] for d in dead_kafka)
    assert sorted(base64.b64decode(d["payload_base64"]) for d in dead) == sorted(d["payload"] for d in dead_kafka)


def test_replay_of_a_time_range_reads_only_that_range(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path
) -> None:
    from tests.features.factories import T0, line
    from tests.fixtures.kafka import produce

    topic = make_topic(2)
    hour = 3_600_000
    for p in range(2):
        produce(
            kafka,
            topic,
            [line(event_id=f"{p}-{i}", user_id=10 + p, event_time=T0 + i * hour) for i in range(12)],
            partition=p,
            timestamps_ms=[T0 + i * hour for i in range(12)],
        )
    out = tmp_path / "range"
    _cli(
        "replay",
        "--topic",
        topic,
        "--from",
        "2026-01-01T03:00:00Z",
        "--to",
        "2026-01-01T09:00:00Z",
        "--output",
        str(out),
        "--num-shards",
        "2",
        "--bootstrap-servers",
        BOOTSTRAP,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records_in"] == 12 and summary["histories"] == 2
    assert summary["inputs"] == [f"kafka:{topic}/0/3-9", f"kafka:{topic}/1/3-9"]


def test_replay_flags_fail_before_work(kafka: KafkaConnection) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "replay", "--topic", "t", "--from", "yesterday", "--output", "/tmp/never"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--from" in done.stderr and "Fix:" in done.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "replay",
            "--topic",
            "no-such-topic-here",
            "--output",
            "/tmp/never",
            "--bootstrap-servers",
            BOOTSTRAP,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--topic" in done.stderr


def test_parquet_input_is_produced_in_the_wire_format(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path
) -> None:
    events = tmp_path / "events.parquet"
    _cli("generate", "--users", "60", "--days", "2", "--seed", "9", "--output", str(events))
    topic = make_topic(2)
    out = _cli("produce", "--input", str(events), "--topic", topic, "--no-progress", "--bootstrap-servers", BOOTSTRAP)
    rows = pq.read_metadata(events).num_rows
    assert f"produce: {rows:,} messages acknowledged" in out and "0 without a user_id key" in out
    replay = tmp_path / "replay"
    _cli("replay", "--topic", topic, "--output", str(replay), "--num-shards", "2", "--bootstrap-servers", BOOTSTRAP)
    _file_run(events, tmp_path / "file", num_shards=2)
    for shard in sorted((tmp_path / "file" / "histories").glob("*/*.parquet")):
        assert pq.read_table(replay / "histories" / shard.parent.name / shard.name).equals(pq.read_table(shard))
