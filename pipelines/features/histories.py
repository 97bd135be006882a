"""Per-user histories as jagged Arrow sequences: the pure build, no Beam.

:func:`build_histories` merges new events into an optional previous snapshot
(HISTORY layout) and returns the new snapshot, the point-in-time training
examples of the new impressions, and counts. It is deterministic: rows are
ordered by ``user_id``, events by ``(event_time, event_id)``.

Incremental equals full rebuild (tested with hypothesis) for every input except
one the snapshot cannot know about: a redelivered copy of an event that an
earlier snapshot already evicted into the summary is counted again, because only
retained events keep their ``event_id``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from pipelines.features.examples import LabelWindows, training_examples
from pipelines.io.parquet import conform
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT, HISTORY, HISTORY_EVENT, TRAINING_EXAMPLE
from pipelines.settings import MAX_HISTORY

_EVENT_FIELDS = [f.name for f in HISTORY_EVENT]
_SORT = ["user_id", "event_time", "event_id"]


@dataclass(frozen=True)
class HistoryBuild:
    """The result of one build: the new snapshot, training examples and counts."""

    histories: pa.Table
    examples: pa.Table
    duplicates: int
    duplicates_previous: int
    evicted: int


def _summary_columns(prefix: str) -> list[str]:
    return [f"{prefix}s{i}" for i in range(len(SURFACES))] + [f"{prefix}t{i}" for i in range(len(EVENT_TYPES))]


def _previous_events(previous: pl.DataFrame) -> pl.DataFrame:
    """(user_id, event fields...) of every retained event of a snapshot."""
    return (
        previous.select("user_id", "events").explode("events").filter(pl.col("events").is_not_null()).unnest("events")
    )


def _previous_summary(previous: pl.DataFrame) -> pl.DataFrame:
    """One row per user: the snapshot's summary flattened into columns prefixed ``p_``."""
    s = pl.col("summary")
    return previous.select(
        "user_id",
        s.struct.field("evicted_count").alias("p_evicted"),
        *[s.struct.field("surface_counts").arr.get(i).alias(f"p_s{i}") for i in range(len(SURFACES))],
        *[s.struct.field("event_type_counts").arr.get(i).alias(f"p_t{i}") for i in range(len(EVENT_TYPES))],
        s.struct.field("first_event_time").alias("p_first"),
        s.struct.field("last_event_time").alias("p_last"),
        pl.col("num_events_total").alias("p_total"),
        pl.col("watermark").dt.epoch("ms").alias("p_watermark"),
    )


def _evicted_summary(merged: pl.DataFrame) -> pl.DataFrame:
    """Per user: counts per surface and event type, first/last time of the evicted events
    (not ``_kept``), aggregated in place rather than over a filtered copy of the events."""
    out = ~pl.col("_kept")
    time = pl.col("event_time").filter(out)
    return merged.group_by("user_id").agg(
        out.sum().cast(pl.Int64).alias("e_evicted"),
        *[(out & (pl.col("surface") == i)).sum().cast(pl.Int64).alias(f"e_s{i}") for i in range(len(SURFACES))],
        *[(out & (pl.col("event_type") == i)).sum().cast(pl.Int64).alias(f"e_t{i}") for i in range(len(EVENT_TYPES))],
        time.min().alias("e_first"),
        time.max().alias("e_last"),
    )


def _combined_summary(users: pl.DataFrame) -> pl.Expr:
    """The HISTORY summary struct from previous (``p_``) and newly evicted (``e_``) columns."""

    def total(name: str) -> pl.Expr:
        return pl.col(f"p_{name}").fill_null(0) + pl.col(f"e_{name}").fill_null(0)

    return pl.struct(
        total("evicted").alias("evicted_count"),
        pl.concat_list([total(f"s{i}") for i in range(len(SURFACES))]).alias("surface_counts"),
        pl.concat_list([total(f"t{i}") for i in range(len(EVENT_TYPES))]).alias("event_type_counts"),
        pl.min_horizontal("p_first", "e_first").alias("first_event_time"),
        pl.max_horizontal("p_last", "e_last").alias("last_event_time"),
    )


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def build_histories(
    events: pa.Table,
    previous: pa.Table | None = None,
    *,
    max_history: int = MAX_HISTORY.default,
    watermark_ms: int | None = None,
    windows: LabelWindows | None = None,
) -> HistoryBuild:
    """Merge ``events`` (EVENT layout) into ``previous`` (HISTORY layout, or None).

    ``watermark_ms`` is the event time up to which this snapshot is complete (by
    default the newest event time seen); it only ever moves forward.
    """
    MAX_HISTORY.check(max_history)
    prev = _frame(previous if previous is not None else HISTORY.schema.empty_table())
    prev_events = _previous_events(prev)
    fresh, duplicates, duplicates_previous = _fresh_events(events, prev_events)
    watermark = _watermark(fresh, prev, watermark_ms)
    touched = fresh.select("user_id").unique()
    merged = _merged(prev_events.join(touched, on="user_id", how="semi"), fresh, max_history)
    del fresh  # merged holds the new events (``_fresh``); one copy is enough
    rebuilt = _rebuilt_rows(merged, prev, touched, watermark)
    untouched = prev.join(touched, on="user_id", how="anti").with_columns(
        pl.lit(watermark).cast(pl.Datetime("ms", "UTC")).alias("watermark")
    )
    histories = pl.concat([rebuilt, untouched.select(rebuilt.columns)], how="vertical_relaxed").sort("user_id")
    examples = training_examples(merged, _previous_summary(prev), windows or LabelWindows())
    return HistoryBuild(
        histories=conform(histories.to_arrow(), HISTORY),
        examples=conform(examples.to_arrow(), TRAINING_EXAMPLE),
        duplicates=duplicates,
        duplicates_previous=duplicates_previous,
        evicted=int((~merged["_kept"]).sum()),
    )


