"""The streaming job's precompute step, inside the graph: flushed histories → representations in the store.

With ``--model`` and ``--store``, :class:`RefreshFn` takes each batch of changed
histories from ``WriteHistories`` (the rows with their acknowledgements), computes
the users' representations (:class:`pipelines.precompute.refresh.Refresher`:
user-level rows, and pair rows for users with a recent candidate set from
``--candidates``), writes them to the store, and only then passes the
acknowledgements on. So an offset is committed once its event is in the history
*and* its user's representation has seen it; after a crash the events are read
again and the merge (which drops them as duplicates) still hands their users here.

The model, candidates and store are loaded once per worker process and shared by
its threads (``apache_beam.utils.shared.Shared``, the mechanism RunInference uses
for its shared model).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.utils.shared import Shared

from pipelines.streaming.config import StreamConfig

if TYPE_CHECKING:  # imports torch: loaded on the worker, when the job starts
    from pipelines.precompute.refresh import RecentCandidates

__all__ = ["RefreshFn", "load_recent_candidates", "open_refresh"]

log = logging.getLogger(__name__)


def load_recent_candidates(patterns: Sequence[str], ttl_s: float) -> RecentCandidates:
    """A :class:`RecentCandidates` of every CANDIDATES file matched by ``patterns``."""
    from pipelines.io.files import expand_inputs
    from pipelines.io.parquet import read_table
    from pipelines.precompute.refresh import RecentCandidates
    from pipelines.schemas.layouts import CANDIDATES

    paths = expand_inputs(list(patterns), "--candidates")
    table = pa.concat_tables([read_table(p, CANDIDATES) for p in paths])
    return RecentCandidates.from_table(table, ttl_s=ttl_s, source=",".join(paths))


def open_refresh(config: StreamConfig) -> Callable[[pa.Table], None]:
    """``refresh(histories)``: their representations, computed with ``config.model`` and written
    to ``config.store`` (the model, candidates and store are opened once, here)."""
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
        log.debug(
            "refreshed %d representations of %d users in %.3f s",
            table.num_rows,
            histories.num_rows,
            time.perf_counter() - started,
        )

    return refresh


class _Opened:
    """``open_refresh``'s function, in a class so that ``Shared`` can hold it (weak references)."""

    def __init__(self, refresh: Callable[[pa.Table], None]) -> None:
        self.refresh = refresh


class RefreshFn(beam.DoFn):
    """(changed histories, acks) → their representations written to the store → the acks."""

    def __init__(self, config: StreamConfig) -> None:
        self._config = config
        self._shared = Shared()

    def setup(self) -> None:
        self._opened = self._shared.acquire(lambda: _Opened(open_refresh(self._config)), tag=self._config.output)

    def process(self, element: tuple[pa.Table, Any]) -> Iterator[tuple[pa.Table, Any]]:
        from pipelines.streaming.metrics import shared_metrics

        histories, acks = element
        if histories.num_rows:
            started = time.perf_counter()
            self._opened.refresh(histories)
            shared_metrics("stream").step("refresh", time.perf_counter() - started)
            newest = histories.column("last_event_time").cast(pa.int64()).to_numpy()
            shared_metrics("stream").fresh("event_to_user_rep", time.time() - newest / 1000.0)
        yield histories, acks
