"""Fixtures for the tests against the project's real Kafka broker (``make kafka-up``)."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from pipelines.kafka.config import DEFAULT_BOOTSTRAP, KafkaConnection
from tests.precompute.conftest import world  # noqa: F401 - the generated world, for the refresh tests

BOOTSTRAP = os.environ.get("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
#: The broker's SASL_PLAINTEXT listener and user (deploy/kafka/server.properties.in).
SASL_PORT_OFFSET = 2
SASL_USER, SASL_PASSWORD = "gem", "gem-secret"

MakeTopic = Callable[..., str]


def _reachable(server: str) -> bool:
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def kafka() -> KafkaConnection:
    """The project's broker; FAILS (never skips) when it is down."""
    if not _reachable(BOOTSTRAP):
        pytest.fail(f"Kafka is not reachable at {BOOTSTRAP}: run `make kafka-up` (or set GEM_KAFKA_BOOTSTRAP)")
    return KafkaConnection(bootstrap_servers=(BOOTSTRAP,))


@pytest.fixture(scope="session")
def kafka_sasl(kafka: KafkaConnection) -> KafkaConnection:
    host, _, port = BOOTSTRAP.rpartition(":")
    server = f"{host}:{int(port) + SASL_PORT_OFFSET}"
    if not _reachable(server):
        pytest.fail(f"the broker's SASL listener is not reachable at {server}: run `make kafka-up`")
    return KafkaConnection(bootstrap_servers=(server,), security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                           sasl_username=SASL_USER, sasl_password=SASL_PASSWORD)


@pytest.fixture(scope="session")
def make_topic(kafka: KafkaConnection) -> Iterator[MakeTopic]:
    """``make_topic(partitions=1)``: a fresh topic, deleted at the end of the session."""
    from pipelines.kafka.produce import delete_topics, ensure_topic

    created: list[str] = []

    def make(partitions: int = 1, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        # No time retention: tests write messages stamped in the past (2026-01-01), and the
        # broker's 7-day retention check (every 5 min) deleted such a topic's segments
        # between produce and replay in a suite run.
        assert ensure_topic(kafka, name, partitions, configs={"retention.ms": "-1"})
        created.append(name)
        return name

    yield make
    if created:
        delete_topics(kafka, created)


def produce(connection: KafkaConnection, topic: str, values: Sequence[bytes], *, keys: Sequence[bytes | None] = (),
            partition: int | None = None, timestamps_ms: Sequence[int] = (), compression: str | None = None,
            headers: Sequence[tuple[str, bytes]] = (), batch_each: bool = False) -> None:
    """Write ``values`` (acks=all) and wait for every acknowledgement; ``batch_each``: one record per batch."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**connection.kafka_python(), acks="all", linger_ms=5, compression_type=compression)
    try:
        futures = []
        for i, v in enumerate(values):
            futures.append(producer.send(topic, value=v, key=keys[i] if keys else None, partition=partition,
                                         timestamp_ms=timestamps_ms[i] if timestamps_ms else None,
                                         headers=list(headers) or None))
            if batch_each:
                producer.flush()
        producer.flush()
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close()


def kafka_sh(action: str) -> None:
    """``scripts/kafka.sh up|down``: start or stop the project's broker (its data stays)."""
    root = Path(__file__).resolve().parents[2]
    subprocess.run(["bash", str(root / "scripts" / "kafka.sh"), action], check=True, timeout=180,
                   capture_output=True)


@pytest.fixture(scope="session")
def prism() -> str:
    """The Prism binary `make prism` built (never downloaded at run time)."""
    from pipelines.options import default_prism

    found = default_prism()
    if not found:
        pytest.fail("no Prism binary: run `make prism`")
    return found