def _fresh_events(events: pa.Table, prev_events: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """The new events not seen before, sorted, and how many were dropped as duplicates
    within ``events`` / of ``prev_events``.

    Each intermediate frame is a full copy of the events, so only the result outlives
    this function: a build holds one copy of the new events instead of three.
    """
    new = _frame(events.select(EVENT.schema.names).cast(EVENT.schema)).sort(_SORT)
    received = new.height
    unique = new.unique(subset="event_id", keep="first", maintain_order=True)
    del new
    distinct = unique.height
    if prev_events.height:
        unique = unique.join(prev_events.select("user_id", "event_id"), on=["user_id", "event_id"], how="anti")
    return unique, received - distinct, distinct - unique.height


def _merged(retained: pl.DataFrame, fresh: pl.DataFrame, max_history: int) -> pl.DataFrame:
    """The touched users' ``retained`` + ``fresh`` events sorted by (user, time, id), with ``_fresh``
    (new in this build), ``_pos`` / ``_n`` (place and count per user) and ``_kept`` (stays in the snapshot).

    ``fresh`` is already sorted: without retained events it is used as it is, not copied by a sort.
    """
    new = fresh.select("user_id", *_EVENT_FIELDS, "device").with_columns(pl.lit(True).alias("_fresh"))
    if retained.height:
        old = retained.with_columns(pl.lit(None, pl.Int8).alias("device"), pl.lit(False).alias("_fresh"))
        new = pl.concat([old, new], how="vertical_relaxed").sort(_SORT)
    return new.with_columns(
        pl.int_range(pl.len()).over("user_id").alias("_pos"),
        pl.len().over("user_id").cast(pl.Int64).alias("_n"),
    ).with_columns((pl.col("_pos") >= pl.col("_n") - max_history).alias("_kept"))


def _watermark(fresh: pl.DataFrame, prev: pl.DataFrame, watermark_ms: int | None) -> int:
    candidates = [watermark_ms] if watermark_ms is not None else []
    if watermark_ms is None and fresh.height:
        candidates.append(int(fresh["event_time"].dt.epoch("ms").max()))  # type: ignore[arg-type]
    if prev.height:
        candidates.append(int(prev["watermark"].dt.epoch("ms").max()))  # type: ignore[arg-type]
    return max(candidates, default=0)


def _rebuilt_rows(merged: pl.DataFrame, prev: pl.DataFrame, touched: pl.DataFrame, watermark: int) -> pl.DataFrame:
    """HISTORY rows of the users that received new events."""
    kept = (
        merged.filter(pl.col("_kept"))
        .group_by("user_id", maintain_order=True)
        .agg(
            pl.struct(_EVENT_FIELDS).alias("events"),
            pl.col("event_time").max().alias("last_event_time"),
        )
    )
    new_counts = merged.group_by("user_id").agg(pl.col("_fresh").sum().cast(pl.Int64).alias("_new"))
    users = (
        kept.join(_evicted_summary(merged), on="user_id", how="left")
        .join(_previous_summary(prev).join(touched, on="user_id", how="semi"), on="user_id", how="left")
        .join(new_counts, on="user_id", how="left")
    )
    return users.select(
        "user_id",
        "events",
        _combined_summary(users).alias("summary"),
        (pl.col("p_total").fill_null(0) + pl.col("_new")).alias("num_events_total"),
        "last_event_time",
        pl.lit(watermark).cast(pl.Datetime("ms", "UTC")).alias("watermark"),
    )
