"""Where events come from: files or Kafka, decoded by one batch decoder into the same outputs.

:class:`ReadEvents` (JSONL / Parquet files) and :class:`ReadEventsFromKafka`
(partition ranges) both give tagged outputs ``events`` ((shard, EVENT table)
pairs), ``dead_letters`` (DEAD_LETTER tables) and ``counts`` (dicts), so
:func:`pipelines.features.pipeline.build_features` runs on either.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from pipelines.errors import BadInputError
from pipelines.features import reasons
from pipelines.features.decode import decode_events
from pipelines.features.parse import MAX_TIME_MS, ParseResult
from pipelines.features.validate import validate_event_table
from pipelines.io import arrow_coder  # noqa: F401 - registers the pa.Table coder
from pipelines.io.deadletters import dead_letter_table
from pipelines.io.files import Split, read_line_batches, read_row_group
from pipelines.io.payloads import Payloads
from pipelines.io.shards import split_by_shard
from pipelines.io.snapshot import COUNTS, DEAD, EVENTS
from pipelines.schemas.layouts import EVENT

if TYPE_CHECKING:  # the connector needs the kafka extra; files do not
    from pipelines.io.kafka.config import KafkaConnection
    from pipelines.io.kafka.consume import MessageBatch
    from pipelines.io.kafka.ranges import PartitionRange

__all__ = [
    "ReadEvents",
    "ReadEventsFromKafka",
    "ReadMetrics",
    "bad_file_result",
    "counts_of",
    "decode_batch",
    "decode_lines",
    "emit_parsed",
]

NAMESPACE = "features"
log = logging.getLogger(__name__)
EVENT_EMPTY = EVENT.schema.empty_table()


def decode_lines(
    lines: Sequence[bytes], sources: Sequence[str], stage: str = "parse", max_time_ms: int = MAX_TIME_MS
) -> ParseResult:
    """Events and dead letters of JSONL lines (``sources[i]`` names line ``i``), by the batch decoder."""
    return decode_events(Payloads.from_list(lines), lambda rows: [sources[int(i)] for i in rows], stage, max_time_ms)


def decode_batch(batch: MessageBatch, stage: str = "parse", max_time_ms: int = MAX_TIME_MS) -> ParseResult:
    """Events and dead letters of a Kafka :class:`~pipelines.io.kafka.consume.MessageBatch`."""
    return decode_events(batch.payloads, batch.sources, stage, max_time_ms)


def bad_file_result(path: str, problem: str) -> ParseResult:
    """A file skipped with ``--skip-bad-files``: one ``unreadable_file`` dead letter (source = the path)."""
    dead = dead_letter_table("parse", [(reasons.UNREADABLE_FILE, problem, b"", path)])
    return ParseResult(EVENT_EMPTY, dead)


@dataclass(frozen=True)
class ReadMetrics:
    """The Beam counters every read step keeps."""

    records: Any
    dead: Any

    @classmethod
    def create(cls, namespace: str) -> ReadMetrics:
        return cls(Metrics.counter(namespace, "records_in"), Metrics.counter(namespace, "dead_letters"))


#: Every read step reports these, so an empty input still gives a complete summary.
ZERO_COUNTS = {"records_in": 0, "dead_letters": 0}


def emit_parsed(result: ParseResult, num_shards: int, metrics: ReadMetrics) -> Iterator[Any]:
    """One parsed batch as the read outputs: (shard, EVENT table) pairs, tagged counts and dead letters."""
    metrics.records.inc(result.num_records)
    metrics.dead.inc(result.dead_letters.num_rows)
    yield TaggedOutput(COUNTS, counts_of(result))
    yield from split_by_shard(result.events, num_shards)
    if result.dead_letters.num_rows:
        yield TaggedOutput(DEAD, result.dead_letters)


def counts_of(result: ParseResult) -> dict[str, int]:
    """The count dict a read step emits for one parsed batch (any source with ReadEvents' outputs)."""
    reasons = Counter(result.dead_letters.column("reason").to_pylist())
    return {
        "records_in": result.num_records,
        "dead_letters": sum(reasons.values()),
        "max.event_time_ms": _max_event_ms(result.events),
        **{f"dead_letters.{r}": n for r, n in reasons.items()},
    }


def _max_event_ms(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.max(table.column("event_time")).cast(pa.int64()).as_py() or 0)


def _check_shards(num_shards: int) -> None:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")


class _ReadSplitFn(beam.DoFn):
    """A split → (shard, EVENT table) pairs (main), DEAD_LETTER tables and count dicts (tagged).

    A file that cannot be read to its end raises :class:`BadInputError` (naming it and how
    far it got) unless ``skip_bad_files``: then the batches read before the fault stay, and
    the file adds one ``unreadable_file`` dead letter and ``bad_files`` counts.
    """

    def __init__(self, batch_size: int, num_shards: int, max_time_ms: int, skip_bad_files: bool) -> None:
        self._batch_size = batch_size
        self._num_shards = num_shards
        self._max_time_ms = max_time_ms
        self._skip_bad_files = skip_bad_files

    def setup(self) -> None:
        self._metrics = ReadMetrics.create(NAMESPACE)

    def process(self, split: Split) -> Iterator[Any]:
        yield TaggedOutput(COUNTS, dict(ZERO_COUNTS))
        try:
            if split.error is not None:
                raise BadInputError(split.error)
            for result in self._parse(split):
                yield from emit_parsed(result, self._num_shards, self._metrics)
        except BadInputError as exc:
            if not self._skip_bad_files:
                raise
            log.warning("skipping the rest of a bad file: %s", exc)
            yield TaggedOutput(COUNTS, {"bad_files": 1, f"bad_files.{split.path}": 1})
            yield from emit_parsed(bad_file_result(split.path, str(exc)), self._num_shards, self._metrics)

    def _parse(self, split: Split) -> Iterator[ParseResult]:
        if split.row_group is not None:
            yield validate_event_table(read_row_group(split), split.path, split.first_row, self._max_time_ms)
            return
        for lines, sources in read_line_batches(split.path, self._batch_size):
            yield decode_lines(lines, sources, max_time_ms=self._max_time_ms)


class ReadEvents(beam.PTransform):
    """Splits → tagged outputs ``events`` ((shard, EVENT table) pairs), ``dead_letters``, ``counts``."""

    def __init__(
        self,
        splits: Sequence[Split],
        *,
        num_shards: int,
        batch_size: int = 100_000,
        max_time_ms: int = MAX_TIME_MS,
        skip_bad_files: bool = False,
    ) -> None:
        super().__init__()
        if not splits:
            raise ValueError("ReadEvents needs at least one split")
        _check_shards(num_shards)
        self._splits = list(splits)
        self._batch_size = batch_size
        self._num_shards = num_shards
        self._max_time_ms = max_time_ms
        self._skip_bad_files = skip_bad_files

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Splits" >> beam.Create(self._splits)
            | "Reshuffle" >> beam.Reshuffle()
            | "Parse"
            >> beam.ParDo(_ReadSplitFn(self._batch_size, self._num_shards, self._max_time_ms, self._skip_bad_files))
            .with_output_types(tuple[int, pa.Table])
            .with_outputs(DEAD, COUNTS, main=EVENTS)
        )


