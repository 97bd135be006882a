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


def merge_user(events: pa.Table, previous: pa.Table | None, *, max_history: int) -> pa.Table:
    """The HISTORY row of one user after ``events`` (EVENT layout, that user's only) are merged
    into ``previous`` (the user's HISTORY row, or None / empty for a user seen first): events
    already held (same ``event_id``) are dropped, the newest ``max_history`` are kept by
    ``(event_time, event_id)`` and the rest is counted into the summary. Equal to
    ``build_histories(events, previous, max_history=...).histories``.

    The held events stay Arrow arrays throughout (no Python object per held event), and the
    summary is rebuilt only when events are evicted: a flush costs a few dozen Arrow calls plus
    copies of the held events' buffers."""
    MAX_HISTORY.check(max_history)
    held = _held_events(previous)
    fresh = _fresh(events, held.field("event_id"))
    if not len(fresh):
        assert previous is not None  # nothing new: only a previous row can be left
        return conform(previous, HISTORY)
    merged = pa.concat_arrays([held, fresh])
    if not _ascending_after(held, fresh):  # a late event: it goes to its place
        merged = merged.take(pc.sort_indices(_time_and_id(merged), _BY_TIME))
    cut = max(0, len(merged) - max_history)
    kept = merged.slice(cut)
    watermark = max(int(_millis(fresh.field("event_time")).max()), _scalar_ms(previous, "watermark"))
    total = len(fresh) + (_scalar(previous, "num_events_total") or 0)
    columns = [
        pa.array([events.column("user_id")[0].as_py()], pa.int64()),
        pa.ListArray.from_arrays(pa.array([0, len(kept)], pa.int32()), kept, type=_EVENTS_TYPE),
        _summary_after(merged.slice(0, cut), previous),
        pa.array([total], pa.int64()),
        pa.array([int(_millis(kept.field("event_time"))[-1])], TIME),
        pa.array([watermark], TIME),
    ]
    return pa.Table.from_arrays(columns, schema=HISTORY.schema)


def _as(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema``; as it is when it already has it (a cast per column costs
    microseconds each, which a one-event flush feels)."""
    return table if table.schema == schema else table.cast(schema)


def _millis(times: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Timestamps (ms) as int64 milliseconds."""
    if isinstance(times, pa.ChunkedArray):
        times = times.combine_chunks()
    return times.view(pa.int64()).to_numpy()


def _held_events(previous: pa.Table | None) -> pa.StructArray:
    """The events ``previous`` (a HISTORY row, or None) holds, as one HISTORY_EVENT struct array."""
    if previous is None or not previous.num_rows:
        return _NONE_HELD
    held = previous.column("events").combine_chunks().flatten()
    return held if held.type == HISTORY_EVENT else held.cast(HISTORY_EVENT)


def _time_and_id(events: pa.StructArray) -> pa.Table:
    return pa.table({"event_time": events.field("event_time"), "event_id": events.field("event_id")})


def _ascending_after(held: pa.StructArray, fresh: pa.StructArray) -> bool:
    """Whether ``fresh`` (sorted) all comes after the last of ``held`` (sorted) by (time, id):
    the usual flush, whose concatenation needs no sort."""
    if not len(held):
        return True
    last = held[len(held) - 1]
    first = fresh[0]
    return (first["event_time"].value, first["event_id"].as_py()) > (last["event_time"].value, last["event_id"].as_py())


def _fresh(events: pa.Table, held_ids: pa.Array) -> pa.StructArray:
    """``events`` as HISTORY_EVENT structs in (time, id) order, without those whose id is in
    ``held_ids`` or repeated (the first copy stays)."""
    events = _as(events.select(EVENT.schema.names), EVENT.schema)
    if events.num_rows > 1:
        events = events.take(pc.sort_indices(events, _BY_TIME))
    ids = events.column("event_id")
    keep = np.asarray(pc.invert(pc.is_in(ids, value_set=held_ids)), bool) if len(held_ids) else np.ones(len(ids), bool)
    if events.num_rows > 1:  # repeats within the batch: the first copy stays
        seen: set[str] = set()
        for i, event_id in enumerate(ids.to_pylist()):
            if event_id in seen:
                keep[i] = False
            seen.add(event_id)
    structs = events.select(_FIELDS).to_struct_array().combine_chunks()
    return structs if keep.all() else structs.filter(pa.array(keep))


def _summary_after(evicted: pa.StructArray, previous: pa.Table | None) -> pa.Array:
    """The HISTORY summary (one row) after ``evicted``: the previous one as it is when nothing was."""
    if not len(evicted):
        if previous is None or not previous.num_rows:
            return _NO_SUMMARY
        summary = previous.column("summary").combine_chunks()
        return summary if summary.type == _SUMMARY_TYPE else summary.cast(_SUMMARY_TYPE)
    before = previous.column("summary")[0].as_py() if previous is not None and previous.num_rows else None
    return pa.array([_summary(evicted, before)], _SUMMARY_TYPE)


def _summary(evicted: pa.StructArray, previous: dict[str, Any] | None) -> dict[str, Any]:
    """The HISTORY summary: ``previous`` (a summary, or None) plus the ``evicted`` events."""
    surfaces = np.bincount(evicted.field("surface").to_numpy(), minlength=len(SURFACES))
    types = np.bincount(evicted.field("event_type").to_numpy(), minlength=len(EVENT_TYPES))
    times = evicted.field("event_time")
    first, last = (pc.min(times).as_py(), pc.max(times).as_py()) if len(evicted) else (None, None)
    if previous is None:
        previous = {"evicted_count": 0, "surface_counts": [0] * len(SURFACES), "event_type_counts": [0] * len(types)}
    return {
        "evicted_count": previous["evicted_count"] + len(evicted),
        "surface_counts": (np.asarray(previous["surface_counts"]) + surfaces).tolist(),
        "event_type_counts": (np.asarray(previous["event_type_counts"]) + types).tolist(),
        "first_event_time": _pick(min, previous.get("first_event_time"), first),
        "last_event_time": _pick(max, previous.get("last_event_time"), last),
    }


def _pick(choose: Callable[[list[datetime]], datetime], a: datetime | None, b: datetime | None) -> datetime | None:
    """``choose`` of the values that are there (None when neither is), as Polars' min/max_horizontal."""
    present = [v for v in (a, b) if v is not None]
    return choose(present) if present else None


def _scalar(row: pa.Table | None, column: str) -> Any:
    """The value of ``column`` in a one-row table (None for no row)."""
    return row.column(column)[0].as_py() if row is not None and row.num_rows else None


def _scalar_ms(row: pa.Table | None, column: str) -> int:
    """A timestamp column's value in a one-row table, in milliseconds (0 for no row)."""
    return int(row.column(column)[0].value) if row is not None and row.num_rows else 0


_NONE_HELD = pa.array([], HISTORY_EVENT)
_NO_SUMMARY = pa.array([_summary(_NONE_HELD, None)], _SUMMARY_TYPE)
