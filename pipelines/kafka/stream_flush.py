"""Flushing a shard's buffered events into its histories, off the Beam bundle's thread.

:func:`flush_shard` merges buffered EVENT tables into the shard's histories,
writes the changed rows as one flush file (atomically), publishes them when
asked, and returns the flushed offsets per partition, which may be
acknowledged only now. :class:`Flusher` runs these flushes on one thread of the
worker, so a bundle never waits for a merge or a write (on Prism the next
bundle of the stage waited for it: ~0.2 s p50 and ~1 s p99 between the reader
and ``AppendHistories`` in a lab freshness run); later bundles pick up the
acknowledgements with :meth:`Flusher.finished`.

Nothing changes for delivery: offsets are acknowledged only after their flush
is durable, so a worker that dies with flushes queued or acknowledgements not
yet emitted has its events read again from the committed offsets, and the
merge drops those a history already holds.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.kafka.stream_state import (
    COMPACT_EVERY,
    OFFSET,
    PARTITION,
    SHARD_STATES,
    flush_path,
    merge_shard,
    shard_lock,
    write_flush,
)

__all__ = ["Acks", "Flusher", "flush_shard", "shared_flusher"]

log = logging.getLogger(__name__)

#: (partition, offsets) pairs made durable by a flush.
Acks = list[tuple[int, np.ndarray]]


def flush_shard(output: str, shard: int, tables: list[pa.Table], *, max_history: int, sink: Any = None) -> Acks:
    """Merge ``tables`` (EVENT + ``_partition``/``_offset``) into ``shard``'s histories; their offsets."""
    from pipelines.kafka.encode import histories_to_json

    tables = [t for t in tables if t.num_rows]
    if not tables:
        return []
    events = pa.concat_tables(tables)
    with shard_lock(output, shard):  # the shard's files are the state (see shard_lock)
        state, files = SHARD_STATES.load(output, shard)
        merged = merge_shard(events, state, max_history=max_history)
        full = files >= COMPACT_EVERY
        path = write_flush(merged.state if full else merged.changed, flush_path(output, shard, full=full))
        SHARD_STATES.wrote(output, shard, path, merged.state, full=full)
    if sink is not None:
        sink.send_many(histories_to_json(merged.changed))
        sink.flush()
    partitions = events.column(PARTITION).to_numpy()
    offsets = events.column(OFFSET).to_numpy()
    return [(int(p), offsets[partitions == p]) for p in np.unique(partitions)]


class Flusher:
    """Runs ``flush(shard)`` calls one after another on a background thread.

    ``request(shard)`` asks for a flush of ``shard``; a shard already waiting in
    the queue is not queued twice, and ``flush`` takes whatever the shard holds
    when its turn comes, so a backlog makes flushes bigger, not more numerous.
    ``finished`` returns the acknowledgements of the flushes done since its last
    call; ``wait`` first waits for every requested flush. A flush that failed is
    raised (once) by the next call, so that bundle fails; the events it held are
    never acknowledged and are read again.
    """

    def __init__(self, flush: Callable[[int], Acks]) -> None:
        self._flush = flush
        self._lock = threading.Lock()
        self._queued: set[int] = set()
        self._jobs: queue.Queue[int] = queue.Queue()
        self._done: queue.Queue[tuple[int, np.ndarray]] = queue.Queue()
        self._errors: queue.Queue[Exception] = queue.Queue()
        threading.Thread(target=self._run, name="stream-flusher", daemon=True).start()

    def request(self, shard: int) -> None:
        self._raise()
        with self._lock:
            if shard in self._queued:
                return
            self._queued.add(shard)
        self._jobs.put(shard)

    def finished(self) -> Acks:
        self._raise()
        acks = []
        while not self._done.empty():
            acks.append(self._done.get_nowait())
        return acks

    def wait(self) -> Acks:
        self._jobs.join()
        return self.finished()

    def _raise(self) -> None:
        if not self._errors.empty():
            raise self._errors.get_nowait()

    def _run(self) -> None:
        while True:
            shard = self._jobs.get()
            with self._lock:  # from now on, a new request for the shard queues another flush
                self._queued.discard(shard)
            try:
                for ack in self._flush(shard):
                    self._done.put(ack)
            except Exception as exc:  # handed to the next bundle, which fails with it
                log.exception("flush of shard %d failed", shard)
                self._errors.put(exc)
            finally:
                self._jobs.task_done()


_FLUSHERS: dict[str, Flusher] = {}
_FLUSHERS_GUARD = threading.Lock()


def shared_flusher(key: str, make: Callable[[], Flusher]) -> Flusher:
    """The worker's one flusher for ``key`` (a job's output folder), made on first use."""
    with _FLUSHERS_GUARD:
        if key not in _FLUSHERS:
            _FLUSHERS[key] = make()
        return _FLUSHERS[key]
