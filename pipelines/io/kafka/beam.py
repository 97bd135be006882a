"""Beam transforms over the pure Kafka reader and sink (the connector's Beam face).

- :class:`ReadFromKafka`: partition ranges → :class:`MessageBatch` es of raw
  messages; what they mean is the reading stage's business
  (:class:`pipelines.features.sources.ReadEventsFromKafka` decodes events).
- :class:`WriteToKafka`: (key, value) byte pairs → a topic; each bundle ends
  only when the broker has acknowledged every message of it (a failure fails
  the bundle, so the runner retries it: at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.consume import BACKENDS, Fetcher, MessageBatch, open_fetcher, prefetched
from pipelines.io.kafka.memory import keep_large_buffers
from pipelines.io.kafka.ranges import PartitionRange

__all__ = ["ReadFromKafka", "WriteToKafka"]

NAMESPACE = "kafka"


class _FetchRangeFn(beam.DoFn):
    """A partition range → its :class:`MessageBatch` es in offset order (fetched ahead on a thread)."""

    def __init__(self, connection: KafkaConnection, backend: str, max_batch: int, keep_buffers: bool) -> None:
        self._connection, self._backend, self._max_batch = connection, backend, max_batch
        self._keep_buffers = keep_buffers
        self._fetcher: Fetcher | None = None

    def setup(self) -> None:
        if self._keep_buffers:
            keep_large_buffers()  # each response passes through several buffers of its size
        self._fetcher = open_fetcher(self._connection, self._backend, max_batch=self._max_batch)
        self._messages = Metrics.counter(NAMESPACE, "messages_read")

    def process(self, part: PartitionRange) -> Iterator[MessageBatch]:
        assert self._fetcher is not None
        for batch in prefetched(self._fetcher.fetch(part)):
            self._messages.inc(len(batch))
            yield batch

    def teardown(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


class ReadFromKafka(beam.PTransform):
    """Partition ranges → :class:`MessageBatch` es (raw values in place, offsets, sources).

    ``ranges`` are resolved before the pipeline is built
    (:func:`pipelines.io.kafka.ranges.resolve_ranges`, then
    :func:`~pipelines.io.kafka.ranges.split_ranges` for parallelism), so a run
    reads exactly those offsets however often it is retried. ``keep_buffers`` tunes each
    worker process's allocator for bulk reads (:mod:`pipelines.io.kafka.memory`): a
    process-wide change, so off unless the caller owns the processes (the project's
    ``replay`` command turns it on).
    """

    def __init__(
        self,
        connection: KafkaConnection,
        ranges: Sequence[PartitionRange],
        *,
        backend: str = "kafka-python",
        max_batch: int = 20_000,
        keep_buffers: bool = False,
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._connection, self._ranges = connection, [r for r in ranges if r.size]
        self._backend, self._max_batch, self._keep_buffers = backend, max_batch, keep_buffers

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Ranges" >> beam.Create(self._ranges)
            | "Reshuffle" >> beam.Reshuffle()
            | "Fetch" >> beam.ParDo(_FetchRangeFn(self._connection, self._backend, self._max_batch, self._keep_buffers))
        )


class _WriteFn(beam.DoFn):
    def __init__(self, connection: KafkaConnection, topic: str) -> None:
        self._connection, self._topic = connection, topic

    def setup(self) -> None:
        from pipelines.io.kafka.produce import KafkaSink

        self._sink = KafkaSink(self._connection, self._topic)
        self._delivered = Metrics.counter(NAMESPACE, f"delivered.{self._topic}")
        self._acked = 0

    def process(self, message: tuple[bytes | None, bytes]) -> None:
        key, value = message
        self._sink.send(value, key)

    def finish_bundle(self) -> None:
        acked = self._sink.flush()  # raises DeliveryError: the bundle fails and is retried
        self._delivered.inc(acked - self._acked)
        self._acked = acked

    def teardown(self) -> None:
        self._sink.close()


class WriteToKafka(beam.PTransform):
    """(key, value) byte pairs → ``topic``; a bundle commits only after the broker acknowledged it."""

    def __init__(self, connection: KafkaConnection, topic: str) -> None:
        super().__init__()
        if not topic:
            raise ValueError("WriteToKafka needs a topic")
        self._connection, self._topic = connection, topic

    def expand(self, messages: beam.PCollection) -> beam.PCollection:
        return messages | "Produce" >> beam.ParDo(_WriteFn(self._connection, self._topic))
