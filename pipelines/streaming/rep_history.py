"""Historical representations in the stream (``stream --rep-history N --model M``): each flush
appends, to each touched user's REP_HISTORY row, the model's representation of the events it added.

The keyed flush (:class:`pipelines.streaming.keyed.AppendUserHistoryFn`) merges a user's new
events into their history and then calls :meth:`RepHistoryStep.append`: the user's row of
historical representations is kept in keyed state beside the history, its old entries are
carried over (moved to their events' new positions, the newest N kept), and only the events of
the newest-N window that have no representation yet (normally: the events this flush added)
go through the model, with the batch builder of :mod:`pipelines.model.rep_history` over the
merged history, so each is computed as of its own event from the events strictly before it.
The model's cost grows with the new events, not with the user's history or the users held.

:class:`WriteRepHistoriesFn` writes a bundle's rows as one flush file per shard under
``OUTPUT/rep_history/`` (atomically) before it passes the histories and their acknowledgements
on, so an offset is committed only once its event's representation is durable too.
:func:`pipelines.model.rep_history.latest_rep_history` reads them (the newest row per user), as it
reads a ``precompute --rep-history`` backfill.

A late event (older than some stored ones) gets its representation as of its own time; the
events after it keep theirs, computed before it arrived (recomputing them would cost the
user's window on every late event). A user first seen by a fresh job gets its row from the
flush files (:class:`pipelines.streaming.keyed.FirstSight`); entries whose event no longer
sits at the stored position (a crash between the two flush files) are dropped and recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.shared import Shared
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.io.shards import once_per_user, split_by_shard, user_shard
from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.model.rep_history import (
    REP_HISTORY_KIND,
    RepHistory,
    compute_rep_history,
    latest_rep_history,
    rep_history_layout,
    rep_history_of,
    rep_history_table,
    rep_shard_bytes,
    stored_reps,
)
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.keyed import FirstSight, FlushedWithReps
from pipelines.streaming.state import flush_path, write_flush

__all__ = ["RepHistoryStep", "RepRows", "WriteRepHistoriesFn", "append_rep_history"]


def _window(row: pa.Table, length: int) -> tuple[int, pa.Table]:
    """(the first position of the newest ``length`` events, those events) of a one-row HISTORY table."""
    if not row.num_rows:
        return 0, pa.table({"event_id": pa.array([], pa.string()), "event_time": pa.array([], pa.int64())})
    events = row.column("events").combine_chunks().flatten()
    start = max(0, len(events) - length)
    tail = events.slice(start)
    return start, pa.table(
        {"event_id": tail.field("event_id"), "event_time": tail.field("event_time").cast(pa.int64())}
    )


def _carried(previous: pa.Table, changed: pa.Table, carried: pa.Table | None, length: int, dim: int) -> RepHistory:
    """The ``carried`` representations (positions in ``previous``) at their events' positions in
    ``changed`` (flat indices of its one row), those out of the newest ``length`` dropped, and
    those whose event is not at its stored position (by event time) dropped too."""
    old_start, old = _window(previous, length)
    if carried is None or not carried.num_rows or not old.num_rows:
        return RepHistory(np.zeros(0, np.int64), np.zeros((0, dim), np.float32))
    positions, embedding = stored_reps(carried)
    times = pc.list_flatten(carried.column("events")).combine_chunks().field("event_time").cast(pa.int64())
    at = positions - old_start
    inside = (at >= 0) & (at < old.num_rows)
    at = np.where(inside, at, 0)
    inside &= old.column("event_time").to_numpy()[at] == times.to_numpy()
    new_start, new = _window(changed, length)
    moved = pc.index_in(old.column("event_id").take(pa.array(at)), value_set=new.column("event_id"))
    moved = pc.fill_null(moved, -1).to_numpy().astype(np.int64)
    keep = inside & (moved >= 0)
    return RepHistory(new_start + moved[keep], embedding[keep])


def append_rep_history(
    model: GemModel, previous: pa.Table, changed: pa.Table, carried: pa.Table | None, length: int
) -> pa.Table:
    """One user's REP_HISTORY row after a flush: ``carried`` (the row before it, positions in the
    one-row HISTORY table ``previous``) moved to the merged history ``changed``, plus the model's
    as-of representation of every event of the newest ``length`` that has none (the new ones)."""
    dim = model.config.representation_dim
    kept = _carried(previous, changed, carried, length, dim)
    index = HistoryIndex(changed)
    start = max(0, index.num_events - length)
    missing = np.setdiff1d(np.arange(start, index.num_events, dtype=np.int64), kept.event)
    if len(missing):
        fresh = compute_rep_history(model, index, missing)
        order = np.argsort(np.r_[kept.event, fresh.event], kind="stable")
        kept = RepHistory(
            np.r_[kept.event, fresh.event][order], np.concatenate([kept.embedding, fresh.embedding])[order]
        )
    return rep_history_table(kept, index)


class RepRows:
    """One shard's REP_HISTORY rows by user (a fresh job's first sight of a user's row)."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self._row = {u: i for i, u in enumerate(table.column("user_id").to_pylist())}

    @classmethod
    def load(cls, output: str, shard: int) -> RepRows:
        return cls(latest_rep_history(output, shard))

    def rows_of(self, users: list[int]) -> pa.Table:
        return self._table.take(pa.array([self._row[u] for u in users if u in self._row], pa.int64()))


