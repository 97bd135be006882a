"""One user's history merge for the keyed stream graph: pure Arrow and numpy, no Beam.

The keyed graph flushes one user at a time, a few events at a time. The batch build
(:func:`pipelines.features.histories.build_histories`, Polars) is made for many users at
once and pays milliseconds of fixed cost per call (it also computes training examples the
stream does not keep), so per flush it cost more than everything else in the graph.
:func:`merge_user` gives the same HISTORY row for one user in tens of microseconds plus the
cost of the events it touches; ``tests/streaming/test_user_merge.py`` checks it equals the
batch build on generated inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.io.parquet import conform
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT, HISTORY, HISTORY_EVENT, TIME
from pipelines.settings import MAX_HISTORY

_FIELDS = [f.name for f in HISTORY_EVENT]
_BY_TIME = [("event_time", "ascending"), ("event_id", "ascending")]
_EVENTS_TYPE = HISTORY.schema.field("events").type
_SUMMARY_TYPE = HISTORY.schema.field("summary").type
_HELD = pa.schema(list(HISTORY_EVENT))


def merge_user(events: pa.Table, previous: pa.Table | None, *, max_history: int) -> pa.Table:
    """The HISTORY row of one user after ``events`` (EVENT layout, that user's only) are merged
    into ``previous`` (the user's HISTORY row, or None / empty for a user seen first): events
    already held (same ``event_id``) are dropped, the newest ``max_history`` are kept by
    ``(event_time, event_id)`` and the rest is counted into the summary. Equal to
    ``build_histories(events, previous, max_history=...).histories``."""
    MAX_HISTORY.check(max_history)
    before = _Before.of(previous)
    fresh = _fresh(events, before.events.column("event_id"))
    if not fresh.num_rows:
        assert previous is not None  # nothing new: only a previous row can be left
        return conform(previous, HISTORY)
    merged = pa.concat_tables([before.events, _as(fresh.select(_FIELDS), _HELD)])
    if not _ascending_after(before.events, fresh):  # a late event: it goes to its place
        merged = merged.take(pc.sort_indices(merged, _BY_TIME))
    cut = max(0, merged.num_rows - max_history)
    kept, evicted = merged.slice(cut), merged.slice(0, cut)
    newest = int(_millis(fresh.column("event_time")).max())
    watermark = max(newest, before.watermark_ms)
    held = pa.StructArray.from_arrays([kept.column(f).combine_chunks() for f in _FIELDS], fields=list(HISTORY_EVENT))
    columns = [
        pa.array([int(fresh.column("user_id")[0].as_py())], pa.int64()),
        pa.ListArray.from_arrays(pa.array([0, len(held)], pa.int32()), held, type=_EVENTS_TYPE),
        pa.array([_summary(evicted, before.summary)], _SUMMARY_TYPE),
        pa.array([before.total + fresh.num_rows], pa.int64()),
        pa.array([int(_millis(kept.column("event_time"))[-1])], TIME),
        pa.array([watermark], TIME),
    ]
    return pa.Table.from_arrays(columns, schema=HISTORY.schema)


def _as(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``; as it is when it already has it (a cast per column costs
    microseconds each, which a one-event flush feels)."""
    return table if table.schema == schema else table.cast(schema)


def _millis(times: pa.ChunkedArray) -> np.ndarray:
    """Timestamps (ms) as int64 milliseconds."""
    return times.combine_chunks().view(pa.int64()).to_numpy()


def _ascending_after(held: pa.Table, fresh: pa.Table) -> bool:
    """Whether ``fresh`` (sorted) all comes after the last of ``held`` (sorted) by (time, id):
    the usual flush, whose concatenation needs no sort."""
    if not held.num_rows:
        return True
    last = (int(_millis(held.column("event_time"))[-1]), held.column("event_id")[-1].as_py())
    first = (int(_millis(fresh.column("event_time"))[0]), fresh.column("event_id")[0].as_py())
    return first > last


@dataclass(frozen=True)
class _Before:
    """What a merge needs of the user's previous HISTORY row (none: a user seen first)."""

    events: pa.Table  # the held events, HISTORY_EVENT columns
    summary: dict[str, Any] | None
    total: int
    watermark_ms: int

    @classmethod
    def of(cls, previous: pa.Table | None) -> _Before:
        if previous is None or not previous.num_rows:
            return cls(_HELD.empty_table(), None, 0, 0)
        held = pc.list_flatten(previous.column("events")).combine_chunks()
        return cls(
            pa.Table.from_arrays([held.field(f) for f in _FIELDS], schema=_HELD),
            previous.column("summary")[0].as_py(),
            int(previous.column("num_events_total")[0].as_py()),
            _ms(previous.column("watermark")[0]),
        )


def _fresh(events: pa.Table, held_ids: pa.ChunkedArray) -> pa.Table:
    """``events`` in (time, id) order without those whose id is ``held`` or repeated (the first copy stays)."""
    events = _as(events.select(EVENT.schema.names), EVENT.schema)
    if events.num_rows > 1:
        events = events.take(pc.sort_indices(events, _BY_TIME))
    held, keep = set(held_ids.to_pylist()), []
    for i, event_id in enumerate(events.column("event_id").to_pylist()):
        if event_id not in held:
            held.add(event_id)
            keep.append(i)
    return events if len(keep) == events.num_rows else events.take(pa.array(keep, pa.int64()))


def _summary(evicted: pa.Table, previous: dict[str, Any] | None) -> dict[str, Any]:
    """The HISTORY summary: ``previous`` (a summary, or None) plus the ``evicted`` events."""
    surfaces = np.bincount(evicted.column("surface").to_numpy(), minlength=len(SURFACES))
    types = np.bincount(evicted.column("event_type").to_numpy(), minlength=len(EVENT_TYPES))
    times = evicted.column("event_time")
    first, last = (pc.min(times).as_py(), pc.max(times).as_py()) if evicted.num_rows else (None, None)
    if previous is None:
        previous = {"evicted_count": 0, "surface_counts": [0] * len(SURFACES), "event_type_counts": [0] * len(types)}
    return {
        "evicted_count": previous["evicted_count"] + evicted.num_rows,
        "surface_counts": (np.asarray(previous["surface_counts"]) + surfaces).tolist(),
        "event_type_counts": (np.asarray(previous["event_type_counts"]) + types).tolist(),
        "first_event_time": _pick(min, previous.get("first_event_time"), first),
        "last_event_time": _pick(max, previous.get("last_event_time"), last),
    }


def _pick(choose: Callable[[list[datetime]], datetime], a: datetime | None, b: datetime | None) -> datetime | None:
    """``choose`` of the values that are there (None when neither is), as Polars' min/max_horizontal."""
    present = [v for v in (a, b) if v is not None]
    return choose(present) if present else None


def _ms(value: pa.Scalar) -> int:
    return int(value.cast(pa.int64()).as_py())
