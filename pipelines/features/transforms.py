"""The Beam wrapper around history building: (shard, tables) → per-shard Parquet and counts.

Elements are Arrow tables (never per-event dicts); counts travel as small dicts
and are summed into ``summary.json`` (:mod:`pipelines.io.transforms`). The
sources are in :mod:`.sources`.

The events do not cross the shuffle: each table of them goes to a file under the staging
folder's ``_scratch/`` where it is read, and the shuffle carries the file's name. The build
reads the files back one at a time, so neither the runner nor the worker holds a shard's events
whole (a heavy user's included); it deletes the shard's files once its outputs are written.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines.features.examples import LabelWindows
from pipelines.features.histories import stream_histories
from pipelines.io.files import join
from pipelines.io.objects import delete_tree, is_local, local_path
from pipelines.io.parquet import read_table, write_table, write_tables
from pipelines.io.shards import shard_path, split_by_shard
from pipelines.io.snapshot import HISTORIES, TRAINING_EXAMPLES
from pipelines.io.transforms import GroupByShard
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE
from pipelines.settings import MAX_HISTORY, NUM_SHARDS

__all__ = ["BuildHistories"]

NAMESPACE = "features"
WRITE_THREADS = 2
#: The staging folder's scratch space: events between the read and the build (gone before the commit).
SCRATCH = "_scratch"
#: The one column of a table that stands for events in a file (its path).
_SPILLED = "_spilled_path"


def _is_history(table: pa.Table) -> bool:
    return "events" in table.column_names


def _write_events(table: pa.Table, path: str) -> None:
    """``table`` as an Arrow IPC file (LZ4) at ``path``, on any Beam filesystem."""
    if is_local(path):
        os.makedirs(os.path.dirname(local_path(path)), exist_ok=True)
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with FileSystems.create(path) as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)


def _read_events(path: str) -> pa.Table:
    """A file of :func:`_write_events`, read from an Arrow-owned copy of its bytes (see
    :func:`pipelines.io.parquet.read_file`)."""
    with FileSystems.open(path) as source:
        raw = source.read()
    owned = pa.allocate_buffer(len(raw))
    memoryview(owned).cast("B")[:] = raw
    del raw
    return pa.ipc.open_file(pa.BufferReader(owned)).read_all()


class _SpillFn(beam.DoFn):
    """(shard, EVENT table) → (shard, a one-row table naming the file the events were written to)."""

    def __init__(self, folder: str) -> None:
        self._folder = folder

    def process(self, element: tuple[int, pa.Table]) -> Iterator[tuple[int, pa.Table]]:
        shard, table = element
        if not table.num_rows:
            return
        path = join(self._folder, f"shard={shard}", f"{uuid.uuid4().hex}.arrow")
        _write_events(table, path)
        yield shard, pa.table({_SPILLED: [path]})


def _events(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """The events of a shard's grouped tables, files read one at a time."""
    for table in tables:
        if _SPILLED in table.column_names:
            yield from (_read_events(path) for path in table.column(_SPILLED).to_pylist())
        elif not _is_history(table):
            yield table


def _concat(tables: Iterable[pa.Table]) -> pa.Table | None:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None


class _BuildShardFn(beam.DoFn):
    """(shard, {events, previous}) → writes that shard's histories and examples; yields counts.

    The events go to the build table by table (never concatenated): the build holds a bounded
    slice of them, not one user's whole stream (:func:`stream_histories`). Parquet writes
    (single-threaded encode + zstd, GIL released) run on a small thread pool while the next shard
    builds; ``finish_bundle`` waits for them, so a bundle only commits once its files are written
    (a failed write fails it).
    """

    def __init__(self, output: str, max_history: int, windows: LabelWindows) -> None:
        self._output = output
        self._max_history = max_history
        self._windows = windows
        self._scratch = join(output, SCRATCH)

    def setup(self) -> None:
        self._users = Metrics.counter(NAMESPACE, "histories")
        self._examples = Metrics.counter(NAMESPACE, "training_examples")
        self._writer = ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="parquet-write")
        self._pending: list[Future] = []
        self._read: list[int] = []

    def finish_bundle(self) -> None:
        pending, self._pending = self._pending, []
        for write in pending:
            write.result()
        # Only once every output is written: a bundle that fails before reads the files again.
        read, self._read = self._read, []
        for shard in read:
            delete_tree(join(self._scratch, f"shard={shard}"))
        if read and is_local(self._scratch):
            with contextlib.suppress(OSError):  # other shards' files are still there
                os.rmdir(local_path(self._scratch))

    def teardown(self) -> None:
        self._writer.shutdown(wait=True)

    def process(self, element: tuple[int, Iterable[pa.Table]], counts: dict[str, int]) -> Iterator[dict]:
        shard, tables = element
        previous = _concat(t for t in tables if _is_history(t))
        watermark_ms = counts.get("max.event_time_ms", 0)
        build = stream_histories(
            _events(tables),
            previous,
            max_history=self._max_history,
            watermark_ms=watermark_ms or None,
            windows=self._windows,
        )
        self._submit(write_table, build.histories, shard_path(self._output, HISTORIES, shard), HISTORY)
        # The examples stream from the build's scratch files into Parquet as they are written.
        self._submit(write_tables, build.examples, shard_path(self._output, TRAINING_EXAMPLES, shard), TRAINING_EXAMPLE)
        self._users.inc(build.histories.num_rows)
        self._examples.inc(build.num_examples)
        yield {
            "events_valid": build.events - build.duplicates - build.duplicates_previous,
            "duplicates": build.duplicates,
            "duplicates_previous": build.duplicates_previous,
            "evicted": build.evicted,
            "histories": build.histories.num_rows,
            "training_examples": build.num_examples,
            "shards_written": 1,
        }
        self._read.append(shard)

    def _submit(self, write: Callable[..., str], *args: object) -> None:
        self._pending.append(self._writer.submit(write, *args))


class BuildHistories(beam.PTransform):
    """(shard, EVENT table) pairs (+ previous HISTORY files) → per-shard Parquet; outputs count dicts.

    ``counts`` is a singleton side input of the read counts (its ``max.event_time_ms``
    is the snapshot's watermark).
    """

    def __init__(
        self,
        output: str,
        counts: beam.pvalue.AsSingleton,
        *,
        previous: Sequence[str] = (),
        num_shards: int = NUM_SHARDS.default,
        max_history: int = MAX_HISTORY.default,
        windows: LabelWindows | None = None,
    ) -> None:
        super().__init__()
        NUM_SHARDS.check(num_shards)
        MAX_HISTORY.check(max_history)
        self._output, self._counts, self._previous = output, counts, list(previous)
        self._num_shards, self._max_history = num_shards, max_history
        self._windows = windows or LabelWindows()

    def expand(self, keyed_events: beam.PCollection) -> beam.PCollection:
        previous = (
            keyed_events.pipeline
            | "PreviousFiles" >> beam.Create(self._previous)
            | "ReadPrevious"
            >> beam.FlatMap(
                lambda path, n: split_by_shard(read_table(path, HISTORY), n), self._num_shards
            ).with_output_types(tuple[int, pa.Table])
        )
        spilled = keyed_events | "SpillEvents" >> beam.ParDo(_SpillFn(join(self._output, SCRATCH))).with_output_types(
            tuple[int, pa.Table]
        )
        return (
            (spilled, previous)
            | "GroupByShard" >> GroupByShard()
            | "Build" >> beam.ParDo(_BuildShardFn(self._output, self._max_history, self._windows), self._counts)
        )
