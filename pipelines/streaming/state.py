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

Compaction (:func:`compact_shard`) keeps a shard's file count bounded. Each file
covers a range of flush stamps ``[lo, hi]`` and has a *tier*: 0 for a flush, t+1
for a merge of files of tier t. Whenever ``COMPACT_FANOUT`` files of one tier
follow each other in time order, they are merged into one (each user's newest
row, :func:`newest_rows`) named by their range: ``flush-<hi>-<rand>-t<tier>-<lo>``.
So a shard holds at most ``(COMPACT_FANOUT - 1)`` files per tier and
log_fanout(flushes) tiers, and each row is rewritten once per tier: a cost that
grows with the events written, not with the users held.

Why it is safe: a merged file sits at its newest input's place in time order and
holds each user's newest row of its inputs, which are a run of consecutive files.
So the merged file and its inputs give the same answer whether or not both are
seen, and readers drop a file whose range another file covers (a crash between
writing the merged file and removing its inputs leaves such files; the next
compaction removes them). The run must hold *every* file stamped inside its
range: writers take their stamp and rename under a shared lock on the shard
(:func:`append_flush`), and the compaction lists the shard under the exclusive
one, so a file written later has a later stamp. A reader that finds a listed file
gone (merged meanwhile) lists again.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.features.histories import build_histories
from pipelines.io.parquet import conform, read_table, rows_of_user
from pipelines.io.shards import SHARD_DIR, SHARD_GLOB, newest_per_user, shard_dir, shard_path
from pipelines.io.snapshot import HISTORIES
from pipelines.schemas.layouts import EVENT, HISTORY, Layout

__all__ = [
    "COMPACT_FANOUT",
    "ROW_GROUP_ROWS",
    "FlushFile",
    "OffsetLedger",
    "ShardHistories",
    "ShardMerge",
    "ShardStates",
    "append_flush",
    "compact_shard",
    "flush_path",
    "has_flush_files",
    "history_of",
    "latest_histories",
    "merge_shard",
    "newest_rows",
    "next_merge",
    "path_lock",
    "shard_bytes",
    "write_flush",
]

T = TypeVar("T")

#: :class:`ShardHistories` compacts its chunks once it holds this many.
MAX_FLUSH_FILES = 256

#: A shard's files of one tier are merged into one once this many follow each other.
COMPACT_FANOUT = 4

#: Rows per Parquet row group of the flush files: a merged file is sorted by user, so reading one
#: user's row (:func:`history_of`) costs a group of this many rows, not the file.
ROW_GROUP_ROWS = 128

#: Columns the stream adds to EVENT tables so that flushed events can be acknowledged.
PARTITION, OFFSET = "_partition", "_offset"


def offsets_by_partition(table: pa.Table) -> list[tuple[int, np.ndarray]]:
    """The ``(partition, offsets)`` acknowledgements of ``table``'s rows (``_partition``, ``_offset``)."""
    partitions, offsets = table.column(PARTITION).to_numpy(), table.column(OFFSET).to_numpy()
    return [(int(p), offsets[partitions == p]) for p in np.unique(partitions)]


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


#: A flush's place in time: (ns, the random tag of its name), unique even where two clocks agree.
Stamp = tuple[int, str]

#: A legacy ``full-`` file (a shard's whole state) never merges: no run of them ever forms.
_FULL_TIER = 1 << 20
_NAME = re.compile(r"(flush|full)-(\d{20})-([0-9a-f]+)(?:-t(\d+)-(\d{20})-([0-9a-f]+))?\.parquet")


@dataclass(frozen=True)
class FlushFile:
    """One file of a shard's state: it holds the flushes stamped ``lo``..``hi``, merged ``tier`` times over."""

    path: Path
    lo: Stamp
    hi: Stamp
    tier: int

    @classmethod
    def parse(cls, path: Path) -> FlushFile | None:
        """The file named ``path`` (None for a name no writer of this module gives)."""
        found = _NAME.fullmatch(path.name)
        if found is None:
            return None
        kind, hi_ns, hi_tag, tier, lo_ns, lo_tag = found.groups()
        hi = (int(hi_ns), hi_tag)
        if kind == "full":  # the whole state at `hi`: covers everything before it
            return cls(path, (0, ""), hi, _FULL_TIER)
        return cls(path, (int(lo_ns), lo_tag) if tier else hi, hi, int(tier or 0))


def _merged_name(inputs: Sequence[FlushFile]) -> str:
    (lo_ns, lo_tag), (hi_ns, hi_tag) = min(f.lo for f in inputs), max(f.hi for f in inputs)
    return f"flush-{hi_ns:020d}-{hi_tag}-t{inputs[0].tier + 1}-{lo_ns:020d}-{lo_tag}.parquet"


def _time_order(files: Sequence[FlushFile]) -> list[FlushFile]:
    return sorted(files, key=lambda f: (f.hi, f.tier, f.path.name))


