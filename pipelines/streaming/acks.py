"""The streaming job's acknowledgement side: dead-letter writes and offset commits.

:class:`WriteDeadLettersFn` writes dead letters (mergeable Parquet files, optional
topic) and acknowledges their offsets; :class:`CommitOffsetsFn`, keyed by
partition, turns acknowledgements into consumer-group commits that never get
ahead of what is durable (:class:`pipelines.streaming.state.OffsetLedger`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow

from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.state import OffsetLedger, path_lock

__all__ = ["CommitOffsetsFn", "CommitOnCheckpointFn", "WriteDeadLettersFn", "open_sink"]

log = logging.getLogger(__name__)

_DEAD_BLOCK = 100_000
_COMMIT_TIMEOUT_MS = 10_000  # a commit that hangs fails, and is tried again
_LEDGER = ReadModifyWriteStateSpec("ledger", PickleCoder())
_COMMIT_AT_END = TimerSpec("commit_at_end", TimeDomain.WATERMARK)
LEDGER, COMMIT_AT_END, KEY = beam.DoFn.StateParam(_LEDGER), beam.DoFn.TimerParam(_COMMIT_AT_END), beam.DoFn.KeyParam


def open_sink(connection: KafkaConnection, topic: str | None) -> Any:
    if topic is None:
        return None
    from pipelines.io.kafka.produce import KafkaSink

    return KafkaSink(connection, topic, linger_ms=5)


class WriteDeadLettersFn(beam.DoFn):
    """(partition, offsets, DEAD_LETTER table) → a Parquet file (+ topic), then acknowledges the offsets."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._sink = open_sink(self._connection, self._config.dead_letter_topic)

    def process(self, element: tuple[int, np.ndarray, pa.Table]) -> Iterator[tuple[int, np.ndarray]]:
        import pyarrow.parquet as pq

        from pipelines.io.parquet import conform
        from pipelines.schemas.layouts import DEAD_LETTER

        partition, offsets, dead = element
        # One file per partition and block of offsets, merged on write: a dead letter read
        # again (redelivery, restart) replaces itself instead of appearing twice.
        blocks = offsets // _DEAD_BLOCK
        for block in np.unique(blocks):
            path = Path(self._config.output, "dead_letters", f"p{partition:05d}-b{block:012d}.parquet")
            with path_lock(path):
                part = dead.filter(pa.array(blocks == block))
                if path.exists():
                    part = pa.concat_tables([pq.read_table(path).cast(DEAD_LETTER.schema), conform(part, DEAD_LETTER)])
                    sources = part.column("source").to_numpy(zero_copy_only=False)
                    _, first = np.unique(sources, return_index=True)
                    part = part.take(pa.array(np.sort(first)))
                tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
                pq.write_table(conform(part, DEAD_LETTER), tmp)
                tmp.replace(path)
        if self._sink is not None:
            from pipelines.io.kafka.encode import dead_letters_to_json

            self._sink.send_many(dead_letters_to_json(dead))
            self._sink.flush()
        yield partition, offsets

    def teardown(self) -> None:
        if self._sink is not None:
            self._sink.close()


class CommitOffsetsFn(beam.DoFn):
    """Keyed by partition: commits the first offset not yet durable to the consumer group.

    A commit is a broker round trip: advances are committed at most
    every ``COMMIT_INTERVAL_S`` (the reader's empty acknowledgements keep this
    going on a quiet topic), and once more when the input ends.

    This DoFn takes no bundle finalizer: a DoFn that does makes Prism send a
    FinalizeBundle request after every bundle of its stage, and the SDK answers one
    for a bundle that registered no callback with a logged ``RuntimeError: Bundle is
    not in a finalizable state`` (dozens per run). Only :class:`CommitOnCheckpointFn`
    asks for finalization, where it is used.
    """

    COMMIT_INTERVAL_S = 0.5
    COMMITS_AT_END = True

    def __init__(self, connection: KafkaConnection, config: StreamConfig, starts: dict[int, int]) -> None:
        self._connection, self._config, self._starts = connection, config, dict(starts)

    def setup(self) -> None:
        from kafka import KafkaConsumer

        from pipelines.io.kafka.outage import LazyClient, broker_watch

        self._watch = broker_watch(self._connection, self._config.broker_timeout_s)
        self._consumer = LazyClient(
            lambda: KafkaConsumer(
                **self._connection.kafka_python(), group_id=self._config.group, enable_auto_commit=False
            )
        )

    def process(self, element: tuple[int, np.ndarray], ledger: Any = LEDGER, end: Any = COMMIT_AT_END) -> None:
        partition, book = self._add(element, ledger, end)
        if time.monotonic() - book.at >= self.COMMIT_INTERVAL_S:
            self._commit(partition, book)
        ledger.write(book)

    def _add(self, element: tuple[int, np.ndarray], ledger: Any, end: Any) -> tuple[int, _Commits]:
        partition, offsets = element
        book = ledger.read()
        if book is None:
            book = _Commits(OffsetLedger(self._starts[partition]))
            end.set(GlobalWindow().max_timestamp())
        book.ledger.add(offsets)
        return partition, book

    @on_timer(_COMMIT_AT_END)
    def on_end(self, partition: Any = KEY, ledger: Any = LEDGER) -> None:
        book = ledger.read()
        if book is not None and self.COMMITS_AT_END:
            self._commit(partition, book)
            ledger.write(book)

    def _commit(self, partition: int, book: _Commits) -> None:
        book.at = time.monotonic()
        if book.ledger.next > book.committed and self._send(partition, book.ledger.next):
            book.committed = book.ledger.next

    def _send(self, partition: int, offset: int) -> bool:
        from kafka import TopicPartition
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        tp = TopicPartition(self._config.topic, partition)
        try:
            commit = {tp: OffsetAndMetadata(offset, self._config.commit_metadata, -1)}
            self._consumer.get().commit(commit, timeout_ms=_COMMIT_TIMEOUT_MS)  # a timeout is a KafkaError
        except KafkaError as exc:  # broker away: the watch logs the outage once, and bounds it
            log.debug("%s/%s: commit of %d failed (%r); retrying later", tp.topic, partition, offset, exc)
            self._watch.failed(exc)
            return False
        self._watch.ok()
        return True

    def teardown(self) -> None:
        self._consumer.close()


