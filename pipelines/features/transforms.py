"""Thin Beam wrappers around the pure features logic.

Elements are Arrow tables (never per-event dicts) except at the parse edge;
counts travel as small dicts and are summed into ``summary.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from pipelines.features.examples import LabelWindows
from pipelines.features.histories import build_histories
from pipelines.features.parse import ParseResult, parse_json_lines
from pipelines.features.sharding import split_by_shard
from pipelines.features.validate import validate_event_table
from pipelines.io import arrow_coder  # noqa: F401 - registers the pa.Table coder
from pipelines.io.files import SUMMARY, Split, join, read_line_batches, read_row_group
from pipelines.io.parquet import read_table, write_table
from schemas.layouts import DEAD_LETTER, EVENT, HISTORY, TRAINING_EXAMPLE, Layout

__all__ = ["BuildHistories", "GroupByShard", "ReadEvents", "WriteDeadLetters", "WriteSummary", "counts_of"]

NAMESPACE = "features"
WRITE_THREADS = 2
EVENTS, DEAD, COUNTS = "events", "dead_letters", "counts"


def shard_path(root: str, kind: str, shard: int) -> str:
    return join(root, kind, f"shard={shard:05d}", "part-00000.parquet")


class _ReadSplitFn(beam.DoFn):
    """A split → (shard, EVENT table) pairs (main), DEAD_LETTER tables and count dicts (tagged)."""

    def __init__(self, batch_size: int, num_shards: int) -> None:
        self._batch_size = batch_size
        self._num_shards = num_shards

    def setup(self) -> None:
        self._metrics = ReadMetrics.create(NAMESPACE)

    def process(self, split: Split) -> Iterator[Any]:
        for result in self._parse(split):
            yield from emit_parsed(result, self._num_shards, self._metrics)

    def _parse(self, split: Split) -> Iterator[Any]:
        if split.row_group is not None:
            yield validate_event_table(read_row_group(split), split.path, split.first_row)
            return
        for lines, sources in read_line_batches(split.path, self._batch_size):
            yield parse_json_lines(lines, sources)


class ReadEvents(beam.PTransform):
    """Splits → tagged outputs ``events`` ((shard, EVENT table) pairs), ``dead_letters``, ``counts``."""

    def __init__(self, splits: Sequence[Split], *, num_shards: int, batch_size: int = 100_000) -> None:
        super().__init__()
        if not splits:
            raise ValueError("ReadEvents needs at least one split")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._splits = list(splits)
        self._batch_size = batch_size
        self._num_shards = num_shards

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Splits" >> beam.Create(self._splits)
            | "Reshuffle" >> beam.Reshuffle()
            | "Parse" >> beam.ParDo(_ReadSplitFn(self._batch_size, self._num_shards))
            .with_output_types(tuple[int, pa.Table])
            .with_outputs(DEAD, COUNTS, main=EVENTS)
        )


@dataclass(frozen=True)
class ReadMetrics:
    """The Beam counters every read step keeps."""

    records: Any
    dead: Any

    @classmethod
    def create(cls, namespace: str) -> ReadMetrics:
        return cls(Metrics.counter(namespace, "records_in"), Metrics.counter(namespace, "dead_letters"))


def emit_parsed(result: ParseResult, num_shards: int, metrics: ReadMetrics) -> Iterator[Any]:
    """One parsed batch as ReadEvents' outputs: (shard, EVENT table) pairs, tagged counts and dead letters."""
    metrics.records.inc(result.num_records)
    metrics.dead.inc(result.dead_letters.num_rows)
    yield TaggedOutput(COUNTS, counts_of(result))
    yield from split_by_shard(result.events, num_shards)
    if result.dead_letters.num_rows:
        yield TaggedOutput(DEAD, result.dead_letters)


def counts_of(result: ParseResult) -> dict[str, int]:
    """The count dict a read step emits for one parsed batch (any source with ReadEvents' outputs)."""
    reasons = Counter(result.dead_letters.column("reason").to_pylist())
    return {"records_in": result.num_records, "dead_letters": sum(reasons.values()),
            "max.event_time_ms": _max_event_ms(result.events),
            **{f"dead_letters.{r}": n for r, n in reasons.items()}}


def _max_event_ms(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.max(table.column("event_time")).cast(pa.int64()).as_py() or 0)


def _is_history(table: pa.Table) -> bool:
    return "events" in table.column_names


def _concat(tables: Iterable[pa.Table]) -> pa.Table | None:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None