def _uncovered(files: Sequence[FlushFile]) -> tuple[list[FlushFile], list[FlushFile]]:
    """(the files that make up the state, in time order; those another file covers: its range
    holds theirs, and is wider or of a higher tier)."""
    kept: list[FlushFile] = []
    covered: list[FlushFile] = []
    top: FlushFile | None = None  # of the files seen so far (lo <= this one's), the one reaching furthest
    for f in sorted(sorted(files, key=lambda f: (f.hi, f.tier), reverse=True), key=lambda f: f.lo):
        if top is not None and (f.hi < top.hi or (f.hi == top.hi and (top.lo < f.lo or top.tier > f.tier))):
            covered.append(f)
            continue
        kept.append(f)
        if top is None or f.hi > top.hi:
            top = f
    return _time_order(kept), covered


def _listing(output: str, shard: int | None) -> list[FlushFile]:
    where = SHARD_DIR.format(shard) if shard is not None else SHARD_GLOB
    found = (FlushFile.parse(p) for p in Path(output, HISTORIES).glob(f"{where}/*.parquet"))
    return [f for f in found if f is not None]


def _shard_files(output: str, shard: int | None) -> list[Path]:
    """The files that make up the current state (of one shard, or all), in time order: every file
    no other covers (a merged file covers its inputs, a ``full-`` file everything before it)."""
    by_shard: dict[Path, list[FlushFile]] = {}
    for f in _listing(output, shard):
        by_shard.setdefault(f.path.parent, []).append(f)
    return [f.path for f in _time_order([f for group in by_shard.values() for f in _uncovered(group)[0]])]


def _read_current(
    output: str, shard: int | None, held: Callable[[list[Path]], int] = lambda listed: 0
) -> tuple[list[Path], int, list[pa.Table]]:
    """The current files, how many of them a reader already holds (``held``) and the tables of the
    others; lists again when a listed file was merged away meanwhile (each retry means a compaction
    finished)."""

    def read(files: list[Path]) -> tuple[list[Path], int, list[pa.Table]]:
        skip = held(files)
        return files, skip, [read_table(str(f), HISTORY) for f in files[skip:]]

    return _listed(output, shard, read)


def _listed(output: str, shard: int | None, read: Callable[[list[Path]], T]) -> T:
    """``read`` of the current files; lists again when a listed file was merged away meanwhile
    (each retry means a compaction finished)."""
    for _ in range(1000):
        try:
            return read(_shard_files(output, shard))
        except FileNotFoundError:
            continue
    raise RuntimeError(f"{output}: shard {shard}'s files kept changing while being read")


def history_of(output: str, shard: int, user: int) -> pa.Table:
    """``user``'s newest row in the shard's files (0 or 1 rows), reading only the row groups that
    can hold it: merged files are sorted by user in groups of ``ROW_GROUP_ROWS``, so the cost is
    a row group per file, whatever the number of users in the shard."""
    return _listed(output, shard, lambda files: newest_rows([rows_of_user(str(f), user, HISTORY) for f in files]))


def shard_bytes(output: str, shard: int) -> int:
    """The bytes on disk of the shard's current files."""
    return _listed(output, shard, lambda files: sum(f.stat().st_size for f in files))


def _held(seen: Sequence[Path], listed: Sequence[Path]) -> int | None:
    """How many leading files of ``listed`` a state read from ``seen`` (in order) holds already, when
    adding the others in order brings it up to date; None when it must be read from the start.

    The others must all reach past every seen file (a new flush, or a merge that takes in the newest
    seen file: its rows are the newest of its inputs, so it goes on top), and every seen file gone
    must lie inside a listed one (merged into it)."""
    old, now = [FlushFile.parse(p) for p in seen], [FlushFile.parse(p) for p in listed]
    if not old:
        return 0
    k, known = 0, set(seen)
    while k < len(listed) and listed[k] in known:
        k += 1
    newest = max((f.hi for f in old if f is not None), default=None)
    gone = [f for f in old if f is None or f.path not in set(listed)]
    if newest is None or any(f is None or f.hi < newest or f.path in known for f in now[k:]):
        return None
    inside = [any(m is not None and m.lo <= g.lo and g.hi <= m.hi for m in now) for g in gone if g is not None]
    return k if all(inside) and None not in gone else None


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
    histories: ShardHistories = field(default_factory=ShardHistories)


