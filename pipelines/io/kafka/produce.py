"""Write to Kafka with confirmed delivery; load generator files into a topic.

:class:`KafkaSink` wraps a kafka-python producer: :meth:`KafkaSink.send` queues,
:meth:`KafkaSink.flush` waits for every acknowledgement and raises
:class:`DeliveryError` if any message was not written, so a caller (a Beam
bundle, ``produce``) never reports records the broker did not take.
:func:`file_messages` turns a JSONL(.gz)/Parquet events file into (key, value)
batches in the JSON wire format, key = the user id as a decimal string; a funnel file
(CANDIDATE_SET Parquet, ``generate --funnel``) into candidate-set messages
(:mod:`pipelines.io.kafka.candidate_sets`).
"""

from __future__ import annotations

import gzip
import logging
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.errors import ConfigError, InputNotFoundError, PipelinesError
from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire
from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.encode import events_to_wire

__all__ = [
    "DeliveryError",
    "KafkaSink",
    "delete_topics",
    "ensure_topic",
    "file_messages",
    "open_sink",
    "topic_partitions",
]

log = logging.getLogger(__name__)

Message = tuple[bytes | None, bytes]
_USER_ID = re.compile(rb'"user_id"\s*:\s*(\d{1,19})\b')


class DeliveryError(PipelinesError):
    """Some messages were not acknowledged by the broker."""


class KafkaSink:
    """A producer whose :meth:`flush` proves delivery (acks=all, idempotent)."""

    def __init__(
        self,
        connection: KafkaConnection,
        topic: str,
        *,
        linger_ms: int = 50,
        batch_bytes: int = 1 << 20,
        compression: str | None = None,
        max_block_s: float = 60.0,
    ) -> None:
        from kafka import KafkaProducer

        self.topic = topic
        self._producer = KafkaProducer(
            **connection.kafka_python(),
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            batch_size=batch_bytes,
            compression_type=compression,
            max_request_size=8 << 20,
            max_block_ms=int(max_block_s * 1000),
        )
        self._lock = threading.Lock()
        self._sent = self._acked = 0
        self._errors: list[BaseException] = []

    def _ok(self, _metadata: object) -> None:
        with self._lock:
            self._acked += 1

    def _failed(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(error)

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        from kafka.errors import KafkaError

        try:
            future = self._producer.send(self.topic, value=value, key=key, partition=partition)
        except KafkaError as exc:  # no metadata for the topic within max_block_s, message too large, ...
            raise DeliveryError(f"cannot send to {self.topic!r}: {exc!r}") from exc
        future.add_callback(self._ok)
        future.add_errback(self._failed)
        self._sent += 1

    def send_many(self, messages: Sequence[Message]) -> None:
        for key, value in messages:
            self.send(value, key)

    def flush(self, timeout_s: float = 120.0) -> int:
        """Wait for every queued message; returns how many were acknowledged so far in total."""
        self._producer.flush(timeout=timeout_s)
        with self._lock:
            acked, errors = self._acked, list(self._errors)
        if errors:
            raise DeliveryError(f"{len(errors)} of {self._sent} messages to {self.topic!r} failed: {errors[0]!r}")
        if acked != self._sent:
            raise DeliveryError(
                f"only {acked} of {self._sent} messages to {self.topic!r} acknowledged within {timeout_s:.0f} s"
            )
        return acked

    def close(self) -> None:
        self._producer.close()


class ConfluentSink:
    """The same contract over confluent-kafka (librdkafka): the optional faster backend."""

    def __init__(self, connection: KafkaConnection, topic: str, *, linger_ms: int = 50) -> None:
        try:
            from confluent_kafka import Producer
        except ImportError as exc:
            raise ConfigError(
                "--kafka-backend",
                "confluent needs the confluent-kafka package",
                "pip install -e '.[kafka-fast]' or use --kafka-backend kafka-python",
            ) from exc
        self.topic = topic
        self._producer = Producer(
            {
                **connection.librdkafka(),
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": linger_ms,
                "queue.buffering.max.messages": 1_000_000,
                "partitioner": "murmur2_random",
            }
        )  # the Java client's, as kafka-python
        self._sent = self._acked = 0
        self._errors: list[object] = []

    def _report(self, error: object, _message: object) -> None:
        if error is None:
            self._acked += 1
        else:
            self._errors.append(error)

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    key=key,
                    on_delivery=self._report,
                    partition=-1 if partition is None else partition,
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._sent += 1

    def send_many(self, messages: Sequence[Message]) -> None:
        for key, value in messages:
            self.send(value, key)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 120.0) -> int:
        self._producer.flush(timeout_s)
        if self._errors:
            raise DeliveryError(
                f"{len(self._errors)} of {self._sent} messages to {self.topic!r} failed: {self._errors[0]!r}"
            )
        if self._acked != self._sent:
            raise DeliveryError(
                f"only {self._acked} of {self._sent} messages to {self.topic!r} acknowledged within {timeout_s:.0f} s"
            )
        return self._acked

    def close(self) -> None:
        self._producer.flush(5)