class _BuildShardFn(beam.DoFn):
    """(shard, {events, previous}) → writes that shard's histories and examples; yields counts.

    Parquet writes (single-threaded encode + zstd, GIL released) run on a small
    thread pool while the next shard builds; ``finish_bundle`` waits for them, so
    a bundle only commits once its files are written (a failed write fails it).
    """

    def __init__(self, output: str, max_history: int, windows: LabelWindows) -> None:
        self._output = output
        self._max_history = max_history
        self._windows = windows

    def setup(self) -> None:
        self._users = Metrics.counter(NAMESPACE, "histories")
        self._examples = Metrics.counter(NAMESPACE, "training_examples")
        self._writer = ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="parquet-write")
        self._pending: list[Future] = []

    def finish_bundle(self) -> None:
        pending, self._pending = self._pending, []
        for write in pending:
            write.result()

    def teardown(self) -> None:
        self._writer.shutdown(wait=True)

    def process(self, element: tuple[int, Iterable[pa.Table]], counts: dict[str, int]) -> Iterator[dict]:
        shard, tables = element
        tables = list(tables)
        events = _concat(t for t in tables if not _is_history(t)) or EVENT.schema.empty_table()
        previous = _concat(t for t in tables if _is_history(t))
        watermark_ms = counts.get("max.event_time_ms", 0)
        build = build_histories(events, previous, max_history=self._max_history,
                                watermark_ms=watermark_ms or None, windows=self._windows)
        self._write(build.histories, shard_path(self._output, "histories", shard), HISTORY)
        self._write(build.examples, shard_path(self._output, "training_examples", shard), TRAINING_EXAMPLE)
        self._users.inc(build.histories.num_rows)
        self._examples.inc(build.examples.num_rows)
        yield {
            "events_valid": events.num_rows - build.duplicates - build.duplicates_previous,
            "duplicates": build.duplicates,
            "duplicates_previous": build.duplicates_previous,
            "evicted": build.evicted,
            "histories": build.histories.num_rows,
            "training_examples": build.examples.num_rows,
            "shards_written": 1,
        }

    def _write(self, table: pa.Table, path: str, layout: Layout) -> None:
        self._pending.append(self._writer.submit(write_table, table, path, layout))


class GroupByShard(beam.PTransform):
    """Several PCollections of (shard, pa.Table) → (shard, [tables]) in one shuffle (Arrow coder)."""

    def expand(self, keyed: tuple[beam.PCollection, ...]) -> beam.PCollection:
        return (
            keyed
            | "Flatten" >> beam.Flatten().with_output_types(tuple[int, pa.Table])
            | "GroupByKey" >> beam.GroupByKey()
        )


class BuildHistories(beam.PTransform):
    """(shard, EVENT table) pairs (+ previous HISTORY files) → per-shard Parquet; outputs count dicts.

    ``counts`` is a singleton side input of the read counts (its ``max.event_time_ms``
    is the snapshot's watermark).
    """

    def __init__(self, output: str, counts: beam.pvalue.AsSingleton, *, previous: Sequence[str] = (),
                 num_shards: int = 16,
                 max_history: int = 4096, windows: LabelWindows | None = None) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if max_history < 1:
            raise ValueError(f"max_history must be >= 1, got {max_history}")
        self._output, self._counts, self._previous = output, counts, list(previous)
        self._num_shards, self._max_history = num_shards, max_history
        self._windows = windows or LabelWindows()

    def expand(self, keyed_events: beam.PCollection) -> beam.PCollection:
        previous = (
            keyed_events.pipeline
            | "PreviousFiles" >> beam.Create(self._previous)
            | "ReadPrevious" >> beam.FlatMap(lambda path, n: split_by_shard(read_table(path, HISTORY), n),
                                             self._num_shards).with_output_types(tuple[int, pa.Table])
        )
        return (
            (keyed_events, previous)
            | "GroupByShard" >> GroupByShard()
            | "Build" >> beam.ParDo(_BuildShardFn(self._output, self._max_history, self._windows), self._counts)
        )


class WriteDeadLetters(beam.PTransform):
    """DEAD_LETTER tables → ``<output>/dead_letters/part-00000.parquet`` (always written)."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._path = join(output, "dead_letters", "part-00000.parquet")

    def expand(self, dead: beam.PCollection) -> beam.PCollection:
        return (
            dead
            | "ToOne" >> beam.combiners.ToList()
            | "Write" >> beam.Map(self._write)
        )

    def _write(self, tables: list[pa.Table]) -> str:
        table = pa.concat_tables(tables) if tables else DEAD_LETTER.schema.empty_table()
        order = pc.sort_indices(table, [("source", "ascending")])
        return write_table(table.take(order), self._path, DEAD_LETTER)


def sum_counts(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Sum count dicts; keys starting with ``max.`` take the maximum instead."""
    total: Counter[str] = Counter()
    for d in dicts:
        for key, value in d.items():
            total[key] = max(total[key], value) if key.startswith("max.") else total[key] + value
    return dict(total)


class WriteSummary(beam.PTransform):
    """Count dicts → ``<output>/summary.json`` with the totals and ``extra`` fields."""

    def __init__(self, output: str, extra: dict[str, Any]) -> None:
        super().__init__()
        self._path = join(output, SUMMARY)
        self._extra = extra

    def expand(self, counts: beam.PCollection) -> beam.PCollection:
        return counts | "Sum" >> beam.CombineGlobally(sum_counts) | "Write" >> beam.Map(self._write)

    def _write(self, totals: dict[str, int]) -> dict[str, Any]:
        summary = {**self._extra, **dict(sorted(totals.items()))}
        with FileSystems.create(self._path) as f:
            f.write(json.dumps(summary, indent=2).encode())
        return summary