class ShardStates:
    """Each shard's current histories, kept in memory between the flushes of this process.

    The shard's files stay the truth: :meth:`open` lists them and reads only what it does not
    hold yet: the new flush files, and a merged file that takes in the newest file it had read
    (see :func:`_held`); anything else (a file out of time order, a file gone unmerged) makes it
    read the shard again.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], _Loaded] = {}

    def open(self, output: str, shard: int) -> ShardHistories:
        """The shard's histories, up to date with its files (the object is this cache's: add nothing to it)."""
        loaded = self._seen.get((output, shard)) or _Loaded()
        again = False

        def held(listed: list[Path]) -> int:
            nonlocal again
            skip = _held(loaded.files, listed)
            again = skip is None
            return skip or 0

        listed, _, tables = _read_current(output, shard, held)
        histories = ShardHistories() if again else loaded.histories
        for table in tables:
            histories.add(table)
        self._seen[(output, shard)] = _Loaded(tuple(listed), histories)
        return histories

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
        self._seen[(output, shard)] = _Loaded((*loaded.files, Path(path)), loaded.histories)


def write_flush(table: pa.Table, path: str, layout: Layout = HISTORY) -> str:
    """Write ``table`` (HISTORY, or ``layout``) to ``path`` atomically (temporary name, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    _write_synced(table, tmp, layout)
    os.replace(tmp, target)
    return str(target)


def _write_synced(table: pa.Table, path: Path, layout: Layout = HISTORY) -> None:
    with open(path, "wb") as f:
        pq.write_table(conform(table, layout), f, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def _flocked(path: Path, mode: int) -> Iterator[bool]:
    """``flock(mode)`` on ``path`` for the block; yields False when ``LOCK_NB`` found it held."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: In each shard's folder: held shared while a writer stamps and renames a flush file, exclusive
#: while a compaction lists the shard; and held by the one compaction at work on the shard.
_WRITERS, _COMPACTING, _PENDING = ".writers.lock", ".compact.lock", ".compact.pending"


def append_flush(table: pa.Table, output: str, shard: int) -> str:
    """Write ``table`` (HISTORY) as the shard's newest flush file: written and synced under a
    temporary name, then stamped and renamed under the shard's writers' lock (see the module's doc)."""
    folder = Path(shard_dir(output, HISTORIES, shard))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".flush-{uuid.uuid4().hex}.tmp"
    _write_synced(table, tmp)
    with _flocked(folder / _WRITERS, fcntl.LOCK_SH):
        path = flush_path(output, shard)
        os.replace(tmp, path)
    return path


def next_merge(tiers: Sequence[int], fanout: int = COMPACT_FANOUT) -> tuple[int, int] | None:
    """The files to merge next, as ``[start, stop)`` into ``tiers`` (the shard's files in time
    order): the oldest run of at least ``fanout`` consecutive files of one tier; None if none."""
    start = 0
    for i in range(1, len(tiers) + 1):
        if i == len(tiers) or tiers[i] != tiers[start]:
            if i - start >= fanout:
                return start, i
            start = i
    return None


#: Test hook: called with ("merged", path) after the merged file is durable, ("removed", path)
#: after each input is removed; raising there stands for a crash at that point.
CompactHook = Callable[[str, Path], None]


def compact_shard(output: str, shard: int, fanout: int = COMPACT_FANOUT, hook: CompactHook | None = None) -> list[str]:
    """Merge the shard's runs of ``fanout`` files of one tier until none is left, and remove files
    that a merged file covers (left by a crash). Returns the merged files written.

    One compaction at a time per shard: a call that finds another at work leaves a note
    (``.compact.pending``, set before it tries) and returns; the one at work looks for the note
    once it is done and goes again, so a flush is never left out of the next merge for long."""
    folder = Path(shard_dir(output, HISTORIES, shard))
    if not folder.is_dir():
        return []
    pending, written = folder / _PENDING, []
    pending.touch()
    while pending.exists():
        with _flocked(folder / _COMPACTING, fcntl.LOCK_EX | fcntl.LOCK_NB) as mine:
            if not mine:
                break
            pending.unlink(missing_ok=True)
            written += _compact(folder, output, shard, fanout, hook)
    return written


def _compact(folder: Path, output: str, shard: int, fanout: int, hook: CompactHook | None) -> list[str]:
    with _flocked(folder / _WRITERS, fcntl.LOCK_EX):  # every file stamped so far is listed
        files, covered = _uncovered(_listing(output, shard))
    _remove(covered, hook)
    written = []
    while (run := next_merge([f.tier for f in files], fanout)) is not None:
        merged = _merge(files[run[0] : run[1]], folder, hook)
        files[run[0] : run[1]] = [merged]
        written.append(str(merged.path))
    return written


def _merge(inputs: Sequence[FlushFile], folder: Path, hook: CompactHook | None) -> FlushFile:
    """One merged file for ``inputs`` (a run, in time order), made durable before they are removed."""
    table = newest_rows([read_table(str(f.path), HISTORY) for f in inputs])
    path = Path(write_flush(table, str(folder / _merged_name(inputs))))
    _sync_dir(folder)
    if hook is not None:
        hook("merged", path)
    _remove(inputs, hook)
    merged = FlushFile.parse(path)
    assert merged is not None
    return merged


def _remove(files: Sequence[FlushFile], hook: CompactHook | None) -> None:
    for f in files:
        f.path.unlink(missing_ok=True)
        if hook is not None:
            hook("removed", f.path)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_histories(output: str, shard: int | None = None) -> pa.Table:
    """The newest row of each user over the flush files (of one shard, or all of them)."""
    return newest_rows(_read_current(output, shard)[2])


def newest_rows(tables: list[pa.Table]) -> pa.Table:
    """HISTORY rows sorted by user: each user's last row over ``tables`` in order
    (:func:`pipelines.io.shards.newest_per_user`)."""
    return conform(newest_per_user(tables, HISTORY.schema.empty_table()), HISTORY)
