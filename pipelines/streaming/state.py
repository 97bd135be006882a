"""Pure parts of streaming histories: offset ledgers, per-shard merges, flush files.

No Beam here. The streaming job (:mod:`pipelines.streaming.job`) keeps each user's
history in Beam keyed state (:mod:`pipelines.streaming.keyed`); every flush
merges the user's buffered events into it with :func:`merge_shard`
(:func:`pipelines.features.histories.build_histories`: late events land in
their place, histories are ordered by event time), the changed rows of a
bundle are written as one Parquet *flush file* per shard (atomically: a killed
job never leaves half a file), and only then are the flushed offsets reported
to the :class:`OffsetLedger` that decides what may be committed to Kafka.

:func:`latest_histories` reads a shard's histories back from its flush files
(the newest row of each user; a ``full-`` file, written by earlier versions,
starts a shard's state); events after the committed offsets are read again,
and the merge drops those already in a history (same event_id).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.features.histories import build_histories
from pipelines.io.parquet import conform, read_table
from pipelines.io.shards import SHARD_DIR, SHARD_GLOB, shard_path
from pipelines.io.snapshot import HISTORIES
from pipelines.schemas.layouts import EVENT, HISTORY, Layout

__all__ = [
    "OffsetLedger",
    "ShardHistories",
    "ShardMerge",
    "ShardStates",
    "flush_path",
    "has_flush_files",
    "latest_histories",
    "merge_shard",
    "newest_rows",
    "path_lock",
    "write_flush",
]

#: :class:`ShardHistories` compacts its chunks once it holds this many.
MAX_FLUSH_FILES = 256

#: Columns the stream adds to EVENT tables so that flushed events can be acknowledged.
PARTITION, OFFSET = "_partition", "_offset"


@dataclass
class OffsetLedger:
    """Offsets of one partition made durable so far; ``next`` is what may be committed.

    Every offset from the start is reported exactly once (events after their
    flush, dead letters after their write, gaps by the reader); ``next`` is the
    first offset not yet known durable, so committing it never skips a record.
    """

    next: int
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def add(self, offsets: np.ndarray) -> bool:
        """Record durable ``offsets``; True when ``next`` moved."""
        fresh = np.asarray(offsets, dtype=np.int64)
        fresh = fresh[fresh >= self.next]
        if not len(fresh):
            return False
        pending = np.union1d(self.pending, fresh)
        # The run of consecutive offsets that starts at `next`.
        run = int(np.argmax(np.r_[pending != np.arange(self.next, self.next + len(pending)), True]))
        moved = run > 0
        self.next += run
        self.pending = pending[run:]
        return moved


@dataclass(frozen=True)
class ShardMerge:
    """One flush of a shard: the changed history rows and the shard's new state."""

    changed: pa.Table
    state: pa.Table
    duplicates: int


def merge_shard(events: pa.Table, state: pa.Table | None, *, max_history: int) -> ShardMerge:
    """Merge buffered EVENT rows into the shard's HISTORY ``state`` (only touched users are rebuilt)."""
    events = events.select(EVENT.schema.names)
    touched = pc.unique(events.column("user_id"))
    previous = None
    rest = None
    if state is not None and state.num_rows:
        mask = pc.is_in(state.column("user_id"), value_set=touched)
        previous, rest = state.filter(mask), state.filter(pc.invert(mask))
    build = build_histories(events, previous, max_history=max_history)
    changed = build.histories
    merged = changed if rest is None or not rest.num_rows else pa.concat_tables([rest, conform(changed, HISTORY)])
    order = pc.sort_indices(merged, [("user_id", "ascending")])
    return ShardMerge(changed, conform(merged.take(order), HISTORY), build.duplicates + build.duplicates_previous)


