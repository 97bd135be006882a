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


def _evicted_summary(evicted: pl.DataFrame) -> pl.DataFrame:
    """Per user: counts per surface and event type, first/last time of evicted events."""
    return evicted.group_by("user_id").agg(
        pl.len().cast(pl.Int64).alias("e_evicted"),
        *[(pl.col("surface") == i).sum().cast(pl.Int64).alias(f"e_s{i}") for i in range(len(SURFACES))],
        *[(pl.col("event_type") == i).sum().cast(pl.Int64).alias(f"e_t{i}") for i in range(len(EVENT_TYPES))],
        pl.col("event_time").min().alias("e_first"),
        pl.col("event_time").max().alias("e_last"),
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
    new = _frame(events.select(EVENT.schema.names).cast(EVENT.schema)).sort(_SORT)
    unique = new.unique(subset="event_id", keep="first", maintain_order=True)
    prev = _frame(previous if previous is not None else HISTORY.schema.empty_table())
    prev_events = _previous_events(prev)
    fresh = unique.join(prev_events.select("user_id", "event_id"), on=["user_id", "event_id"], how="anti")
    watermark = _watermark(fresh, prev, watermark_ms)
    touched = fresh.select("user_id").unique()
    merged = (
        pl.concat(
            [
                prev_events.join(touched, on="user_id", how="semi").with_columns(pl.lit(None, pl.Int8).alias("device")),
                fresh.select("user_id", *_EVENT_FIELDS, "device"),
            ],
            how="vertical_relaxed",
        )
        .sort(_SORT)
        .with_columns(
            pl.int_range(pl.len()).over("user_id").alias("_pos"),
            pl.len().over("user_id").cast(pl.Int64).alias("_n"),
        )
        .with_columns((pl.col("_pos") >= pl.col("_n") - max_history).alias("_kept"))
    )
    rebuilt = _rebuilt_rows(merged, prev, touched, fresh, watermark)
    untouched = prev.join(touched, on="user_id", how="anti").with_columns(
        pl.lit(watermark).cast(pl.Datetime("ms", "UTC")).alias("watermark")
    )
    histories = pl.concat([rebuilt, untouched.select(rebuilt.columns)], how="vertical_relaxed").sort("user_id")
    examples = training_examples(merged, fresh, _previous_summary(prev), windows or LabelWindows())
    return HistoryBuild(
        histories=conform(histories.to_arrow(), HISTORY),
        examples=conform(examples.to_arrow(), TRAINING_EXAMPLE),
        duplicates=new.height - unique.height,
        duplicates_previous=unique.height - fresh.height,
        evicted=int((~merged["_kept"]).sum()),
    )


def _watermark(fresh: pl.DataFrame, prev: pl.DataFrame, watermark_ms: int | None) -> int:
    candidates = [watermark_ms] if watermark_ms is not None else []
    if watermark_ms is None and fresh.height:
        candidates.append(int(fresh["event_time"].dt.epoch("ms").max()))  # type: ignore[arg-type]
    if prev.height:
        candidates.append(int(prev["watermark"].dt.epoch("ms").max()))  # type: ignore[arg-type]
    return max(candidates, default=0)


def _rebuilt_rows(
    merged: pl.DataFrame, prev: pl.DataFrame, touched: pl.DataFrame, fresh: pl.DataFrame, watermark: int
) -> pl.DataFrame:
    """HISTORY rows of the users that received new events."""
    kept = (
        merged.filter(pl.col("_kept"))
        .group_by("user_id", maintain_order=True)
        .agg(
            pl.struct(_EVENT_FIELDS).alias("events"),
            pl.col("event_time").max().alias("last_event_time"),
        )
    )
    new_counts = fresh.group_by("user_id").agg(pl.len().cast(pl.Int64).alias("_new"))
    users = (
        kept.join(_evicted_summary(merged.filter(~pl.col("_kept"))), on="user_id", how="left")
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
