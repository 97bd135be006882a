"""Historical representations (LoopFM): the GEM model's representation of each engagement in a
user's history, as of that engagement, kept as a jagged sequence per user.

For event ``i`` of a user (an impression, click, conversion ... on an ad or an organic item), its
representation is the model's pair representation of (user, the event's item, its surface),
computed by the precompute stage's own batch builder at the event's time: the history it reads
holds the user's events strictly before event ``i``, so it never reads its own outcome (a click
or conversion comes later) nor anything after it. A training example whose history ends at
``history_end`` reads the representations of events ``[history_end - L, history_end)`` only, all
computed from events before the example.

Layout (``pipelines.schemas.layouts.REP_HISTORY``): one row per user, ``events`` a list of
``(position, event_time, embedding)`` oldest to newest, ``position`` the event's place in the
user's stored history list.

A stream (``stream --rep-history N``) appends to each user's row as events arrive (new events
only, :mod:`pipelines.streaming.rep_history`); :func:`latest_rep_history` reads either output, the
newest row of each user.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.io.parquet import read_table, rows_of_user
from pipelines.io.shards import SHARD_DIR, SHARD_GLOB, newest_per_user
from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.model.reps import PairQueries, pair_reps
from pipelines.schemas.layouts import REP_HISTORY, Layout, rep_history_schema

__all__ = [
    "REP_HISTORY_KIND",
    "RepHistory",
    "compute_rep_history",
    "events_needed",
    "latest_events",
    "latest_rep_history",
    "newest_rep_rows",
    "rep_history_layout",
    "rep_history_of",
    "rep_history_table",
    "rep_sequences",
    "rep_shard_bytes",
    "stored_reps",
]

#: The folder of an output that holds the historical representations (precompute's parts, a stream's flushes).
REP_HISTORY_KIND = "rep_history"


@dataclass(frozen=True)
class RepHistory:
    """Representations of ``E`` events: ``event (E,) int64`` the event's flat index in the
    :class:`HistoryIndex` (sorted ascending, unique), ``embedding (E, R) float32`` (float16-rounded,
    as a store keeps it)."""

    event: np.ndarray
    embedding: np.ndarray

    def __len__(self) -> int:
        return len(self.event)


def _window(index: HistoryIndex, rows: np.ndarray, ends: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(flat (N, L) int64, valid (N, L) bool)``: the flat indices of each example's last ``length``
    events before its ``history_end``, right-aligned (newest last); rows of -1 have none."""
    rows = np.asarray(rows, np.int64)
    start = index.offsets[np.maximum(rows, 0)]
    end = start + np.asarray(ends, np.int64)
    flat = end[:, None] - length + np.arange(length, dtype=np.int64)[None, :]
    valid = (flat >= start[:, None]) & (rows[:, None] >= 0)
    return np.where(valid, flat, 0), valid


