"""Streaming histories: Kafka (unbounded) → per-shard state + timers → flush files, topics, commits.

The job, on a streaming runner (Beam's Prism, built by ``make prism``):

1. ``ReadPartition`` (an unbounded splittable DoFn per partition) polls from the
   consumer group's committed offset, decodes each batch with the batch decoder
   and emits (shard, EVENT table + ``_partition``/``_offset``) pairs, dead
   letters, and acknowledgements for offsets that hold no record;
2. ``AppendHistories`` is keyed by user shard: a bag of buffered event tables and
   the shard's current histories are Beam state; a processing-time timer
   (``flush_interval_s``) merges the buffer into the histories (late events go to
   their place by event time), writes the changed rows as a Parquet flush file
   (atomically), publishes them to a topic when asked (confirmed), and then
   acknowledges the flushed offsets;
3. dead letters are written (Parquet, optional topic) and acknowledged likewise;
4. ``CommitOffsets``, keyed by partition, commits to the group the first offset
   not yet durable (:class:`pipelines.kafka.stream_state.OffsetLedger`).

So a commit never gets ahead of what is durable. After a crash (even SIGKILL)
the job restarts from the committed offsets, rebuilds each shard's state from
its flush files, and the merge drops events that a history already holds (same
event_id): no event lost, none counted twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration, Timestamp

from pipelines.errors import ConfigError
from pipelines.features.sharding import split_by_shard
from pipelines.io.arrow_coder import ArrowTableCoder
from pipelines.kafka.config import KafkaConnection
from pipelines.kafka.consume import PartitionPoller
from pipelines.kafka.decode import decode_indexed
from pipelines.kafka.stream_state import OFFSET, PARTITION, OffsetLedger, flush_path, merge_shard, write_flush

__all__ = ["PartitionStart", "StreamConfig", "build_stream"]

ACKS, DEAD = "acks", "dead_letters"
_END = 2**62


@dataclass(frozen=True)
class StreamConfig:
    """What the streaming job reads and writes; validated on construction."""

    topic: str
    output: str
    group: str
    num_shards: int = 16
    max_history: int = 4096
    flush_interval_s: float = 1.0
    idle_exit_s: float | None = None
    histories_topic: str | None = None
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if not self.topic or not self.group:
            raise ConfigError("--group", "a topic and a consumer group are needed", "pass --topic and --group")
        if not 1 <= self.num_shards <= 4096:
            raise ConfigError("--num-shards", f"got {self.num_shards}", "pass 1..4096")
        if self.max_history < 1:
            raise ConfigError("--max-history", f"got {self.max_history}", "pass a value >= 1")
        if not 0.01 <= self.flush_interval_s <= 3600:
            raise ConfigError("--flush-interval", f"got {self.flush_interval_s}", "pass 0.01..3600 seconds")
        if self.idle_exit_s is not None and self.idle_exit_s <= 0:
            raise ConfigError("--idle-exit", f"got {self.idle_exit_s}", "pass a positive number of seconds")


@dataclass(frozen=True)
class PartitionStart:
    topic: str
    partition: int
    start: int


class _Tracker(OffsetRestrictionTracker):
    """Offsets of an unbounded partition: only checkpoints (``defer_remainder``) split it."""

    def try_split(self, fraction_of_remainder: float) -> Any:
        return super().try_split(0) if fraction_of_remainder == 0 else None


class _Restrictions(RestrictionProvider):
    def initial_restriction(self, element: PartitionStart) -> OffsetRange:
        return OffsetRange(element.start, _END)

    def create_tracker(self, restriction: OffsetRange) -> _Tracker:
        return _Tracker(restriction)

    def restriction_size(self, element: PartitionStart, restriction: OffsetRange) -> int:
        return 1

    def truncate(self, element: PartitionStart, restriction: OffsetRange) -> None:
        return None  # on drain, stop reading


# Beam takes state, timers and restrictions as parameter defaults; module-level singletons keep that readable.
_BUFFER = BagStateSpec("buffer", ArrowTableCoder())
_HISTORIES = ReadModifyWriteStateSpec("histories", ArrowTableCoder())
_LOADED = ReadModifyWriteStateSpec("loaded", VarIntCoder())
_ARMED = ReadModifyWriteStateSpec("armed", VarIntCoder())
_FLUSH = TimerSpec("flush", TimeDomain.REAL_TIME)
_LEDGER = ReadModifyWriteStateSpec("ledger", PickleCoder())
BUFFER, HISTORIES = beam.DoFn.StateParam(_BUFFER), beam.DoFn.StateParam(_HISTORIES)
LOADED, ARMED = beam.DoFn.StateParam(_LOADED), beam.DoFn.StateParam(_ARMED)
FLUSH, LEDGER = beam.DoFn.TimerParam(_FLUSH), beam.DoFn.StateParam(_LEDGER)
KEY, RESTRICTION = beam.DoFn.KeyParam, beam.DoFn.RestrictionParam(_Restrictions())


class _ReadPartitionFn(beam.DoFn):
    """One partition, unbounded: polls for about a second per call, then checkpoints."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._poller = PartitionPoller(self._connection)
        self._idle_since: dict[int, float] = {}

    @beam.DoFn.unbounded_per_element()
    def process(self, element: PartitionStart, tracker: Any = RESTRICTION) -> Iterator[Any]:
        position = tracker.current_restriction().start
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            batch, after = self._poller.poll(element.topic, element.partition, position)
            if after > position and not tracker.try_claim(after - 1):
                return
            if batch is None:
                if after > position:  # offsets without a record (transaction markers, compaction)
                    yield TaggedOutput(ACKS, (element.partition, np.arange(position, after, dtype=np.int64)))
                    position = after
                if self._idle(element.partition):
                    tracker.try_claim(_END)  # done: the restriction is finished
                    return
                continue
            self._idle_since.pop(element.partition, None)
            yield from self._emit(element, batch, position, after)
            position = after
        tracker.defer_remainder(Duration.of(0.05))

    def _idle(self, partition: int) -> bool:
        limit = self._config.idle_exit_s
        since = self._idle_since.setdefault(partition, time.monotonic())
        return limit is not None and time.monotonic() - since > limit

    def _emit(self, element: PartitionStart, batch: Any, position: int, after: int) -> Iterator[Any]:
        decoded = decode_indexed(batch.payloads, batch.sources)
        events = decoded.result.events
        offsets = batch.offsets
        events = events.append_column(PARTITION, pa.array(np.full(events.num_rows, element.partition, np.int32)))
        events = events.append_column(OFFSET, pa.array(offsets[decoded.event_rows]))
        yield from split_by_shard(events, self._config.num_shards)
        if len(decoded.dead_rows):
            yield TaggedOutput(DEAD, (element.partition, offsets[decoded.dead_rows], decoded.result.dead_letters))
        gaps = np.setdiff1d(np.arange(position, after, dtype=np.int64), offsets)
        if len(gaps):
            yield TaggedOutput(ACKS, (element.partition, gaps))

    def teardown(self) -> None:
        self._poller.close()


