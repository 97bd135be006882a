"""A real Prometheus scrapes a running `stream` and `solaris` (the same graph, with candidate sets): the
consumer lag and Solaris' exact share come back through its HTTP API, and the JobDown alert fires once
the jobs have stopped."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pipelines.generator.funnel import stage_rows
from pipelines.io.kafka.config import KafkaConnection
from tests.fixtures.kafka import BOOTSTRAP, MakeTopic, produce
from tests.monitoring.prom import ROOT, Prometheus, running_prometheus
from tests.precompute.conftest import World
from tests.streaming.streams import retimed, send_events, send_sets, world_funnel
from tests.streaming.test_metrics import _free_port, wait_for

pytestmark = pytest.mark.integration

LIVE_SETS, LATE_SETS = 8, 4


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", *command], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb")
    )


def _stream(kafka: KafkaConnection, make_topic: MakeTopic, prism: str, port: int, tmp_path: Path):
    from pipelines.generator import WorldConfig, generate_events
    from pipelines.io.kafka.encode import events_to_wire

    events = generate_events(WorldConfig(users=40, days=1, seed=3)).events
    topic = make_topic(partitions=2)
    produce(kafka, topic, events_to_wire(events), keys=[str(u).encode() for u in events["user_id"].to_pylist()])
    command = [
        "stream", "--topic", topic, "--group", f"g-{uuid.uuid4().hex[:8]}", "--output", str(tmp_path / "stream"),
        "--num-shards", "2", "--flush-interval", "0.5", "--idle-exit", "10", "--metrics-port", str(port),
        "--bootstrap-servers", BOOTSTRAP, "--prism-location", prism,
    ]  # fmt: skip
    return _start(command, tmp_path / "stream.log"), events.num_rows


def _solaris(kafka: KafkaConnection, make_topic: MakeTopic, world: World, prism: str, port: int, tmp_path: Path):
    """``solaris`` (the stream graph with candidate sets) on the world's events; runs until stopped."""
    events, topic = make_topic(partitions=2), make_topic(partitions=2)
    send_events(kafka, events, world.events)
    command = [
        "solaris", "--topic", events, "--candidates-topic", topic, "--group", f"g-{uuid.uuid4().hex[:8]}",
        "--output", str(tmp_path / "solaris"), "--num-shards", "2", "--model", str(world.model),
        "--store", f"lmdb://{tmp_path}/store", "--metrics-port", str(port), "--bootstrap-servers", BOOTSTRAP,
        "--prism-location", prism,
    ]  # fmt: skip
    return _start(command, tmp_path / "solaris.log"), topic


def _stopped(job: subprocess.Popen[bytes], log: Path) -> None:
    try:
        job.wait(timeout=180)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait(timeout=30)
        raise
    assert job.returncode == 0, log.read_text()[-3000:]


def _job_down(prometheus: Prometheus) -> set[str] | None:
    firing = {a["labels"]["job"] for a in prometheus.alerts("JobDown")}
    return firing if {"stream", "solaris"} <= firing else None


def test_prometheus_scrapes_the_jobs_and_alerts_when_they_stop(
    kafka: KafkaConnection, make_topic: MakeTopic, prism: str, world: World, tmp_path: Path
) -> None:
    stream_port, solaris_port = _free_port(), _free_port()
    targets = {"stream": [f"127.0.0.1:{stream_port}"], "solaris": [f"127.0.0.1:{solaris_port}"]}
    with running_prometheus(tmp_path / "prometheus", targets) as prometheus:
        solaris, topic = _solaris(kafka, make_topic, world, prism, solaris_port, tmp_path)
        stream, events = _stream(kafka, make_topic, prism, stream_port, tmp_path)
        try:
            # Solaris' pair outcomes are scraped at 0 before any set is sent, so the rates start from 0.
            wait_for(lambda: len(prometheus.query('gem_pairs_total{job="solaris"}')) == 4, 180, "solaris scraped")
            early = stage_rows(world_funnel(LIVE_SETS + LATE_SETS), "early")
            live, late = retimed(early.slice(0, LIVE_SETS), 3_600), retimed(early.slice(LIVE_SETS), -60)
            send_sets(kafka, topic, live)
            send_sets(kafka, topic, late)
            pairs = [len(a) for a in early["ad_ids"].to_pylist()]
            expected_share = sum(pairs[:LIVE_SETS]) / sum(pairs)

            # every set done and the lag back to 0, seen through Prometheus
            done = f'sum(gem_pairs_total{{job="solaris"}}) == {sum(pairs)}'
            wait_for(lambda: prometheus.query(done), 240, "all pairs of the candidate sets counted")
            lag = 'sum by (job) (gem_consumer_lag_messages{job="solaris"})'
            wait_for(lambda: prometheus.values(lag) == {"solaris": 0.0}, 120, "solaris lag back to 0")
            assert 0 < expected_share < 1

            def share() -> dict[str, float] | None:
                """The rule's value once an evaluation has seen every pair (the graph drops the late sets
                while it still computes the live ones, so an earlier evaluation sees a lower share)."""
                got = prometheus.values("job:gem_exact_share:ratio_rate5m")
                return got if abs(got.get("solaris", -1.0) - expected_share) <= 0.01 else None  # one window

            wait_for(share, 60, f"the exact share at {expected_share:.3f}")

            # the stream job: every event read and its lag at 0 (its last scrapes: it exits when idle)
            read = f'max_over_time(sum(gem_records_total{{job="stream", kind="events"}})[10m:1s]) == {events}'
            wait_for(lambda: prometheus.query(read), 300, "stream read every event")
            stream_lag = 'sum by (job) (last_over_time(gem_consumer_lag_messages{job="stream"}[10m]))'
            wait_for(lambda: prometheus.values(stream_lag) == {"stream": 0.0}, 120, "stream lag back to 0")
            assert not prometheus.alerts("JobDown", state="firing")
        finally:
            solaris.send_signal(signal.SIGTERM)
            try:
                _stopped(solaris, tmp_path / "solaris.log")
            finally:
                _stopped(stream, tmp_path / "stream.log")
        # both scrapes fail from now on: JobDown is pending, then fires after its `for: 1m`
        firing = wait_for(lambda: _job_down(prometheus), 240, "JobDown firing for stream and solaris")
        assert firing == {"stream", "solaris"}
        assert {t["labels"]["job"]: t["health"] for t in prometheus.targets()} == {"stream": "down", "solaris": "down"}
