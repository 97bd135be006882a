"""The long-running jobs' Prometheus endpoints, scraped during a run: counts add up, lag returns to 0 when idle."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from io import StringIO
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.generator.funnel import stage_rows
from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.metrics import JobMetrics, StatusLine
from tests.fixtures.kafka import BOOTSTRAP, MakeTopic
from tests.precompute.conftest import World
from tests.streaming.streams import retimed, send_events, send_sets, world_funnel

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items()))


def wait_for(check, timeout_s: float, what: str):
    deadline, last = time.time() + timeout_s, None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not reached in {timeout_s} s (last: {last})")


def test_status_line_renders_on_demand() -> None:
    out = StringIO()
    line = StatusLine(lambda seconds: f"tick {seconds > 0}", interval_s=0.05, out=out, force=True)
    line.start()
    time.sleep(0.3)
    line.stopped.set()
    line.join(timeout=2)
    assert "tick True" in out.getvalue().splitlines()


def test_status_lines_read_the_metrics() -> None:
    from pipelines.streaming.lag import stream_status
    from pipelines.streaming.metrics import Rates

    stream = JobMetrics("stream")
    rates = Rates(stream)
    stream_status(stream, rates, {}, 1.0)  # the first call sets the counters' baseline
    stream.read("events", 500)
    stream.fresh("event_to_history", [0.5, 1.5])
    line = stream_status(stream, rates, {0: (120, 2.5), 1: (30, 0.5)}, 2.0)
    assert line.startswith("stream: 250 events/s, lag 150 msgs (2.5 s), p99 event->history 1.49 s"), line
    stream_status(stream, rates, {}, 1.0, pairs=True)  # the sets' counters' baseline
    stream.read("candidate_sets", 10)
    stream.fresh("candidate_to_pair", [0.1, 0.2])
    line = stream_status(stream, rates, {}, 2.0, pairs=True)
    assert line.startswith("stream: 0 events/s, 5.0 sets/s, 0 pairs/s, p99 set->pair 0.20 s, late sets 0,"), line


@pytest.mark.integration
def test_solaris_endpoint_during_a_run(
    kafka: KafkaConnection, make_topic: MakeTopic, world: World, prism: str, tmp_path: Path
) -> None:
    """``solaris`` (the stream graph with candidate sets, on Prism) serves the sets' pair outcomes."""
    from tests.fixtures.kafka import produce

    sets = retimed(stage_rows(world_funnel(12), "early"), 3_600)
    events, topic, port = make_topic(partitions=2), make_topic(partitions=2), _free_port()
    send_events(kafka, events, world.events)
    command = [
        sys.executable, "-m", "pipelines", "solaris", "--topic", events, "--candidates-topic", topic,
        "--group", f"g-{uuid.uuid4().hex[:8]}", "--output", str(tmp_path / "out"), "--num-shards", "2",
        "--model", str(world.model), "--store", f"lmdb://{tmp_path}/store", "--idle-exit", "20",
        "--metrics-port", str(port), "--bootstrap-servers", BOOTSTRAP, "--prism-location", prism,
    ]  # fmt: skip
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "wb"))
    try:
        send_sets(kafka, topic, sets)
        produce(kafka, topic, [b"not json"])

        def settled() -> dict | None:
            try:
                got = scrape(port)
            except OSError:
                return None
            read = total(got, "gem_records_total", kind="candidate_sets") == sets.num_rows  # the bad one: a dead letter
            lag = [v for (n, ls), v in got.items() if n == "gem_consumer_lag_messages" and ("topic", topic) in ls]
            return got if read and len(lag) == 2 and sum(lag) == 0 else None

        got = wait_for(settled, 240, "all sets read and the lag back to 0")
        assert total(got, "gem_dead_letters_total", reason="bad_json") == 1
        assert total(got, "gem_pairs_total") == sum(len(a) for a in sets["ad_ids"].to_pylist())
        assert total(got, "gem_pairs_total", outcome="late") == 0
        assert total(got, "gem_freshness_seconds_count", leg="candidate_to_pair") == sets.num_rows
        assert total(got, "gem_step_seconds_count", step="pairs") > 0
        assert total(got, "process_resident_memory_bytes") > 0
    finally:
        job.wait(timeout=180)
    assert job.returncode == 0, (tmp_path / "log").read_text()[-3000:]


@pytest.mark.integration
def test_stream_endpoint_during_a_run(
    kafka: KafkaConnection, make_topic: MakeTopic, prism: str, tmp_path: Path
) -> None:
    from pipelines.generator import WorldConfig, generate_events
    from pipelines.io.kafka.encode import events_to_wire
    from tests.fixtures.kafka import produce

    events = generate_events(WorldConfig(users=50, days=1, seed=2)).events
    topic, port = make_topic(partitions=2), _free_port()
    produce(kafka, topic, events_to_wire(events), keys=[str(u).encode() for u in events["user_id"].to_pylist()])
    produce(kafka, topic, [b"{broken"])
    command = [
        sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", f"g-{uuid.uuid4().hex[:8]}",
        "--output", str(tmp_path / "out"), "--num-shards", "2", "--flush-interval", "0.5", "--idle-exit", "8",
        "--metrics-port", str(port), "--bootstrap-servers", BOOTSTRAP, "--prism-location", prism,
    ]  # fmt: skip
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "wb"))
    try:

        def settled() -> dict | None:
            try:
                got = scrape(port)
            except OSError:
                return None
            read = total(got, "gem_records_total", kind="events") == events.num_rows
            lag = [v for (n, _), v in got.items() if n == "gem_consumer_lag_messages"]
            return got if read and len(lag) == 2 and sum(lag) == 0 else None

        got = wait_for(settled, 240, "all events read and the lag back to 0")
        assert total(got, "gem_dead_letters_total") == 1
        assert total(got, "gem_step_seconds_count", step="flush") > 0
        assert total(got, "gem_freshness_seconds_count", leg="event_to_history") > 0
        assert total(got, "gem_state_users") == len(set(events["user_id"].to_pylist()))
    finally:
        job.wait(timeout=120)
    assert job.returncode == 0, (tmp_path / "log").read_text()[-3000:]


@pytest.mark.integration
def test_the_lag_monitor_measures_every_topic_of_the_group(kafka: KafkaConnection, make_topic: MakeTopic) -> None:
    """``stream --candidates-topic`` reads two topics: the lag of both is measured, per topic."""
    from kafka import KafkaConsumer

    from pipelines.streaming.lag import LagMonitor
    from tests.fixtures.kafka import produce

    events, sets = make_topic(2), make_topic(1)
    produce(kafka, events, [b'{"a":1}'] * 3, keys=[b"1", b"2", b"3"])
    produce(kafka, sets, [b'{"b":1}'] * 2)
    metrics, name = JobMetrics("stream"), f"g-{uuid.uuid4().hex[:8]}"
    monitor = LagMonitor(kafka, [events, sets], name, metrics)
    group = KafkaConsumer(**kafka.kafka_python(), group_id=name, enable_auto_commit=False)
    peek = KafkaConsumer(**kafka.kafka_python(), group_id=None, enable_auto_commit=False)
    try:
        monitor.measure(group, peek)
    finally:
        group.close()
        peek.close()
    behind = {topic: 0 for topic in (events, sets)}
    for (topic, _), (messages, _) in monitor.last.items():
        behind[topic] += messages
    assert behind == {events: 3, sets: 2}
    assert metrics.value("gem_consumer_lag_messages", topic=sets, partition="0") == 2