class _DecodeBatchFn(beam.DoFn):
    """A Kafka message batch → (shard, EVENT table) pairs, DEAD_LETTER tables and count dicts."""

    def __init__(self, num_shards: int, max_time_ms: int) -> None:
        self._num_shards = num_shards
        self._max_time_ms = max_time_ms

    def setup(self) -> None:
        self._metrics = ReadMetrics.create("kafka")

    def process(self, batch: MessageBatch) -> Iterator[Any]:
        yield from emit_parsed(decode_batch(batch, max_time_ms=self._max_time_ms), self._num_shards, self._metrics)


class ReadEventsFromKafka(beam.PTransform):
    """Partition ranges → tagged outputs ``events``, ``dead_letters``, ``counts`` (as :class:`ReadEvents`).

    The connector (:class:`pipelines.io.kafka.beam.ReadFromKafka`) fetches the
    raw messages; this step decodes them with the same decoder as files.
    """

    def __init__(
        self,
        connection: KafkaConnection,
        ranges: Sequence[PartitionRange],
        *,
        num_shards: int,
        backend: str = "kafka-python",
        max_batch: int = 20_000,
        keep_buffers: bool = False,
        max_time_ms: int = MAX_TIME_MS,
    ) -> None:
        super().__init__()
        from pipelines.io.kafka.beam import ReadFromKafka

        _check_shards(num_shards)
        self._read = ReadFromKafka(connection, ranges, backend=backend, max_batch=max_batch, keep_buffers=keep_buffers)
        self._num_shards = num_shards
        self._max_time_ms = max_time_ms

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Fetch" >> self._read
            | "Decode"
            >> beam.ParDo(_DecodeBatchFn(self._num_shards, self._max_time_ms))
            .with_output_types(tuple[int, pa.Table])
            .with_outputs(DEAD, COUNTS, main=EVENTS)
        )