#: Per worker process, like the histories' first sight (:data:`pipelines.streaming.keyed.FIRST_SIGHT_SHARDS`).
_FIRST_SIGHT = FirstSight(load=RepRows.load, read_user=rep_history_of, size=rep_shard_bytes)


class _Model:
    """The loaded model, in a class so that ``Shared`` can hold it (weak references)."""

    def __init__(self, model: GemModel) -> None:
        self.model = model


class RepHistoryStep:
    """The part of the keyed flush that keeps a user's historical representations (see the module
    docstring); the model is loaded once per worker process and shared by its threads."""

    def __init__(self, config: StreamConfig) -> None:
        self._config = config
        self._shared = Shared()

    def setup(self) -> None:
        self._model = self._shared.acquire(self._load, tag=f"{self._config.output}:rep_history").model

    def _load(self) -> _Model:
        import torch

        from pipelines.model.checkpoint import load_model

        assert self._config.model is not None  # StreamConfig refuses --rep-history without --model
        torch.set_num_threads(self._config.torch_threads)
        return _Model(load_model(self._config.model, device=self._config.device))

    def append(self, user: int, previous: pa.Table, changed: pa.Table, state: Any) -> pa.Table:
        """The user's row after this flush (also written to ``state``, the keyed REP_HISTORY row)."""
        from pipelines.streaming.metrics import shared_metrics

        started = time.perf_counter()
        carried = state.read()
        if carried is None:  # first sight (a fresh job): the flush files hold the user's row so far
            shard = int(user_shard(np.asarray([user], np.int64), self._config.num_shards)[0])
            carried = _FIRST_SIGHT.row_of(self._config.output, shard, user)
        row = append_rep_history(self._model, previous, changed, carried, self._config.rep_history)
        state.write(row)
        shared_metrics("stream").step("rep_history", time.perf_counter() - started)
        return row


class WriteRepHistoriesFn(beam.DoFn):
    """Per bundle: the REP_HISTORY rows as one flush file per shard, then each element's (changed
    histories, acknowledgements) on to ``WriteHistories``: nothing goes on before its rows are durable."""

    def __init__(self, config: StreamConfig) -> None:
        self._config = config

    def start_bundle(self) -> None:
        self._held: list[tuple[FlushedWithReps, Any]] = []

    def process(self, element: FlushedWithReps, stamp: Any = beam.DoFn.TimestampParam) -> None:
        self._held.append((element, stamp))

    def finish_bundle(self) -> Iterator[WindowedValue]:
        rows = [reps for (_, _, reps), _ in self._held if reps.num_rows]
        if rows:
            table = once_per_user(rows, rows[0].slice(0, 0))  # a user flushed twice in the bundle: its last row
            layout = rep_history_layout(table.schema.field("events").type.value_type.field("embedding").type.list_size)
            for shard, part in split_by_shard(table, self._config.num_shards):
                write_flush(part, flush_path(self._config.output, shard, folder=REP_HISTORY_KIND), layout)
        for (changed, acks, _), stamp in self._held:
            yield WindowedValue((changed, acks), stamp, (GlobalWindow(),))
        self._held = []