def open_sink(connection: KafkaConnection, topic: str, backend: str = "kafka-python") -> KafkaSink | ConfluentSink:
    """A delivery-confirming sink for ``backend`` (``kafka-python`` or ``confluent``)."""
    if backend == "kafka-python":
        return KafkaSink(connection, topic)
    if backend == "confluent":
        return ConfluentSink(connection, topic)
    raise ConfigError("--kafka-backend", f"got {backend!r}", "pass kafka-python or confluent")


def topic_partitions(connection: KafkaConnection, topic: str) -> int:
    """Number of partitions of ``topic`` (0 when it does not exist)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**connection.kafka_python(), group_id=None)
    try:
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()


def ensure_topic(
    connection: KafkaConnection,
    topic: str,
    partitions: int,
    replication: int = 1,
    *,
    configs: Mapping[str, str] | None = None,
) -> bool:
    """Create ``topic`` (with topic-level ``configs``) unless it exists; True when it was created."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    if partitions < 1:
        raise ConfigError("--partitions", f"got {partitions}", "pass a value >= 1")
    admin = KafkaAdminClient(**connection.kafka_python())
    try:
        admin.create_topics(
            [NewTopic(topic, partitions, replication, topic_configs=dict(configs or {}))], wait_for_metadata=True
        )
        return True
    except TopicAlreadyExistsError:
        return False
    finally:
        admin.close()


def delete_topics(connection: KafkaConnection, topics: Sequence[str]) -> None:
    """Delete ``topics`` (scratch topics of benches and tests)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(**connection.kafka_python())
    try:
        admin.delete_topics(list(topics))
    finally:
        admin.close()


def _key_of(value: bytes) -> bytes | None:
    match = _USER_ID.search(value)
    return match.group(1) if match else None


def _jsonl_batches(path: Path, batch: int) -> Iterator[list[Message]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    out: list[Message] = []
    with opener(path, "rb") as f:
        for raw in f:
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            out.append((_key_of(line), line))
            if len(out) >= batch:
                yield out
                out = []
    if out:
        yield out


def _parquet_batches(path: Path, batch: int) -> Iterator[list[Message]]:
    from pipelines.schemas.layouts import layout_of

    file = pq.ParquetFile(path)
    funnel = (layout_of(file.schema_arrow) or ("",))[0] == "candidate_set"
    for record_batch in file.iter_batches(batch_size=batch):
        table = pa.Table.from_batches([record_batch])
        if funnel:  # a funnel file (generate --funnel): candidate sets, not events
            yield candidate_sets_to_wire(table)
            continue
        values = events_to_wire(table)
        keys = [str(u).encode() for u in table.column("user_id").to_pylist()]
        yield list(zip(keys, values, strict=True))


def file_messages(path: str, batch: int = 10_000) -> tuple[int, Iterator[list[Message]]]:
    """(number of messages, batches of (key, value)) of a generator events file."""
    file = Path(path)
    if not file.is_file():
        raise InputNotFoundError(f"--input {path!r} is not a file")
    if file.name.endswith(".parquet"):
        return pq.ParquetFile(file).metadata.num_rows, _parquet_batches(file, batch)
    if file.name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json")):
        opener = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rb") as f:
            total = sum(1 for raw in f if raw.strip())
        return total, _jsonl_batches(file, batch)
    raise ConfigError("--input", f"unsupported file type {path!r}", "give a .jsonl, .jsonl.gz or .parquet file")