def flush_path(
    output: str, shard: int, clock_ns: int | None = None, *, full: bool = False, folder: str = HISTORIES
) -> str:
    """``<output>/<folder>/shard=NNNNN/{flush|full}-<ns>-<rand>.parquet`` (``folder``: ``histories``, or
    ``rep_history`` for the historical representations): names sort by time after the kind."""
    stamp = clock_ns if clock_ns is not None else time.time_ns()
    kind = "full" if full else "flush"
    return shard_path(output, folder, shard, f"{kind}-{stamp:020d}-{uuid.uuid4().hex[:8]}.parquet")


def _stamp(path: Path) -> str:
    return path.name.split("-", 1)[1]  # "<ns>-<rand>.parquet": time order across both kinds


def _shard_files(output: str, shard: int | None) -> list[Path]:
    """The files that make up the current state: the newest ``full-`` file and every flush after it."""
    where = SHARD_DIR.format(shard) if shard is not None else SHARD_GLOB
    files = [p for p in Path(output, HISTORIES).glob(f"{where}/*.parquet") if p.name.startswith(("flush-", "full-"))]
    by_shard: dict[str, list[Path]] = {}
    for f in sorted(files, key=_stamp):
        by_shard.setdefault(f.parent.name, []).append(f)
    chosen: list[Path] = []
    for group in by_shard.values():
        fulls = [i for i, f in enumerate(group) if f.name.startswith("full-")]
        chosen += group[fulls[-1] :] if fulls else group
    return sorted(chosen, key=_stamp)


def has_flush_files(output: str) -> bool:
    """Whether ``output`` holds any shard's flush (or full) file: a stream wrote state there."""
    return bool(_shard_files(output, None))


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextmanager
def path_lock(path: Path) -> Iterator[None]:
    """Exclusive use of ``path``: across threads (a lock) and processes (``flock`` on ``.<name>.lock``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock, open(path.with_name(f".{path.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ShardHistories:
    """One shard's histories as append-only HISTORY chunks; each user's current row is its newest.

    ``add`` appends a chunk without copying what is there; ``rows_of`` gathers only the asked
    users' rows. So a flush costs the touched users' histories, not the shard's: merging a
    thousand events into a shard of two million cost 1.1 s as filter + concat + sort of the
    whole state, and 43 ms this way. Chunks are compacted into one once the superseded rows
    outnumber the live ones (a cost proportional to the rows added since).
    """

    def __init__(self) -> None:
        self._chunks: list[pa.Table] = []
        self._where: dict[int, tuple[int, int]] = {}  # user -> (chunk, row) of the newest row
        self._stale = 0

    @property
    def num_users(self) -> int:
        return len(self._where)

    def add(self, table: pa.Table) -> None:
        """``table`` (HISTORY) becomes the newest row of each of its users."""
        if not table.num_rows:
            return
        chunk = len(self._chunks)
        self._chunks.append(conform(table, HISTORY))
        for row, user in enumerate(table.column("user_id").to_pylist()):
            self._stale += self._where.get(user) is not None
            self._where[user] = (chunk, row)
        if self._stale > len(self._where) or len(self._chunks) > MAX_FLUSH_FILES:
            live = self._gather(None)
            self._chunks, self._where, self._stale = [], {}, 0
            self.add(live)

    def rows_of(self, users: pa.Array | np.ndarray | list[int]) -> pa.Table:
        """The current rows of those of ``users`` held here (sorted by user)."""
        ids = users.to_pylist() if isinstance(users, pa.Array | pa.ChunkedArray) else np.asarray(users).tolist()
        return self._gather(sorted({u for u in ids if u in self._where}))

    def table(self) -> pa.Table:
        """Every user's current row, sorted by user."""
        return self._gather(None)

    def _gather(self, users: list[int] | None) -> pa.Table:
        users = sorted(self._where) if users is None else users
        if not users:
            return HISTORY.schema.empty_table()
        where = np.asarray([self._where[u] for u in users], dtype=np.int64)
        parts, order = [], []
        for chunk in np.unique(where[:, 0]):
            picked = np.flatnonzero(where[:, 0] == chunk)
            parts.append(self._chunks[chunk].take(pa.array(where[picked, 1])))
            order.append(picked)
        table = pa.concat_tables(parts)
        return conform(table.take(pa.array(np.argsort(np.concatenate(order), kind="stable"))), HISTORY)