class CommitOnCheckpointFn(CommitOffsetsFn):
    """:class:`CommitOffsetsFn` for keyed state on a checkpointing runner (Flink).

    Nothing is committed in the bundle: the bundle registers a finalization callback
    that commits the ledger's ``next`` as of the bundle, and the runner calls it only
    once a checkpoint that covers the bundle has completed (Flink:
    ``notifyCheckpointComplete``). So a committed offset is both flushed to the files and
    covered by the runner's state: a restore from the last checkpoint never sits behind
    the group's offsets.

    The callbacks of one partition share one :class:`_PartitionCommits` per worker process
    (a partition is one key: one subtask, one process). The runner holds a bundle's DoFn
    instance until its finalization, so several instances, finalized on several threads,
    commit one partition: the shared record serializes their commits and keeps them in
    order (an older offset never overwrites a newer one). A callback can also never come
    (a finalization request lost between runner and worker): a registration not followed
    by a commit within :attr:`REREGISTER_S` is registered again by the next
    acknowledgement (the reader sends an empty one now and then on a quiet partition), so
    the end of a topic is always committed.
    """

    #: The reader waits for the commits that checkpoints make.
    COMMITS_AT_END = False
    #: A registration older than this, still uncommitted, is registered again.
    REREGISTER_S = 5.0

    def process(  # type: ignore[override,unused-ignore]
        self,
        element: tuple[int, np.ndarray],
        ledger: Any = LEDGER,
        end: Any = COMMIT_AT_END,
        finalizer: Any = beam.DoFn.BundleFinalizerParam,
    ) -> None:
        partition, book = self._add(element, ledger, end)
        self._commit_when_checkpointed(partition, book.ledger.next, finalizer)
        ledger.write(book)

    def _commit_when_checkpointed(self, partition: int, offset: int, finalizer: Any) -> None:
        shared = _partition_commits(self._connection, self._config, partition)
        if not shared.should_register(offset, time.monotonic(), self.REREGISTER_S):
            return

        def commit() -> None:
            shared.commit(offset, lambda: self._send(partition, offset))

        finalizer.register(commit)


class _PartitionCommits:
    """One partition's commits in this process: the offset committed, the one registered (and
    when); one lock puts the callbacks' sends in order, another guards the fields (so a bundle
    that registers never waits on a send)."""

    def __init__(self) -> None:
        self.committed, self.registered, self.registered_at = -1, -1, 0.0
        self._fields, self._sending = threading.Lock(), threading.Lock()

    def should_register(self, offset: int, now: float, stale_s: float) -> bool:
        with self._fields:
            if offset <= self.committed:
                return False
            if offset <= self.registered and now - self.registered_at < stale_s:
                return False
            self.registered, self.registered_at = max(offset, self.registered), now
            return True

    def commit(self, offset: int, send: Callable[[], bool]) -> None:
        """``send()`` commits ``offset`` unless a later offset is already committed; a failed send
        lets the next acknowledgement register again."""
        with self._sending:
            with self._fields:
                if offset <= self.committed:
                    return
            sent = send()
            with self._fields:
                if sent:
                    self.committed = offset
                else:
                    self.registered = -1


_COMMITS: dict[tuple[str, str, str, int], _PartitionCommits] = {}
_COMMITS_LOCK = threading.Lock()


def _partition_commits(connection: KafkaConnection, config: StreamConfig, partition: int) -> _PartitionCommits:
    key = (",".join(connection.bootstrap_servers), config.topic, config.group, partition)
    with _COMMITS_LOCK:
        return _COMMITS.setdefault(key, _PartitionCommits())


@dataclass
class _Commits:
    ledger: OffsetLedger
    committed: int = -1
    at: float = 0.0
