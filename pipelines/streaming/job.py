"""Streaming histories: Kafka (unbounded) → per-user keyed state + event-time timers → flush files,
representations, commits. One graph, the same on Prism and Flink:

1. ``ReadPartition`` (an unbounded splittable DoFn per partition, its watermark the wall
   clock) polls from the consumer group's committed offset, decodes each batch with the
   batch decoder and emits (user_id, EVENT table + ``_partition``/``_offset``) pairs
   stamped with the time read, dead letters, and acknowledgements for offsets that hold
   no record;
2. ``AppendHistories`` (:class:`pipelines.streaming.keyed.AppendUserHistoryFn`) is keyed
   by user: it buffers the user's events and, at an event-time timer ``flush_interval_s``
   after the first, merges them into the user's history (late events go to their place
   by event time, duplicates are dropped) and emits the changed row with its offsets;
3. with ``--rep-history N``, the flush also appends the new events' historical representations
   to the user's row (:mod:`pipelines.streaming.rep_history`) and ``WriteRepHistories`` writes
   them as flush files under ``rep_history/`` before anything goes on;
   ``WriteHistories`` writes a bundle's changed rows as one flush file per shard
   (atomically) and publishes them when asked; with a model and a store, ``Refresh``
   (Beam's RunInference with :class:`pipelines.streaming.refresh.RefreshModelHandler`)
   writes their representations to the online store; only then do their acknowledgements go on;
4. dead letters are written (Parquet, optional topic) and acknowledged likewise;
5. ``CommitOffsets``, keyed by partition, commits to the group the first offset not yet
   durable (:class:`pipelines.streaming.state.OffsetLedger`); on Flink
   (``config.checkpointed``) only once a checkpoint covering the acknowledgement completes.

With ``--candidates-topic`` a second reader feeds the funnel's candidate sets into the same
keyed step, where each meets its user's state, and ``Pairs`` writes their pair
representations before their offsets are committed (:mod:`pipelines.streaming.pairs`).

So a commit never gets ahead of what is durable. After a crash (even SIGKILL) the job
restarts from the committed offsets (on Flink: from its checkpoint), and the merge drops
events that a history already holds (same event_id): no event lost, none counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.typehints.native_type_compatibility import convert_to_beam_type
from apache_beam.utils.timestamp import Duration

from pipelines.features.decode import decode_indexed
from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.consume import PartitionPoller
from pipelines.io.kafka.outage import LazyClient, broker_watch
from pipelines.streaming.acks import CommitOffsetsFn, CommitOnCheckpointFn, WriteDeadLettersFn
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.keyed import (
    FLUSHED,
    FLUSHED_WITH_REPS,
    PENDING,
    AppendUserHistoryFn,
    WalltimeWatermark,
    WriteHistoriesFn,
    split_by_user,
)
from pipelines.streaming.refresh import Refresh
from pipelines.streaming.state import OFFSET, PARTITION

__all__ = ["DRAIN", "PartitionStart", "StreamConfig", "build_stream", "start_offsets"]

log = logging.getLogger(__name__)

ACKS, DEAD = "acks", "dead_letters"
_END = 2**62
#: On a quiet topic, the least time between two empty acknowledgements of a partition (they let its
#: commits catch up); the flush interval when longer.
QUIET_TICK_S = 0.25
#: Set in the job's own process (SIGTERM on Prism, whose workers run there): every read ends, and the
#: graph drains as at an idle exit: what was read is flushed, written and committed, then the job ends.
DRAIN = threading.Event()


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


# Beam takes restrictions and watermark estimators as parameter defaults; module-level singletons keep that readable.
RESTRICTION = beam.DoFn.RestrictionParam(_Restrictions())
WATERMARK = beam.DoFn.WatermarkEstimatorParam(WalltimeWatermark())


class _ReadPartitionFn(beam.DoFn):
    """One partition, unbounded: each call emits one polled batch (or waits up to 0.5 s), then checkpoints."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        from kafka import KafkaConsumer

        self._watch = broker_watch(self._connection, self._config.broker_timeout_s)
        self._poller = PartitionPoller(self._connection, watch=self._watch)
        # Connected on first use: a worker that starts during an outage must not fail its setup.
        self._group = LazyClient(
            lambda: KafkaConsumer(
                **self._connection.kafka_python(), group_id=self._config.group, enable_auto_commit=False
            )
        )
        self._idle_since: dict[int, float] = {}
        self._last_tick: dict[int, float] = {}
        self._commits: dict[int, tuple[int, float]] = {}  # partition -> (committed, when looked up)

    @beam.DoFn.unbounded_per_element()
    def process(self, element: PartitionStart, tracker: Any = RESTRICTION, watermark: Any = WATERMARK) -> Iterator[Any]:
        position = tracker.current_restriction().start
        # A bundle's output moves on only when the bundle ends: so end it as soon as one
        # batch is out (or after a short idle wait), and resume from a checkpoint.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if DRAIN.is_set():
                log.info("%s/%s: draining: this read ends at %d", element.topic, element.partition, position)
                tracker.try_claim(_END)
                return
            batch, after = self._poller.poll(element.topic, element.partition, position, timeout_s=0.1)
            if after > position and not tracker.try_claim(after - 1):
                return
            if batch is None:
                if after > position:  # offsets without a record (transaction markers, compaction)
                    yield TaggedOutput(ACKS, (element.partition, np.arange(position, after, dtype=np.int64)))
                    position = after
                if self._ends_when_quiet:
                    self._look_up_commit(element)
                if self._idle(element.partition, position):
                    log.info(
                        "%s/%s: quiet and committed up to %d: this read ends",
                        element.topic,
                        element.partition,
                        position,
                    )
                    tracker.try_claim(_END)  # done: the restriction is finished
                    return
                yield from self._ticks(element.partition)
                continue
            self._idle_since.pop(element.partition, None)
            yield from self._emit(element, batch, position, after)
            break
        tracker.defer_remainder(Duration.of(0.0))

    def _ticks(self, partition: int) -> Iterator[Any]:
        """On a quiet topic, now and then an empty acknowledgement: the committer commits when an
        acknowledgement arrives, so what was acknowledged since its last commit gets committed."""
        now = time.monotonic()
        if now - self._last_tick.get(partition, 0.0) >= max(self._config.flush_interval_s, QUIET_TICK_S):
            self._last_tick[partition] = now
            yield TaggedOutput(ACKS, (partition, np.zeros(0, np.int64)))

    @property
    def _ends_when_quiet(self) -> bool:
        """Whether a quiet read that is all committed ends by itself: ``--idle-exit`` without keyed
        state (see :meth:`_idle`). Only then is the group's commit looked up."""
        return self._config.idle_exit_s is not None and not self._config.checkpointed

    def _idle(self, partition: int, position: int) -> bool:
        """No message for ``idle_exit_s`` and everything read is committed (so nothing is left behind).
        Never with keyed state (Flink): there the driver ends the job once the whole topic is
        committed (:mod:`pipelines.streaming.drive`), and a partition whose read had ended would
        never be read again, so records arriving after a quiet spell would wait forever."""
        limit = self._config.idle_exit_s
        if limit is None or not self._ends_when_quiet:
            return False
        if self._watch.down:  # a broker away is no quiet topic
            self._idle_since.pop(partition, None)
            return False
        since = self._idle_since.setdefault(partition, time.monotonic())
        committed = self._commits.get(partition, (-1, 0.0))[0]
        return time.monotonic() - since > limit and committed >= position

    def _look_up_commit(self, element: PartitionStart) -> None:
        """The group's committed offset of this partition, looked up at most once a second while the
        partition is quiet, for :meth:`_idle` (which ends a quiet read only once everything read is
        committed)."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        p, now = element.partition, time.monotonic()
        seen, checked = self._commits.get(p, (-1, 0.0))
        if now - checked < 1.0:
            return
        try:
            found = self._group.get().committed(TopicPartition(element.topic, p))
        except KafkaError as exc:  # broker away: look again later
            self._watch.failed(exc)
            self._commits[p] = (seen, now)
            return
        self._watch.ok()
        self._commits[p] = (element.start if found is None else int(found), now)

    def _emit(self, element: PartitionStart, batch: Any, position: int, after: int) -> Iterator[Any]:
        decoded = decode_indexed(batch.payloads, batch.sources, max_time_ms=self._config.max_time_ms())
        events = decoded.result.events
        _record_read(events.num_rows, decoded.result.dead_letters)
        offsets = batch.offsets
        events = events.append_column(PARTITION, pa.array(np.full(events.num_rows, element.partition, np.int32)))
        events = events.append_column(OFFSET, pa.array(offsets[decoded.event_rows]))
        stamp = time.time()  # per user, stamped now: the user's flush timer is stamp + flush interval
        yield from (TimestampedValue(kv, stamp) for kv in split_by_user(events))
        if len(decoded.dead_rows):
            yield TaggedOutput(DEAD, (element.partition, offsets[decoded.dead_rows], decoded.result.dead_letters))
        yield from _gaps(element.partition, position, after, offsets)

    def teardown(self) -> None:
        # A cancelled job (SIGTERM) tears the reader down while a bundle thread may still be polling:
        # kafka-python then refuses the concurrent close, which matters no more once the worker goes.
        for client in (self._poller, self._group):
            try:
                client.close()
            except RuntimeError as exc:
                log.debug("closing %s at teardown: %s", type(client).__name__, exc)


class _ReadCandidateSetsFn(_ReadPartitionFn):
    """A partition of the candidates topic: each polled batch's sets of the configured stage, one table
    per user, stamped with the time read (:func:`pipelines.streaming.pairs.keyed_sets`); unreadable
    ones as dead letters; other stages' offsets, and the sets already past their deadline (shed,
    counted as late), acknowledged at once."""

    def _emit(self, element: PartitionStart, batch: Any, position: int, after: int) -> Iterator[Any]:
        from pipelines.io.deadletters import dead_letter_table
        from pipelines.io.kafka.candidate_sets import decode_candidate_sets
        from pipelines.streaming.metrics import shared_metrics
        from pipelines.streaming.pairs import count_late, keyed_sets, shed_count

        payloads = batch.payloads.take(np.arange(len(batch)))
        decoded = decode_candidate_sets(payloads)
        stamp = time.time()
        shed_after = int(stamp * 1000) - int(self._config.deadline_grace_s * 1000)
        sets, done, shed = keyed_sets(decoded, element.partition, batch.offsets, self._config.stage, shed_after)
        yield from (TimestampedValue(kv, stamp) for kv in sets)
        count_late(shared_metrics("stream"), *shed_count(shed))
        if len(done):
            yield TaggedOutput(ACKS, (element.partition, done))
        bad = np.asarray(sorted(decoded.bad), np.int64)
        dead = dead_letter_table(
            "candidates",
            [
                (decoded.bad[i], "not a candidate set (see the reason)", payloads[i], source)
                for i, source in zip(bad.tolist(), batch.sources(bad), strict=True)
            ],
        )
        _record_read(len(batch) - len(bad), dead, kind="candidate_sets")
        if len(bad):
            yield TaggedOutput(DEAD, (element.partition, batch.offsets[bad], dead))
        yield from _gaps(element.partition, position, after, batch.offsets)


def _gaps(partition: int, position: int, after: int, offsets: np.ndarray) -> Iterator[TaggedOutput]:
    """Acknowledgements of the offsets in [position, after) that held no record."""
    gaps = np.setdiff1d(np.arange(position, after, dtype=np.int64), offsets)
    if len(gaps):
        yield TaggedOutput(ACKS, (partition, gaps))


def _record_read(events: int, dead_letters: pa.Table, kind: str = "events") -> None:
    from pipelines.streaming.metrics import shared_metrics

    metrics = shared_metrics("stream")
    metrics.read(kind, events)
    if dead_letters.num_rows:
        for reason, n in Counter(dead_letters.column("reason").to_pylist()).items():
            metrics.dead(reason, n)


def build_stream(
    p: beam.Pipeline, connection: KafkaConnection, config: StreamConfig, starts: Sequence[PartitionStart]
) -> None:
    """Add the streaming histories job to ``p`` (a streaming pipeline); ``starts`` name every partition
    of ``config.topics``."""
    read = _read(p, _ReadPartitionFn(connection, config), starts, config.topic, "")
    events = read["events"]
    sets, candidates = None, config.candidates_topic
    if candidates is not None:
        sets = _read(p, _ReadCandidateSetsFn(connection, config), starts, candidates, "CandidateSets")
        events = (events, sets["events"]) | "EventsAndSets" >> beam.Flatten().with_output_types(tuple[int, pa.Table])
    appended, pending = _append_histories(events, config)
    flushed = appended | "WriteHistories" >> beam.ParDo(WriteHistoriesFn(connection, config)).with_output_types(FLUSHED)
    if config.refresh:
        acks = flushed | "Refresh" >> Refresh(config)
    else:
        acks = flushed | "FlushedAcks" >> beam.FlatMap(lambda done: done[1])
    _commit(connection, config, starts, config.topic, "", [acks, *_written(read, connection, config, "")])
    if candidates is not None and sets is not None and pending is not None:
        from pipelines.streaming.pairs import ComputePairs

        pairs = pending | "Pairs" >> ComputePairs(config)
        prefix = "CandidateSets"
        acks = [pairs, *_written(sets, connection, config, prefix)]
        _commit(connection, config, starts, candidates, prefix, acks)


def _read(p: beam.Pipeline, reader: _ReadPartitionFn, starts: Sequence[PartitionStart], topic: str, prefix: str) -> Any:
    """Every partition of ``topic``, read by ``reader``: keyed tables (``events``), dead letters and
    acknowledgements."""
    return (
        p
        | f"{prefix}Partitions" >> beam.Create([s for s in starts if s.topic == topic])
        | f"Read{prefix or 'Partition'}"
        >> beam.ParDo(reader).with_output_types(tuple[int, pa.Table]).with_outputs(ACKS, DEAD, main="events")
    )


def _written(read: Any, connection: KafkaConnection, config: StreamConfig, prefix: str) -> list[beam.PCollection]:
    """A reader's dead letters written (then acknowledged), and its own acknowledgements."""
    written = read[DEAD] | f"Write{prefix}DeadLetters" >> beam.ParDo(WriteDeadLettersFn(connection, config))
    return [written, read[ACKS]]