@dataclass
class _Loaded:
    files: tuple[Path, ...] = ()
    rows: tuple[int, ...] = ()  # rows of each file
    histories: ShardHistories = field(default_factory=ShardHistories)


class ShardStates:
    """Each shard's current histories, kept in memory between the flushes of this process.

    The shard's files stay the truth: :meth:`open` (call it under :func:`shard_lock`)
    lists them and reads only those it has not seen yet, so a flush costs a
    directory listing instead of re-reading the shard's flush files, which would
    be most of a flush's time. A file it did not write (another process, a
    restarted job, an out-of-order name) makes it read the new files, or all of
    them when the listing no longer extends what it saw.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], _Loaded] = {}

    def open(self, output: str, shard: int) -> ShardHistories:
        """The shard's histories, up to date with its files (the object is this cache's: add nothing to it)."""
        files = tuple(_shard_files(output, shard))
        loaded = self._seen.get((output, shard))
        if loaded is None or files[: len(loaded.files)] != loaded.files:
            loaded = _Loaded()
        for f in files[len(loaded.files) :]:
            table = read_table(str(f), HISTORY)
            loaded.histories.add(table)
            loaded = _Loaded((*loaded.files, f), (*loaded.rows, table.num_rows), loaded.histories)
        self._seen[(output, shard)] = loaded
        return loaded.histories

    def load(self, output: str, shard: int) -> tuple[pa.Table, int]:
        """(the shard's HISTORY state as one table, how many files it spans)."""
        histories = self.open(output, shard)
        return histories.table(), len(self._seen[(output, shard)].files)

    def users(self) -> int:
        """Users held in memory over every shard (the streaming job's state size)."""
        return sum(loaded.histories.num_users for loaded in self._seen.values())

    def wrote(self, output: str, shard: int, path: str, rows: pa.Table, *, full: bool) -> None:
        """Record that ``path`` was written with ``rows`` (with ``full``: the shard's whole state)."""
        loaded = _Loaded() if full else self._seen.get((output, shard), _Loaded())
        loaded.histories.add(rows)
        self._seen[(output, shard)] = _Loaded(
            (*loaded.files, Path(path)), (*loaded.rows, rows.num_rows), loaded.histories
        )


def write_flush(table: pa.Table, path: str, layout: Layout = HISTORY) -> str:
    """Write ``table`` (HISTORY, or ``layout``) to ``path`` atomically (temporary name, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as f:
        pq.write_table(conform(table, layout), f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return str(target)


def latest_histories(output: str, shard: int | None = None) -> pa.Table:
    """The newest row of each user over the flush files (of one shard, or all of them)."""
    return newest_rows([read_table(str(f), HISTORY) for f in _shard_files(output, shard)])


def newest_rows(tables: list[pa.Table]) -> pa.Table:
    """HISTORY rows sorted by user: each user's row from the last of ``tables`` that has one."""
    if not tables:
        return HISTORY.schema.empty_table()
    rank = pa.chunked_array([pa.array(np.full(t.num_rows, i, dtype=np.int64)) for i, t in enumerate(tables)])
    table = pa.concat_tables(tables)
    table = table.append_column("_rank", rank)
    order = pc.sort_indices(table, [("user_id", "ascending"), ("_rank", "descending")])
    table = table.take(order)
    users = table.column("user_id").to_numpy()
    first = np.r_[True, users[1:] != users[:-1]] if len(users) else np.zeros(0, bool)
    return conform(table.filter(pa.array(first)).drop_columns(["_rank"]), HISTORY)