def events_needed(index: HistoryIndex, rows: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
    """The flat indices (sorted, unique) of every event inside some example's last-``length`` window."""
    flat, valid = _window(index, rows, ends, length)
    return np.unique(flat[valid])


def compute_rep_history(model: GemModel, index: HistoryIndex, events: np.ndarray) -> RepHistory:
    """The model's as-of representation of each flat event index in ``events`` (see the module
    docstring): one single-ad request per event, at the event's own time."""
    events = np.unique(np.asarray(events, np.int64))
    row_of = np.searchsorted(index.offsets, events, side="right") - 1
    cols = index.columns
    queries = PairQueries(
        index.user_ids[row_of],
        cols["item_id"][events],
        cols["advertiser_id"][events],
        cols["category"][events],
        cols["surface"][events],
    )
    got = pair_reps(model, index, queries, index.event_time[events])
    return RepHistory(events, got.pair.astype(np.float16).astype(np.float32))


def rep_sequences(
    history: RepHistory,
    index: HistoryIndex,
    rows: np.ndarray,
    ends: np.ndarray,
    length: int,
    fallback: np.ndarray | None = None,
) -> np.ndarray:
    """``(N, L, R) float32``: each example's last ``length`` historical representations before its
    ``history_end``, right-aligned, all-zero vectors where there is none (padding). An example with
    none at all gets ``fallback[i]`` (its as-of user representation, as the resolver would hand
    it) in the newest slot, when given. Every needed event must be in ``history``."""
    flat, valid = _window(index, rows, ends, length)
    pos = np.searchsorted(history.event, flat)
    found = valid & (pos < len(history)) & (history.event[np.minimum(pos, len(history) - 1)] == flat)
    if not np.array_equal(found, valid):
        raise ValueError(f"{int((valid & ~found).sum())} window events have no representation; compute them first")
    dim = history.embedding.shape[1]
    out = np.zeros((len(flat), length, dim), np.float32)
    out[valid] = history.embedding[pos[valid]]
    if fallback is not None:
        empty = ~valid.any(axis=1)
        out[empty, -1] = fallback[empty]
    return out


def rep_history_table(history: RepHistory, index: HistoryIndex) -> pa.Table:
    """The ``REP_HISTORY`` layout (with its name and version in the metadata): one row per user with
    representations, events oldest to newest."""
    row_of = np.searchsorted(index.offsets, history.event, side="right") - 1
    users, starts = np.unique(row_of, return_index=True)
    offsets = np.append(starts, len(history)).astype(np.int32)
    dim = history.embedding.shape[1]
    items = pa.StructArray.from_arrays(
        [
            pa.array((history.event - index.offsets[row_of]).astype(np.int32)),
            pa.array(index.event_time[history.event]).cast(pa.timestamp("ms", tz="UTC")),
            pa.FixedSizeListArray.from_arrays(pa.array(history.embedding.ravel().astype(np.float16)), dim),
        ],
        fields=list(rep_history_schema(dim).field("events").type.value_type),
    )
    table = pa.table(
        {"user_id": pa.array(index.user_ids[users]), "events": pa.ListArray.from_arrays(pa.array(offsets), items)},
        schema=rep_history_schema(dim),
    )
    return table.cast(REP_HISTORY.with_metadata(table.schema))


def latest_events(index: HistoryIndex, length: int) -> np.ndarray:
    """The flat indices of each user's newest ``length`` stored events (a backfill's events)."""
    starts = np.maximum(index.offsets[1:] - length, index.offsets[:-1])
    sizes = index.offsets[1:] - starts
    return np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))


def rep_history_layout(dim: int) -> Layout:
    """The ``rep_history`` layout for embeddings of ``dim`` values."""
    return dataclasses.replace(REP_HISTORY, schema=rep_history_schema(dim))


def stored_reps(row: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A REP_HISTORY table's events, flat: ``position (E,) int64``, ``embedding (E, R) float32``
    (the stored float16 values, exact)."""
    items = row.column("events").combine_chunks().flatten()
    embedding = items.field("embedding")
    dim = embedding.type.list_size
    values = embedding.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return items.field("position").to_numpy().astype(np.int64), values.reshape(len(items), dim)


def newest_rep_rows(tables: list[pa.Table]) -> pa.Table:
    """REP_HISTORY rows sorted by user: each user's last row over ``tables`` in order
    (:func:`pipelines.io.shards.newest_per_user`)."""
    return newest_per_user(tables, REP_HISTORY.schema.empty_table())


def _rep_files(folder: str, shard: int | None) -> list[Path]:
    """A backfill's parts (``part-*``, oldest) then a stream's flush files in time order."""
    where = SHARD_DIR.format(shard) if shard is not None else SHARD_GLOB
    files = list(Path(folder, REP_HISTORY_KIND).glob(f"{where}/*.parquet"))
    parts = sorted(f for f in files if f.name.startswith("part-"))
    flushes = sorted((f for f in files if f.name.startswith("flush-")), key=lambda f: f.name)
    return parts + flushes


def rep_history_of(folder: str, shard: int, user: int) -> pa.Table:
    """``user``'s newest REP_HISTORY row in the shard's files (0 or 1 rows), reading only the row
    groups that can hold it (:func:`pipelines.io.parquet.rows_of_user`)."""
    return newest_rep_rows([rows_of_user(str(f), user, REP_HISTORY) for f in _rep_files(folder, shard)])


def rep_shard_bytes(folder: str, shard: int) -> int:
    """The bytes on disk of the shard's REP_HISTORY files."""
    return sum(f.stat().st_size for f in _rep_files(folder, shard))


def latest_rep_history(folder: str, shard: int | None = None) -> pa.Table:
    """The historical representations under ``folder/rep_history/`` (of one shard, or all), whether
    ``precompute --rep-history`` or ``stream --rep-history`` wrote them: the newest row of each user."""
    return newest_rep_rows([read_table(str(f), REP_HISTORY) for f in _rep_files(folder, shard)])