def _commit(
    connection: KafkaConnection,
    config: StreamConfig,
    starts: Sequence[PartitionStart],
    topic: str,
    prefix: str,
    acks: list[beam.PCollection],
) -> None:
    """Commit ``topic``'s acknowledged offsets to the group (on Flink once a checkpoint covers them)."""
    import dataclasses

    commit = CommitOnCheckpointFn if config.checkpointed else CommitOffsetsFn
    begin = {s.partition: s.start for s in starts if s.topic == topic}
    config = dataclasses.replace(config, topic=topic, candidates_topic=None)  # what the committer commits
    _ = (
        tuple(acks)
        | f"All{prefix}Acks" >> beam.Flatten()
        | f"Commit{prefix}Offsets" >> beam.ParDo(commit(connection, config, begin))
    )


def _append_histories(events: beam.PCollection, config: StreamConfig) -> tuple[beam.PCollection, Any]:
    """The keyed flush; with ``--rep-history``, keeping the historical representations and writing them.
    Second, with ``--candidates-topic``: the (history row, candidate sets) that met in the keyed state."""
    reps = None
    if config.rep_history:
        from pipelines.streaming.rep_history import RepHistoryStep  # imports torch

        reps = RepHistoryStep(config)
    step = beam.ParDo(AppendUserHistoryFn(config, reps)).with_output_types(FLUSHED_WITH_REPS if reps else FLUSHED)
    pending = None
    if config.candidates_topic is None:
        appended = events | "AppendHistories" >> step
    else:
        from pipelines.streaming.pairs import PAIRS

        outputs = events | "AppendHistories" >> step.with_outputs(PAIRS, main="flushed")
        appended, pending = outputs["flushed"], outputs[PAIRS]
        pending.element_type = convert_to_beam_type(PENDING)  # tables cross stages in ArrowTableCoder, never pickled
    if reps is None:
        return appended, pending
    from pipelines.streaming.rep_history import WriteRepHistoriesFn

    written = appended | "WriteRepHistories" >> beam.ParDo(WriteRepHistoriesFn(config)).with_output_types(FLUSHED)
    return written, pending


#: partition -> (committed offset, commit metadata), None where the group has committed nothing.
Commits = dict[int, tuple[int, str] | None]


def start_offsets(
    connection: KafkaConnection, topic: str, group: str, fallback: Any
) -> tuple[list[PartitionStart], Commits]:
    """Per partition: the group's committed offset, else ``fallback`` (a :class:`Position`) resolved;
    and the group's commits as they are (see :mod:`pipelines.streaming.ownership`)."""
    from kafka import KafkaConsumer, TopicPartition

    from pipelines.io.kafka.consume import open_lookup
    from pipelines.io.kafka.ranges import resolve_ranges

    lookup = open_lookup(connection)
    try:
        ranges = resolve_ranges(lookup, topic, fallback, fallback)
    finally:
        lookup.close()
    consumer = KafkaConsumer(**connection.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        starts, commits = [], {}
        for r in ranges:
            found = consumer.committed(TopicPartition(topic, r.partition), metadata=True)
            commits[r.partition] = None if found is None else (int(found.offset), str(found.metadata or ""))
            starts.append(PartitionStart(topic, r.partition, r.start if found is None else int(found.offset)))
        return starts, commits
    finally:
        consumer.close()
