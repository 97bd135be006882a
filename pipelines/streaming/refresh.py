"""The streaming job's precompute step, inside the graph: flushed histories → representations in the store.

With ``--model`` and ``--store``, :class:`Refresh` (Beam's RunInference with
:class:`RefreshModelHandler`) takes the changed histories from ``WriteHistories``
(the rows with their acknowledgements, batched up to :data:`BATCH_ROWS` rows), computes
the users' representations (:class:`pipelines.precompute.refresh.Refresher`:
user-level rows, and pair rows for users with a recent candidate set from
``--candidates``), writes them to the store, and only then passes the
acknowledgements on. So an offset is committed once its event is in the history
*and* its user's representation has seen it; after a crash the events are read
again and the merge (which drops them as duplicates) still hands their users here.

The model, candidates and store are loaded once per worker process and shared by
its threads (RunInference's shared model handle).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from pipelines.streaming.config import StreamConfig

if TYPE_CHECKING:  # imports torch: loaded on the worker, when the job starts
    from pipelines.precompute.refresh import RecentCandidates

__all__ = [
    "AckAfterInference",
    "Refresh",
    "RefreshModelHandler",
    "flushed_rows",
    "load_recent_candidates",
    "open_refresh",
]

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


def open_refresh(config: StreamConfig) -> Refreshing:
    """A :class:`Refreshing` whose ``refresh(histories)`` computes their representations with
    ``config.model`` and writes them to ``config.store`` (model, candidates and store opened once, here)."""
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

    return Refreshing(refresh, model.model_version)


class Refreshing:
    """What RunInference loads once per worker process (``load_model``): ``open_refresh``'s function,
    called by one thread at a time (the Refresher's ad catalog and the store client are not
    thread-safe; torch uses the process's cores anyway)."""

    def __init__(self, refresh: Callable[[pa.Table], None], model_version: str) -> None:
        self._refresh, self.model_version = refresh, model_version
        self._lock = threading.Lock()

    def refresh(self, histories: pa.Table) -> None:
        with self._lock:
            self._refresh(histories)


#: Changed histories and the acknowledgements that wait for their representations.
Flushed = tuple[pa.Table, Any]

#: Rows of histories per call of the model handler; a bundle's smaller flushes are batched up to it.
BATCH_ROWS = 2048


def flushed_rows(element: Flushed) -> int:
    """An element's weight for ``BatchElements``: its rows, at least 1 (acknowledgements alone still
    count) and at most :data:`BATCH_ROWS`, so no element outweighs a batch (``BatchElements`` emits
    an empty batch before an element heavier than its target)."""
    return max(1, min(element[0].num_rows, BATCH_ROWS))


class RefreshModelHandler(ModelHandler[Flushed, PredictionResult, Refreshing]):
    """Beam RunInference's handler for the stream: a batch of flushed (histories, acks) → the users'
    representations computed and written to the store → each element's acknowledgements, as the
    example of its ``PredictionResult`` (so they go on only after the write)."""

    def __init__(self, config: StreamConfig) -> None:
        super().__init__()
        self._config = config

    def load_model(self) -> Refreshing:
        return open_refresh(self._config)

    def run_inference(
        self, batch: Sequence[Flushed], model: Refreshing, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        from pipelines.streaming.metrics import shared_metrics

        histories = [h for h, _ in batch if h.num_rows]
        if histories:
            merged = pa.concat_tables(histories)
            started = time.perf_counter()
            model.refresh(merged)
            metrics = shared_metrics("stream")
            metrics.step("refresh", time.perf_counter() - started)
            newest = merged.column("last_event_time").cast(pa.int64()).to_numpy()
            metrics.fresh("event_to_user_rep", time.time() - newest / 1000.0)
        # Only the acknowledgements go on: the tables are done with, and a PredictionResult crosses
        # Prism's stages pickled (a pickled table slice carries its parent's whole buffers).
        return [PredictionResult(acks, None, model_id=model.model_version) for _, acks in batch]

    def get_num_bytes(self, batch: Sequence[Flushed]) -> int:
        return sum(h.nbytes for h, _ in batch)

    def get_metrics_namespace(self) -> str:
        return "stream_refresh"

    def batch_elements_kwargs(self) -> Mapping[str, Any]:
        return {"min_batch_size": BATCH_ROWS, "max_batch_size": BATCH_ROWS, "element_size_fn": flushed_rows}


class AckAfterInference(beam.PTransform):
    """Elements → Beam's RunInference with ``handler`` (its writes done) → the acknowledgements each
    ``PredictionResult`` carries as its example, one by one."""

    def __init__(self, handler: ModelHandler) -> None:
        super().__init__()
        self._handler = handler

    def expand(self, elements: beam.PCollection) -> beam.PCollection:
        return (
            elements
            | "RunInference" >> RunInference(self._handler)
            | "Written" >> beam.FlatMap(lambda result: result.example)
        )


class Refresh(AckAfterInference):
    """(changed histories, acks) → their representations in the store → the acks, through
    :class:`RefreshModelHandler` (the model loaded once per worker process and shared by its threads)."""

    def __init__(self, config: StreamConfig) -> None:
        super().__init__(RefreshModelHandler(config))
