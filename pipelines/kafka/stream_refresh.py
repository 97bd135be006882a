"""The streaming job's precompute step: flushed histories → representations in the online store.

With ``--model`` and ``--store``, each flush of ``AppendHistories`` hands its
result (the touched users' histories and the acknowledgements) to the worker's
:class:`RefreshQueue` instead of acknowledging it. The queue's thread computes
the users' representations (:class:`pipelines.precompute.refresh.Refresher`:
user-level rows, and pair rows for users with a recent candidate set from
``--candidates``), writes them to the store, and only then hands the
acknowledgements back to the bundles. So an offset is committed once its event
is in the history *and* its user's representation has seen it; after a crash the
events are read again and the merge (which drops them as duplicates) still hands
their users here.

The refresh runs on its own thread, like the flushes, so neither a bundle nor
the next flush waits for inference; flushes that finish while a refresh runs
are taken together by the next one (each user once, at their newest history),
so a backlog makes refreshes bigger, not more numerous.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pipelines.kafka.stream_flush import Acks, Coalescer, ShardFlush
from pipelines.kafka.stream_state import newest_rows

if TYPE_CHECKING:  # both import torch: loaded on the worker, when the job starts
    from pipelines.kafka.streaming import StreamConfig
    from pipelines.precompute.refresh import RecentCandidates

__all__ = ["RefreshQueue", "load_recent_candidates", "open_refresh"]

log = logging.getLogger(__name__)


class RefreshQueue:
    """Flushes waiting for their representation refresh; one refresh takes all that wait."""

    def __init__(self, refresh: Callable[[pa.Table], None]) -> None:
        self._refresh = refresh
        self._pending: dict[int, ShardFlush] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        # below the flush thread and the reader: histories come first when the CPU is short
        self._worker: Coalescer[tuple[int, np.ndarray]] = Coalescer(self._run, "refresh", nice=10)

    def submit(self, flushed: ShardFlush) -> None:
        if not flushed.acks:
            return
        number = next(self._numbers)
        with self._lock:
            self._pending[number] = flushed
        self._worker.request(number)

    def finished(self) -> Acks:
        """Acknowledgements of the flushes whose representations are written."""
        return self._worker.finished()

    def wait(self) -> Acks:
        return self._worker.wait()

    def _run(self, numbers: list[int]) -> Acks:
        with self._lock:
            flushes = [self._pending.pop(n) for n in numbers]
        self._refresh(newest_rows([f.histories for f in flushes]))
        return [ack for f in flushes for ack in f.acks]


def load_recent_candidates(patterns: Sequence[str], ttl_s: float) -> RecentCandidates:
    """A :class:`RecentCandidates` of every CANDIDATES file matched by ``patterns``."""
    from pipelines.io.files import expand_inputs
    from pipelines.io.parquet import read_table
    from pipelines.precompute.refresh import RecentCandidates
    from schemas.layouts import CANDIDATES

    paths = expand_inputs(list(patterns), "--candidates")
    table = pa.concat_tables([read_table(p, CANDIDATES) for p in paths])
    return RecentCandidates.from_table(table, ttl_s=ttl_s, source=",".join(paths))


def open_refresh(config: StreamConfig) -> Callable[[pa.Table], None]:
    """``refresh(histories)``: their representations, computed with ``config.model`` and written to
    ``config.store`` (the model, candidates and store are opened once, here)."""
    import torch

    from pipelines.model.checkpoint import load_model
    from pipelines.precompute.refresh import Refresher
    from pipelines.store import open_store

    assert config.model is not None and config.store is not None  # StreamConfig checks both
    torch.set_num_threads(config.torch_threads)  # more threads mostly spin against the reader and flusher
    model = load_model(config.model, device=config.device)
    candidates = load_recent_candidates(config.candidates, config.candidate_ttl_s) if config.candidates else None
    refresher = Refresher(model, model.model_version, candidates=candidates)
    store = open_store(config.store)

    def refresh(histories: pa.Table) -> None:
        started = time.perf_counter()
        table = refresher.refresh(histories, computed_at_ms=int(time.time() * 1000))
        store.write_batch(table)
        log.debug("refreshed %d representations of %d users in %.3f s", table.num_rows, histories.num_rows,
                  time.perf_counter() - started)

    return refresh
