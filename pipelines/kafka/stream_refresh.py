"""The streaming job's precompute step: touched histories → representations in the online store.

With ``--model`` and ``--store``, each flush of ``AppendHistories`` hands its
touched users' histories and its acknowledgements to
:class:`RefreshRepresentationsFn`, which computes their representations
(:class:`pipelines.precompute.refresh.Refresher`: user-level rows, and pair rows
for users with a recent candidate set from ``--candidates``), writes them to the
store, and only then passes the acknowledgements on to ``CommitOffsets``. So an
offset is committed once its event is in the history *and* the user's
representation has seen it; after a crash the events are read again and the merge
(which drops them as duplicates) still hands their users here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import apache_beam as beam
import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # both import torch: loaded on the worker, in setup
    from pipelines.kafka.streaming import StreamConfig
    from pipelines.precompute.refresh import RecentCandidates

__all__ = ["RefreshRepresentationsFn", "load_recent_candidates"]

log = logging.getLogger(__name__)


def load_recent_candidates(patterns: tuple[str, ...], ttl_s: float) -> RecentCandidates:
    """A :class:`RecentCandidates` of every CANDIDATES file matched by ``patterns``."""
    from pipelines.io.files import expand_inputs
    from pipelines.io.parquet import read_table
    from pipelines.precompute.refresh import RecentCandidates
    from schemas.layouts import CANDIDATES

    paths = expand_inputs(list(patterns), "--candidates")
    table = pa.concat_tables([read_table(p, CANDIDATES) for p in paths])
    return RecentCandidates.from_table(table, ttl_s=ttl_s, source=",".join(paths))


class RefreshRepresentationsFn(beam.DoFn):
    """(touched histories, acks) → representations written to the store, then the acks."""

    def __init__(self, config: StreamConfig) -> None:
        self._config = config

    def setup(self) -> None:
        from pipelines.model.checkpoint import load_model
        from pipelines.precompute.refresh import Refresher
        from pipelines.store import open_store

        config = self._config
        assert config.model is not None and config.store is not None  # StreamConfig checks both
        model = load_model(config.model, device=config.device)
        candidates = load_recent_candidates(config.candidates, config.candidate_ttl_s) if config.candidates else None
        self._refresher = Refresher(model, model.model_version, candidates=candidates)
        self._store = open_store(config.store)

    def process(self, element: tuple[pa.Table, list[tuple[int, np.ndarray]]]) -> Iterator[tuple[int, np.ndarray]]:
        histories, acks = element
        started = time.perf_counter()
        table = self._refresher.refresh(histories, computed_at_ms=int(time.time() * 1000))
        self._store.write_batch(table)
        log.debug("refreshed %d representations of %d users in %.3f s", table.num_rows, histories.num_rows,
                  time.perf_counter() - started)
        yield from acks

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.close()
