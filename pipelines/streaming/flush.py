"""Flushing shards' buffered events into their histories, off the Beam bundle's thread.

:func:`flush_shards` merges buffered EVENT tables into their shards' histories,
writes each shard's changed rows as one flush file (atomically), publishes them
when asked, and returns the flushed offsets per partition, which may be
acknowledged only now, with the touched users' histories (for the representation
refresh, :mod:`pipelines.streaming.refresh`). A :class:`Coalescer` runs these
flushes on one thread of the worker, so a bundle never waits for a merge or a
write (a runner such as Prism holds the stage's next bundle until the current
one returns, so a flush inside the bundle delays every event behind it); later
bundles pick up the acknowledgements with :meth:`Coalescer.finished`.

Nothing changes for delivery: offsets are acknowledged only after their flush
is durable, so a worker that dies with flushes queued or acknowledgements not
yet emitted has its events read again from the committed offsets, and the
merge drops those a history already holds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.schemas.layouts import HISTORY
from pipelines.streaming.state import (
    OFFSET,
    PARTITION,
    SHARD_STATES,
    ShardHistories,
    flush_path,
    merge_shard,
    shard_lock,
    write_flush,
)

__all__ = ["Acks", "Coalescer", "ShardFlush", "flush_shards", "shared_worker"]

log = logging.getLogger(__name__)

#: (partition, offsets) pairs made durable by a flush.
Acks = list[tuple[int, np.ndarray]]
T = TypeVar("T")
W = TypeVar("W")


@dataclass(frozen=True)
class ShardFlush:
    """What one flush made durable: ``acks`` (offsets per partition) and ``histories``, the
    HISTORY rows of every user its events touched (even when all of them were duplicates)."""

    acks: Acks
    histories: pa.Table


def flush_shards(
    output: str, buffered: Mapping[int, list[pa.Table]], *, num_shards: int, max_history: int, sink: Any = None
) -> ShardFlush:
    """Merge each shard's buffered tables (EVENT + ``_partition``/``_offset``) into its histories.

    The shards are merged together (one :func:`merge_shard` over the touched users'
    current rows: users never span shards, so each history is the same, and the fixed
    cost of a merge is paid once), then each shard gets its own flush file: the changed
    rows, or the whole shard when :meth:`ShardStates.needs_full` says so. The watermark
    written is the merge's: the newest event time of all of them.
    """
    from pipelines.io.kafka.encode import histories_to_json
    from pipelines.io.shards import split_by_shard

    tables = {s: [t for t in ts if t.num_rows] for s, ts in buffered.items()}
    shards = sorted(s for s, ts in tables.items() if ts)
    if not shards:
        return ShardFlush([], HISTORY.schema.empty_table())
    events = pa.concat_tables([t for s in shards for t in tables[s]])
    touched = pc.unique(events.column("user_id"))
    with ExitStack() as locks:
        for s in shards:  # in shard order, so two writers never wait on each other
            locks.enter_context(shard_lock(output, s))  # the shard's files are the state (see shard_lock)
        loaded = {s: SHARD_STATES.open(output, s) for s in shards}
        previous = pa.concat_tables([loaded[s].rows_of(touched) for s in shards])
        merged = merge_shard(events, previous, max_history=max_history)
        changed = dict(split_by_shard(merged.changed, num_shards))
        empty = merged.state.schema.empty_table()
        for s in shards:
            rows = changed.get(s, empty)
            full = SHARD_STATES.needs_full(output, s)
            if full:  # the shard as it is after this flush
                current = ShardHistories()
                current.add(loaded[s].table())
                current.add(rows)
                rows = current.table()
            path = write_flush(rows, flush_path(output, s, full=full))
            SHARD_STATES.wrote(output, s, path, rows, full=full)
    if sink is not None:
        sink.send_many(histories_to_json(merged.changed))
        sink.flush()
    partitions = events.column(PARTITION).to_numpy()
    offsets = events.column(OFFSET).to_numpy()
    return ShardFlush([(int(p), offsets[partitions == p]) for p in np.unique(partitions)], merged.changed)


class Coalescer(Generic[T]):
    """Runs ``work(keys)`` calls one after another on a background thread; each returns a list
    of results (acknowledgements). Flushes use it with shards as keys, the representation
    refresh with flush numbers.

    ``request(key)`` asks for work on ``key``; a key already waiting is not queued
    twice, and each call takes every key waiting when it starts (``work`` takes
    whatever they hold by then), so a backlog makes calls bigger, not more
    numerous. ``finished`` returns the results of the calls done since its last
    call; ``wait`` first waits for every requested key. A call that failed is
    raised (once) by the next ``finished``/``wait``/``request``, so that bundle
    fails; the events it held are never acknowledged and are read again.
    """

    def __init__(self, work: Callable[[list[int]], list[T]], name: str) -> None:
        self._work, self._name = work, name
        self._lock = threading.Lock()
        self._queued: set[int] = set()
        self._wake = threading.Condition(self._lock)
        self._busy = False
        self._done: queue.Queue[T] = queue.Queue()
        self._errors: queue.Queue[Exception] = queue.Queue()
        threading.Thread(target=self._run, name=f"stream-{name}", daemon=True).start()

    def request(self, key: int) -> None:
        self._raise()
        with self._lock:
            self._queued.add(key)
            self._wake.notify_all()

    def finished(self) -> list[T]:
        self._raise()
        done = []
        while not self._done.empty():
            done.append(self._done.get_nowait())
        return done

    def wait(self) -> list[T]:
        with self._lock:
            self._wake.wait_for(lambda: not self._queued and not self._busy)
        return self.finished()

    def _raise(self) -> None:
        if not self._errors.empty():
            raise self._errors.get_nowait()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: bool(self._queued))
                keys, self._queued, self._busy = sorted(self._queued), set(), True
            try:
                for item in self._work(keys):
                    self._done.put(item)
            except Exception as exc:  # handed to the next bundle, which fails with it
                log.exception("%s of %s failed", self._name, keys)
                self._errors.put(exc)
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()


_WORKERS: dict[str, Any] = {}
_WORKERS_GUARD = threading.Lock()


def shared_worker(key: str, make: Callable[[], W]) -> W:
    """The worker process's one ``make()`` for ``key`` (a job's output folder), made on first use."""
    with _WORKERS_GUARD:
        if key not in _WORKERS:
            _WORKERS[key] = make()
        return cast(W, _WORKERS[key])