def _open_sink(connection: KafkaConnection, topic: str | None) -> Any:
    if topic is None:
        return None
    from pipelines.kafka.produce import KafkaSink

    return KafkaSink(connection, topic, linger_ms=5)


class _AppendHistoriesFn(beam.DoFn):
    """Keyed by shard: buffer events, flush on a processing-time timer, then acknowledge offsets."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._sink = _open_sink(self._connection, self._config.histories_topic)

    def process(self, element: tuple[int, pa.Table], buffer: Any = BUFFER, armed: Any = ARMED,
                flush: Any = FLUSH) -> None:
        buffer.add(element[1])
        if not armed.read():
            flush.set(Timestamp.now() + Duration.of(self._config.flush_interval_s))
            armed.write(1)

    @on_timer(_FLUSH)
    def on_flush(self, shard: Any = KEY, buffer: Any = BUFFER, histories: Any = HISTORIES, loaded: Any = LOADED,
                 armed: Any = ARMED) -> Iterator[tuple[int, np.ndarray]]:
        from pipelines.kafka.encode import histories_to_json
        from pipelines.kafka.stream_state import latest_histories

        tables = [t for t in buffer.read() if t.num_rows]
        armed.clear()
        if not tables:
            return
        events = pa.concat_tables(tables)
        state = histories.read() if loaded.read() else latest_histories(self._config.output, shard)
        merged = merge_shard(events, state, max_history=self._config.max_history)
        write_flush(merged.changed, flush_path(self._config.output, shard))
        if self._sink is not None:
            self._sink.send_many(histories_to_json(merged.changed))
            self._sink.flush()
        histories.write(merged.state)
        loaded.write(1)
        buffer.clear()
        partitions = events.column(PARTITION).to_numpy()
        offsets = events.column(OFFSET).to_numpy()
        for p in np.unique(partitions):
            yield int(p), offsets[partitions == p]

    def teardown(self) -> None:
        if self._sink is not None:
            self._sink.close()


class _WriteDeadLettersFn(beam.DoFn):
    """(partition, offsets, DEAD_LETTER table) → a Parquet file (+ topic), then acknowledges the offsets."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._sink = _open_sink(self._connection, self._config.dead_letter_topic)

    def process(self, element: tuple[int, np.ndarray, pa.Table]) -> Iterator[tuple[int, np.ndarray]]:
        import pyarrow.parquet as pq

        from pipelines.io.parquet import conform
        from schemas.layouts import DEAD_LETTER

        partition, offsets, dead = element
        path = Path(self._config.output, "dead_letters", f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(conform(dead, DEAD_LETTER), tmp)
        tmp.replace(path)
        if self._sink is not None:
            from pipelines.kafka.encode import dead_letters_to_json

            self._sink.send_many(dead_letters_to_json(dead))
            self._sink.flush()
        yield partition, offsets

    def teardown(self) -> None:
        if self._sink is not None:
            self._sink.close()


class _CommitOffsetsFn(beam.DoFn):
    """Keyed by partition: commits the first offset not yet durable to the consumer group."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig, starts: dict[int, int]) -> None:
        self._connection, self._config, self._starts = connection, config, dict(starts)

    def setup(self) -> None:
        from kafka import KafkaConsumer

        self._consumer = KafkaConsumer(**self._connection.kafka_python(), group_id=self._config.group,
                                       enable_auto_commit=False)

    def process(self, element: tuple[int, np.ndarray], ledger: Any = LEDGER) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        partition, offsets = element
        book = ledger.read() or OffsetLedger(self._starts[partition])
        if book.add(offsets):
            tp = TopicPartition(self._config.topic, partition)
            self._consumer.commit({tp: OffsetAndMetadata(book.next, "", -1)})
        ledger.write(book)

    def teardown(self) -> None:
        self._consumer.close()


def build_stream(p: beam.Pipeline, connection: KafkaConnection, config: StreamConfig,
                 starts: Sequence[PartitionStart]) -> None:
    """Add the streaming histories job to ``p`` (a streaming pipeline)."""
    read = (
        p
        | "Partitions" >> beam.Create(list(starts))
        | "ReadPartition" >> beam.ParDo(_ReadPartitionFn(connection, config))
        .with_output_types(tuple[int, pa.Table]).with_outputs(ACKS, DEAD, main="events")
    )
    flushed = read["events"] | "AppendHistories" >> beam.ParDo(_AppendHistoriesFn(connection, config))
    written = read[DEAD] | "WriteDeadLetters" >> beam.ParDo(_WriteDeadLettersFn(connection, config))
    _ = (
        (flushed, written, read[ACKS])
        | "AllAcks" >> beam.Flatten()
        | "CommitOffsets" >> beam.ParDo(_CommitOffsetsFn(connection, config, {s.partition: s.start for s in starts}))
    )


def start_offsets(connection: KafkaConnection, topic: str, group: str, fallback: Any) -> list[PartitionStart]:
    """Per partition: the group's committed offset, else ``fallback`` (a :class:`Position`) resolved."""
    from kafka import KafkaConsumer, TopicPartition

    from pipelines.kafka.consume import open_lookup
    from pipelines.kafka.ranges import resolve_ranges

    lookup = open_lookup(connection)
    try:
        ranges = resolve_ranges(lookup, topic, fallback, fallback)
    finally:
        lookup.close()
    consumer = KafkaConsumer(**connection.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        starts = []
        for r in ranges:
            committed = consumer.committed(TopicPartition(topic, r.partition))
            starts.append(PartitionStart(topic, r.partition, r.start if committed is None else int(committed)))
        return starts
    finally:
        consumer.close()
