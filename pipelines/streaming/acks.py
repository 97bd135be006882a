"""The streaming job's acknowledgement side: dead-letter writes and offset commits.

:class:`WriteDeadLettersFn` writes dead letters (mergeable Parquet files, optional
topic) and acknowledges their offsets; :class:`CommitOffsetsFn`, keyed by
partition, turns acknowledgements into consumer-group commits that never get
ahead of what is durable (:class:`pipelines.streaming.state.OffsetLedger`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
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
        self._registered: dict[int, int] = {}  # partition -> the offset a pending finalization commits

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
            self._consumer.get().commit({tp: OffsetAndMetadata(offset, self._config.commit_metadata, -1)})
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
    """

    #: The reader waits for the commits that checkpoints make.
    COMMITS_AT_END = False

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
        if offset <= self._registered.get(partition, -1):
            return
        self._registered[partition] = offset

        def commit() -> None:
            if not self._send(partition, offset):  # the next acknowledgement or tick registers again
                self._registered.pop(partition, None)

        finalizer.register(commit)


@dataclass
class _Commits:
    ledger: OffsetLedger
    committed: int = -1
    at: float = 0.0
