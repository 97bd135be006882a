"""Beam transforms over the pure Kafka reader and sink.

- :class:`ReadEventsFromKafka`: partition ranges → the same tagged outputs as
  :class:`pipelines.features.transforms.ReadEvents` (main ``events`` = (shard,
  EVENT table) pairs, ``dead_letters`` = DEAD_LETTER tables, ``counts`` = dicts),
  so :func:`pipelines.features.pipeline.build_features` runs on either source.
- :class:`WriteToKafka`: (key, value) byte pairs → a topic; each bundle ends
  only when the broker has acknowledged every message of it (a failure fails
  the bundle, so the runner retries it: at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from pipelines.features.transforms import COUNTS, DEAD, EVENTS, ReadMetrics, emit_parsed
from pipelines.io import arrow_coder  # noqa: F401 - registers the pa.Table coder
from pipelines.kafka.config import KafkaConnection
from pipelines.kafka.consume import BACKENDS, Fetcher, decode_batch, open_fetcher, prefetched
from pipelines.kafka.ranges import PartitionRange

__all__ = ["ReadEventsFromKafka", "WriteToKafka"]

NAMESPACE = "kafka"


class _ReadRangeFn(beam.DoFn):
    """A partition range → (shard, EVENT table) pairs, DEAD_LETTER tables and count dicts."""

    def __init__(self, connection: KafkaConnection, num_shards: int, backend: str, max_batch: int) -> None:
        self._connection, self._num_shards = connection, num_shards
        self._backend, self._max_batch = backend, max_batch
        self._fetcher: Fetcher | None = None

    def setup(self) -> None:
        self._fetcher = open_fetcher(self._connection, self._backend, max_batch=self._max_batch)
        self._metrics = ReadMetrics.create(NAMESPACE)

    def process(self, part: PartitionRange) -> Iterator[Any]:
        assert self._fetcher is not None
        for batch in prefetched(self._fetcher.fetch(part)):
            yield from emit_parsed(decode_batch(batch), self._num_shards, self._metrics)

    def teardown(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None


class ReadEventsFromKafka(beam.PTransform):
    """Partition ranges → tagged outputs ``events``, ``dead_letters``, ``counts`` (as ReadEvents).

    ``ranges`` are resolved before the pipeline is built
    (:func:`pipelines.kafka.ranges.resolve_ranges`, then
    :func:`~pipelines.kafka.ranges.split_ranges` for parallelism), so a run
    reads exactly those offsets however often it is retried.
    """

    def __init__(self, connection: KafkaConnection, ranges: Sequence[PartitionRange], *, num_shards: int,
                 backend: str = "kafka-python", max_batch: int = 20_000) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._connection, self._ranges = connection, [r for r in ranges if r.size]
        self._num_shards, self._backend, self._max_batch = num_shards, backend, max_batch

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Ranges" >> beam.Create(self._ranges)
            | "Reshuffle" >> beam.Reshuffle()
            | "FetchDecode" >> beam.ParDo(_ReadRangeFn(self._connection, self._num_shards, self._backend,
                                                       self._max_batch))
            .with_output_types(tuple[int, pa.Table])
            .with_outputs(DEAD, COUNTS, main=EVENTS)
        )


class _WriteFn(beam.DoFn):
    def __init__(self, connection: KafkaConnection, topic: str) -> None:
        self._connection, self._topic = connection, topic

    def setup(self) -> None:
        from pipelines.kafka.produce import KafkaSink

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
