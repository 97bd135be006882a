"""Frames too many to hold at once: spools on disk, sorted runs and their merge, repeated hashes.

Pure helpers over Polars frames and Arrow IPC files in a scratch folder; no Beam. Each holds
in memory at most about the ``rows`` it is given, whatever the number of rows that pass through
it. A single frame that fits stays in memory: small builds never touch the disk.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

#: Rows per record batch written to a spill file (the unit a merge reads back).
FILE_BATCH = 1 << 15
#: Hash buckets (top bits of a 64-bit hash) by which repeated hashes are found a part at a time.
BUCKET_BITS = 12


class Scratch:
    """A temporary folder, made on first use and removed by :meth:`close`."""

    def __init__(self) -> None:
        self._folder: Path | None = None
        self._count = itertools.count()

    def path(self, stem: str) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="gem-features-"))
        return self._folder / f"{stem}-{next(self._count)}"

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class Spool:
    """Frames appended in order (one schema), read back forwards or backwards.

    They stay in memory while they hold at most ``limit`` rows; past it, all go to an Arrow IPC
    file (read back through plain reads, not a memory map, so pages read leave memory).
    """

    def __init__(self, scratch: Scratch, limit: int, name: str = "spool", batch_rows: int | None = FILE_BATCH) -> None:
        """``batch_rows``: rows per record batch on disk; None keeps each frame one batch, so that
        :meth:`backward` gives whole frames last to first."""
        self._scratch, self._limit, self._name, self._batch_rows = scratch, limit, name, batch_rows
        self._frames: list[pl.DataFrame] = []
        self._path: Path | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._schema: pa.Schema | None = None
        self.rows = 0

    def append(self, frame: pl.DataFrame) -> None:
        if not frame.height:
            return
        self.rows += frame.height
        if self._writer is None and self.rows <= self._limit:
            self._frames.append(frame)
            return
        self.spill()
        self._write(frame)

    def spill(self) -> None:
        """Move what is held in memory to the file (from now on every frame goes there)."""
        frames, self._frames = self._frames, []
        for frame in frames:
            self._write(frame)

    def _write(self, frame: pl.DataFrame) -> None:
        table = frame.to_arrow()
        if self._writer is None:
            self._path = self._scratch.path(self._name)
            self._schema = table.schema
            self._writer = pa.ipc.new_file(str(self._path), self._schema)
        table = table.cast(self._schema)
        self._writer.write_table(table if self._batch_rows else table.combine_chunks(), max_chunksize=self._batch_rows)

    def _batches(self, backward: bool) -> Iterator[pl.DataFrame]:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._path is None:
            yield from (reversed(self._frames) if backward else self._frames)
            return
        with pa.OSFile(str(self._path)) as source:
            reader = pa.ipc.open_file(source)
            indices = range(reader.num_record_batches)
            for i in reversed(indices) if backward else indices:
                yield _frame(pa.Table.from_batches([reader.get_batch(i)]))

    def forward(self) -> Iterator[pl.DataFrame]:
        return self._batches(backward=False)

    def discard(self) -> None:
        """Drop what it holds, file included (it cannot be read after)."""
        self._frames = []
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)

    def backward(self) -> Iterator[pl.DataFrame]:
        """The record batches last to first (each batch's rows in their own order)."""
        return self._batches(backward=True)


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _at_most(frame: pl.DataFrame, keys: Sequence[str], bound: tuple) -> pl.Expr:
    """Rows whose ``keys`` sort at or before ``bound`` (lexicographic)."""
    expr: pl.Expr | None = None
    for key, value in reversed(list(zip(keys, bound, strict=True))):
        col, lit = pl.col(key), pl.lit(value, dtype=frame.schema[key])
        expr = col <= lit if expr is None else (col < lit) | ((col == lit) & expr)
    assert expr is not None
    return expr


class _Cursor:
    """Takes about ``rows`` rows at a time from a spool's frames; ``done`` once none are left after."""

    def __init__(self, spool: Spool, rows: int) -> None:
        self._frames, self._rows, self.done = spool.forward(), rows, False

    def take(self, head: pl.DataFrame | None) -> pl.DataFrame | None:
        parts = [head] if head is not None and head.height else []
        held = sum(p.height for p in parts)
        while not self.done and held < self._rows:
            frame = next(self._frames, None)
            if frame is None:
                self.done = True
            elif frame.height:
                parts.append(frame)
                held += frame.height
        return pl.concat(parts) if parts else None


class SortedRuns:
    """Frames, each sorted by ``keys``, merged into one stream of frames sorted by ``keys``.

    Runs that together fit in ``rows`` stay in memory and are merged by one sort; past that every
    run is on disk and the merge holds about ``rows`` rows: a part of each run, never a run whole.
    """

    def __init__(self, scratch: Scratch, keys: Sequence[str], rows: int) -> None:
        self._scratch, self._keys, self._rows = scratch, list(keys), rows
        self._runs: list[Spool] = []
        self._held = 0

    def add(self, frame: pl.DataFrame) -> None:
        """Add one run (already sorted)."""
        if not frame.height:
            return
        run = Spool(self._scratch, self._rows, "run")
        run.append(frame)
        self._runs.append(run)
        self._held += frame.height
        if self._held > self._rows:
            for each in self._runs:
                each.spill()

    def merged(self) -> Iterator[pl.DataFrame]:
        if self._held <= self._rows:
            frames = [frame for run in self._runs for frame in run.forward()]
            if frames:
                yield frames[0] if len(frames) == 1 else pl.concat(frames).sort(self._keys)
            return
        cursors = [_Cursor(run, max(self._rows // len(self._runs), 1)) for run in self._runs]
        heads = [c.take(None) for c in cursors]
        while any(h is not None for h in heads):
            # Rows up to the smallest last key of a run with more to come precede all that is unread.
            open_heads = [h for h, c in zip(heads, cursors, strict=True) if h is not None and not c.done]
            bound = min((h.select(self._keys).row(-1) for h in open_heads), default=None)
            parts: list[pl.DataFrame] = []
            rests: list[pl.DataFrame | None] = []
            for head in heads:
                if head is None or bound is None:
                    parts.extend([head] if head is not None else [])
                    rests.append(None)
                    continue
                cut = head.select(_at_most(head, self._keys, bound)).to_series()
                parts.append(head.filter(cut))
                rests.append(head.filter(~cut))
            yield pl.concat(parts).sort(self._keys)
            heads = [c.take(rest) for c, rest in zip(cursors, rests, strict=True)]

    def discard(self) -> None:
        for run in self._runs:
            run.discard()


class RepeatedHashes:
    """64-bit hashes added an array at a time; :meth:`repeated` finds those seen more than once.

    Each array is kept sorted, with the offsets of its hash buckets; with more than one array,
    all go to disk, and the search reads one range of buckets of every array at a time.
    """

    def __init__(self, scratch: Scratch, rows: int) -> None:
        self._scratch, self._rows = scratch, rows
        self._parts: list[tuple[np.ndarray | Path, np.ndarray]] = []

    def add(self, hashes: np.ndarray) -> None:
        if not len(hashes):
            return
        ordered = np.sort(hashes.astype(np.uint64, copy=False))
        offsets = np.searchsorted(ordered >> np.uint64(64 - BUCKET_BITS), np.arange((1 << BUCKET_BITS) + 1))
        self._parts.append((ordered, offsets))
        if len(self._parts) > 1:
            self._parts = [(self._spill(source), offsets) for source, offsets in self._parts]

    def _spill(self, source: np.ndarray | Path) -> Path:
        if isinstance(source, Path):
            return source
        path = self._scratch.path("hashes")
        source.tofile(path)
        return path

    def repeated(self) -> np.ndarray:
        found: list[np.ndarray] = []
        sizes = np.zeros(1 << BUCKET_BITS, np.int64)
        for _, offsets in self._parts:
            sizes += np.diff(offsets)
        start, held = 0, 0
        for bucket, size in enumerate(sizes):
            held += int(size)
            if held >= self._rows or bucket == len(sizes) - 1:
                found.append(self._repeated_in(start, bucket + 1))
                start, held = bucket + 1, 0
        return np.concatenate(found) if found else np.zeros(0, np.uint64)

    def _repeated_in(self, first: int, end: int) -> np.ndarray:
        ranges = [self._read(source, offsets[first], offsets[end]) for source, offsets in self._parts]
        hashes = np.sort(np.concatenate(ranges)) if ranges else np.zeros(0, np.uint64)
        return np.unique(hashes[1:][hashes[1:] == hashes[:-1]])

    @staticmethod
    def _read(source: np.ndarray | Path, start: int, end: int) -> np.ndarray:
        if isinstance(source, np.ndarray):
            return source[start:end]
        return np.fromfile(source, dtype=np.uint64, count=int(end - start), offset=int(start) * 8)
