"""Point-in-time training examples: labelled impressions and their history prefix.

Pure Polars over slices of the merged, sorted events built by :mod:`histories`.
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


def _next_event(impressions: pl.DataFrame, later: pl.DataFrame, name: str) -> pl.Series:
    """Per row of ``impressions`` (in its order): the first time in ``later`` (user_id, item_id, ``name``)
    at or after the impression's, on the same (user, item). The as-of join runs on a narrow
    (row, user, item, time) frame, not on the wide rows."""
    narrow = impressions.select(pl.int_range(pl.len()).alias("_row"), "user_id", "item_id", "event_time")
    joined = narrow.sort("event_time").join_asof(
        later.sort(name),
        left_on="event_time",
        right_on=name,
        by=["user_id", "item_id"],
        strategy="forward",
        check_sortedness=False,  # both sides are sorted by time above
    )
    return joined.sort("_row")[name]


#: Label column -> the event types that set it.
_LABELS = {"_click": [CLICK], "_conv": list(CONVERSION_CODES)}


class TrainingExamples:
    """One row per new impression, in TRAINING_EXAMPLE column order, from the merged events visited
    in slices from the last to the first.

    A slice: consecutive rows of the touched users' retained + new events sorted by (user, time,
    id), with ``_fresh`` (new in this build), ``_before`` (the user's events strictly earlier),
    ``_n`` (events per user) and ``_stored`` (of those, kept in the snapshot). Labels look
    forward: the first click / conversion on the same (user, item) at or after the impression,
    within its window. Between slices only the first such time per (user, item) of the user that
    may go on in the slice before is kept, so memory does not grow with a user's events.
    ``history_length`` counts the user's events strictly before the impression, evicted ones
    included; ``history_end`` is the exclusive end of that prefix in the snapshot's stored list,
    so ``events[:history_end]`` never holds the future.
    """

    def __init__(self, previous_summary: pl.DataFrame, windows: LabelWindows) -> None:
        self._previous = previous_summary.select("user_id", "p_evicted")
        self._windows = windows
        self._later: dict[str, pl.DataFrame | None] = dict.fromkeys(_LABELS)

    def slice(self, merged: pl.DataFrame, first_user: int) -> pl.DataFrame:
        """The examples of one slice (the slices that follow it were given before); ``first_user``
        is the slice's first user before any filtering (the only one that can go on before it)."""
        impressions = merged.filter(pl.col("_fresh") & (pl.col("event_type") == IMPRESSION))
        labels = {}
        for name, codes in _LABELS.items():
            later = merged.filter(pl.col("event_type").is_in(codes)).select(
                "user_id", "item_id", pl.col("event_time").alias(name)
            )
            carried = self._later[name]
            later = pl.concat([later, carried]) if carried is not None else later
            labels[name] = _next_event(impressions, later, name)
            self._later[name] = (
                later.filter(pl.col("user_id") == first_user).group_by("user_id", "item_id").agg(pl.col(name).min())
            )
        labelled = impressions.with_columns(**labels).join(self._previous, on="user_id", how="left")
        return self._select(labelled)

    def _select(self, labelled: pl.DataFrame) -> pl.DataFrame:
        windows = self._windows
        evicted_now = pl.col("_n") - pl.col("_stored")
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
            (pl.col("_before") - evicted_now).clip(0, pl.col("_stored")).cast(pl.Int32).alias("history_end"),
        ).sort("user_id", "event_time", "event_id")
