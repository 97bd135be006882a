"""Point-in-time training examples: labelled impressions and their history prefix.

Pure Polars over the merged, sorted event frame built by :mod:`histories`.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipelines.schemas.enums import CLICK, CONVERSION_CODES, IMPRESSION
from pipelines.settings import CLICK_WINDOW, CONVERSION_WINDOW


@dataclass(frozen=True)
class LabelWindows:
    """How long after an impression a click / a conversion on the same item counts."""

    click_ms: int = CLICK_WINDOW.ms
    conversion_ms: int = CONVERSION_WINDOW.ms

    def __post_init__(self) -> None:
        if self.click_ms <= 0 or self.conversion_ms <= 0:
            raise ValueError(f"label windows must be positive, got {self}")


def _next_event(impressions: pl.DataFrame, merged: pl.DataFrame, codes: list[int], name: str) -> pl.Series:
    """Per row of ``impressions`` (in its order): the time of the next event of ``codes`` on the same
    (user, item). The as-of join runs on a narrow (row, user, item, time) frame, not on the wide rows."""
    later = (
        merged.filter(pl.col("event_type").is_in(codes))
        .select("user_id", "item_id", pl.col("event_time").alias(name))
        .sort(name)
    )
    narrow = impressions.select(pl.int_range(pl.len()).alias("_row"), "user_id", "item_id", "event_time")
    joined = narrow.sort("event_time").join_asof(
        later,
        left_on="event_time",
        right_on=name,
        by=["user_id", "item_id"],
        strategy="forward",
        check_sortedness=False,  # both sides are sorted by time above
    )
    return joined.sort("_row")[name]


def training_examples(merged: pl.DataFrame, previous_summary: pl.DataFrame, windows: LabelWindows) -> pl.DataFrame:
    """One row per new impression, in TRAINING_EXAMPLE column order.

    ``merged``: the touched users' retained + new events, sorted by (user, time,
    id), with ``_fresh`` (new in this build), ``_kept`` (retained in the snapshot) and
    ``_n`` (events per user).
    ``history_length`` counts the user's events strictly before the impression,
    evicted ones included; ``history_end`` is the exclusive end of that prefix in
    the snapshot's stored list, so ``events[:history_end]`` never holds the future.
    """
    per_user = merged.group_by("user_id").agg(
        pl.col("_kept").cast(pl.Int64).sum().alias("_stored"), pl.col("_n").first().alias("_n")
    )
    impressions = (
        merged.with_columns((pl.col("event_time").rank("min").over("user_id") - 1).cast(pl.Int64).alias("_before"))
        .filter(pl.col("_fresh") & (pl.col("event_type") == IMPRESSION))
        .drop("_n")
    )
    labelled = (
        impressions.with_columns(
            _next_event(impressions, merged, [CLICK], "_click"),
            _next_event(impressions, merged, list(CONVERSION_CODES), "_conv"),
        )
        .join(per_user.with_columns((pl.col("_n") - pl.col("_stored")).alias("_evicted_now")), on="user_id", how="left")
        .join(previous_summary.select("user_id", "p_evicted"), on="user_id", how="left")
    )
    return labelled.select(
        "event_id",
        "user_id",
        "item_id",
        "is_ad",
        "advertiser_id",
        "item_category",
        "surface",
        "device",
        "event_time",
        ((pl.col("_click") - pl.col("event_time")).dt.total_milliseconds() <= windows.click_ms)
        .fill_null(False)
        .alias("clicked"),
        ((pl.col("_conv") - pl.col("event_time")).dt.total_milliseconds() <= windows.conversion_ms)
        .fill_null(False)
        .alias("converted"),
        (pl.col("p_evicted").fill_null(0) + pl.col("_before")).alias("history_length"),
        (pl.col("_before") - pl.col("_evicted_now")).clip(0, pl.col("_stored")).cast(pl.Int32).alias("history_end"),
    ).sort("user_id", "event_time", "event_id")
