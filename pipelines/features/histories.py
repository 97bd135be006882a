"""Per-user histories as jagged Arrow sequences: the pure build, no Beam.

:func:`build_histories` merges new events into an optional previous snapshot
(HISTORY layout) and returns the new snapshot, the point-in-time training
examples of the new impressions, and counts. It is deterministic: rows are
ordered by ``user_id``, events by ``(event_time, event_id)``.

:func:`stream_histories` is the same build over events given in parts, in memory bounded by
``rows`` (and the snapshot it returns), not by the events of one user: each part is sorted into
a run (on disk once there are two), the runs are merged in slices, duplicates are found through
their hashes a bucket range at a time, and each slice folds into per-user counts, the newest
``max_history`` events and the summary of the evicted ones. Training examples come from a second
pass over the merged slices, last to first (labels look forward), and are read back in order.

Incremental equals full rebuild (tested with hypothesis) for every input except
one the snapshot cannot know about: a redelivered copy of an event that an
earlier snapshot already evicted into the summary is counted again, because only
retained events keep their ``event_id``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from pipelines.features.examples import LabelWindows, TrainingExamples
from pipelines.features.spill import RepeatedHashes, Scratch, SortedRuns, Spool
from pipelines.io.parquet import conform
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT, HISTORY, HISTORY_EVENT, TRAINING_EXAMPLE
from pipelines.settings import MAX_HISTORY

_EVENT_FIELDS = [f.name for f in HISTORY_EVENT]
_SORT = ["user_id", "event_time", "event_id"]
#: Columns of the merged events: a user's retained (``_fresh`` false) and new events; ``_h`` hashes the id.
_MERGED = ["user_id", *_EVENT_FIELDS, "device", "_fresh", "_h"]
#: Rows a streamed build holds at a time (a slice of events; its snapshot comes on top).
CHUNK_ROWS = 1 << 20


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


def _summed_summaries(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-slice evicted summaries (:func:`_evicted_summary`) added up per user."""
    counts = [c for c in parts[0].columns if c not in ("user_id", "e_first", "e_last")]
    return (
        pl.concat(parts)
        .group_by("user_id")
        .agg(*[pl.col(c).sum() for c in counts], pl.col("e_first").min(), pl.col("e_last").max())
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


@dataclass(frozen=True)
class HistoryStream:
    """A streamed build: the snapshot and counts, and the training examples to read once, in order
    (TRAINING_EXAMPLE tables; the scratch files behind them go when they are read or dropped)."""

    histories: pa.Table
    examples: Iterator[pa.Table]
    num_examples: int
    #: New events received (before duplicates are dropped).
    events: int
    duplicates: int
    duplicates_previous: int
    evicted: int


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
    stream = stream_histories([events], previous, max_history=max_history, watermark_ms=watermark_ms, windows=windows)
    examples = list(stream.examples)
    return HistoryBuild(
        histories=stream.histories,
        examples=pa.concat_tables(examples) if examples else _conformed_examples(None),
        duplicates=stream.duplicates,
        duplicates_previous=stream.duplicates_previous,
        evicted=stream.evicted,
    )


def stream_histories(
    events: Iterable[pa.Table | pa.RecordBatch],
    previous: pa.Table | None = None,
    *,
    max_history: int = MAX_HISTORY.default,
    watermark_ms: int | None = None,
    windows: LabelWindows | None = None,
    rows: int = CHUNK_ROWS,
) -> HistoryStream:
    """:func:`build_histories` over ``events`` given in parts (EVENT tables), holding about ``rows``
    events at a time. The outputs are those of :func:`build_histories` on the parts concatenated."""
    MAX_HISTORY.check(max_history)
    scratch = Scratch()
    try:
        return _stream(events, previous, max_history, watermark_ms, windows or LabelWindows(), rows, scratch)
    except BaseException:
        scratch.close()
        raise


@dataclass
class _Forward:
    """What the forward pass carries from one merged slice to the next, and what it counts."""

    repeated: pl.Series
    previous_ids: pl.DataFrame
    seen: set[str] = field(default_factory=set)
    #: The last user of the slice before: its id, last time, where that time's events start, events so far.
    carry: tuple[int, object, int, int] | None = None
    counts: list[pl.DataFrame] = field(default_factory=list)
    duplicates: int = 0
    duplicates_previous: int = 0
    newest_ms: int | None = None


def _stream(
    events: Iterable[pa.Table | pa.RecordBatch],
    previous: pa.Table | None,
    max_history: int,
    watermark_ms: int | None,
    windows: LabelWindows,
    rows: int,
    scratch: Scratch,
) -> HistoryStream:
    prev = _frame(previous if previous is not None else HISTORY.schema.empty_table())
    prev_events = _previous_events(prev)
    runs, hashes = SortedRuns(scratch, _SORT, rows), RepeatedHashes(scratch, rows)
    received = 0
    for part in _parts(events, rows):
        received += part.height
        hashes.add(part["_h"].to_numpy())
        runs.add(part)
    runs.add(_as_merged(prev_events).sort(_SORT))
    forward = _Forward(
        repeated=pl.Series("_h", hashes.repeated(), dtype=pl.UInt64),
        previous_ids=prev_events.select("user_id", "event_id", pl.lit(True).alias("_old")),
    )
    merged = Spool(scratch, rows, "merged")
    for part in runs.merged():
        merged.append(_forward_slice(part, forward))
    runs.discard()
    counts = _summed_counts(forward.counts)
    touched = counts.filter(pl.col("_new") > 0)
    watermark = _watermark(forward.newest_ms, prev, watermark_ms)
    kept, evicted, examples = _backward(merged, touched, prev, max_history, windows, scratch, rows)
    rebuilt = _rebuilt_rows(kept, evicted, touched, prev, watermark)
    untouched = prev.join(touched.select("user_id"), on="user_id", how="anti").with_columns(
        pl.lit(watermark).cast(pl.Datetime("ms", "UTC")).alias("watermark")
    )
    histories = pl.concat([rebuilt, untouched.select(rebuilt.columns)], how="vertical_relaxed").sort("user_id")
    return HistoryStream(
        histories=conform(histories.to_arrow(), HISTORY),
        examples=_read_examples(examples, scratch),
        num_examples=examples.rows,
        events=received,
        duplicates=forward.duplicates,
        duplicates_previous=forward.duplicates_previous,
        evicted=int(evicted["e_evicted"].sum()),
    )


def _empty_merged() -> pl.DataFrame:
    return _frame(EVENT.schema.empty_table()).select(
        "user_id", *_EVENT_FIELDS, "device", pl.lit(True).alias("_fresh"), pl.lit(0, pl.UInt64).alias("_h")
    )


def _as_merged(prev_events: pl.DataFrame) -> pl.DataFrame:
    """A snapshot's retained events as merged rows (no device, not fresh, no hash)."""
    return prev_events.select(
        pl.col("user_id"),
        *[pl.col(name) for name in _EVENT_FIELDS],
        pl.lit(None, pl.Int8).alias("device"),
        pl.lit(False).alias("_fresh"),
        pl.lit(None, pl.UInt64).alias("_h"),
    ).cast(_empty_merged().schema)


def _parts(events: Iterable[pa.Table | pa.RecordBatch], rows: int) -> Iterator[pl.DataFrame]:
    """The new events in sorted parts of about ``rows`` rows (small inputs gathered), as merged rows."""
    held: list[pa.Table] = []
    for given in events:
        table = given if isinstance(given, pa.Table) else pa.Table.from_batches([given])
        for start in range(0, table.num_rows, rows):
            held.append(table.slice(start, rows))
            if sum(t.num_rows for t in held) >= rows:
                yield _part(held)
                held = []
    if held:
        yield _part(held)


def _part(tables: list[pa.Table]) -> pl.DataFrame:
    events = pa.concat_tables([t.select(EVENT.schema.names).cast(EVENT.schema) for t in tables])
    return (
        _frame(events)
        .select(
            "user_id",
            *_EVENT_FIELDS,
            "device",
            pl.lit(True).alias("_fresh"),
            pl.col("event_id").hash(0).alias("_h"),
        )
        .sort(_SORT)
    )


def _forward_slice(part: pl.DataFrame, forward: _Forward) -> pl.DataFrame:
    """One merged slice, duplicates dropped, with each row's place in its user (``_pos``) and the
    user's events strictly earlier (``_before``); counts per user go to ``forward.counts``."""
    part = _drop_repeats(part, forward)
    part = _drop_previous(part, forward)
    if not part.height:
        return part.drop("_h")
    part = _positions(part, forward)
    forward.counts.append(
        part.group_by("user_id").agg(
            pl.len().cast(pl.Int64).alias("_n"), pl.col("_fresh").sum().cast(pl.Int64).alias("_new")
        )
    )
    newest = part.filter(pl.col("_fresh"))["event_time"].dt.epoch("ms").max()
    if newest is not None:
        newest_ms = int(newest)  # type: ignore[arg-type]
        forward.newest_ms = newest_ms if forward.newest_ms is None else max(forward.newest_ms, newest_ms)
    return part.drop("_h")


def _drop_repeats(part: pl.DataFrame, forward: _Forward) -> pl.DataFrame:
    """Drop new events whose id came before (in merged order): only ids whose hash repeats are checked."""
    if not forward.repeated.len():
        return part
    indexed = part.with_row_index("_r")
    candidates = indexed.filter(pl.col("_fresh") & pl.col("_h").is_in(forward.repeated)).select("_r", "event_id")
    if not candidates.height:
        return part
    seen = pl.Series(list(forward.seen), dtype=pl.String)
    first = candidates.filter(pl.col("event_id").is_first_distinct() & ~pl.col("event_id").is_in(seen))
    forward.seen.update(first["event_id"].to_list())
    dropped = candidates.join(first, on="_r", how="anti")["_r"]
    forward.duplicates += dropped.len()
    return indexed.filter(~pl.col("_r").is_in(dropped)).drop("_r")


def _drop_previous(part: pl.DataFrame, forward: _Forward) -> pl.DataFrame:
    """Drop new events the previous snapshot retains (same user and id)."""
    if not forward.previous_ids.height:
        return part
    marked = part.join(forward.previous_ids, on=["user_id", "event_id"], how="left", maintain_order="left")
    again = pl.col("_fresh") & pl.col("_old").is_not_null()
    forward.duplicates_previous += int(marked.select(again.sum()).item())
    return marked.filter(~again).drop("_old")


def _positions(part: pl.DataFrame, forward: _Forward) -> pl.DataFrame:
    """``_pos`` and ``_before`` (the position of the first of the user's events at the same time),
    continuing the counts of the slice before for its last user."""
    user, time, start, done = forward.carry if forward.carry is not None else (None, None, 0, 0)
    same_user = pl.col("user_id") == user if user is not None else pl.lit(False)
    part = part.with_columns(
        (pl.int_range(pl.len()).over("user_id") + pl.when(same_user).then(done).otherwise(0))
        .cast(pl.Int64)
        .alias("_pos")
    )
    same_time = same_user & (pl.col("event_time") == pl.lit(time, dtype=part.schema["event_time"]))
    part = part.with_columns(
        pl.when(same_time).then(start).otherwise(pl.col("_pos").min().over("user_id", "event_time")).alias("_before")
    )
    last = part.row(-1, named=True)
    forward.carry = (last["user_id"], last["event_time"], last["_before"], last["_pos"] + 1)
    return part


def _summed_counts(parts: list[pl.DataFrame]) -> pl.DataFrame:
    if not parts:
        return pl.DataFrame(schema={"user_id": pl.Int64, "_n": pl.Int64, "_new": pl.Int64})
    return pl.concat(parts).group_by("user_id").agg(pl.col("_n").sum(), pl.col("_new").sum())


def _backward(
    merged: Spool,
    touched: pl.DataFrame,
    prev: pl.DataFrame,
    max_history: int,
    windows: LabelWindows,
    scratch: Scratch,
    rows: int,
) -> tuple[pl.DataFrame, pl.DataFrame, Spool]:
    """The touched users' kept events, their evicted summaries and their training examples (a spool
    of slices last to first), from the merged slices visited last to first."""
    examples = TrainingExamples(_previous_summary(prev), windows)
    spool = Spool(scratch, rows, "examples", batch_rows=None)
    kept: list[pl.DataFrame] = []
    summaries: list[pl.DataFrame] = []
    sizes = touched.select("user_id", "_n")
    for part in merged.backward():
        first_user = part["user_id"][0]
        part = part.join(sizes, on="user_id", how="inner", maintain_order="left").with_columns(
            pl.min_horizontal("_n", pl.lit(max_history, pl.Int64)).alias("_stored"),
            (pl.col("_pos") >= pl.col("_n") - max_history).alias("_kept"),
        )
        kept.append(part.filter(pl.col("_kept")).select("user_id", *_EVENT_FIELDS))
        summaries.append(_evicted_summary(part))
        spool.append(examples.slice(part, first_user))
    merged.discard()
    empty = _empty_merged().with_columns(pl.lit(True).alias("_kept"))
    kept.reverse()
    kept_events = pl.concat(kept) if kept else empty.select("user_id", *_EVENT_FIELDS)
    return kept_events, _summed_summaries(summaries or [_evicted_summary(empty)]), spool


def _read_examples(spool: Spool, scratch: Scratch) -> Iterator[pa.Table]:
    def read() -> Iterator[pa.Table]:
        try:
            for part in spool.backward():
                yield _conformed_examples(part)
        finally:
            scratch.close()

    examples = read()
    weakref.finalize(examples, scratch.close)
    return examples


def _conformed_examples(part: pl.DataFrame | None) -> pa.Table:
    table = part.to_arrow() if part is not None else TRAINING_EXAMPLE.schema.empty_table()
    return conform(table, TRAINING_EXAMPLE)


def _watermark(newest_ms: int | None, prev: pl.DataFrame, watermark_ms: int | None) -> int:
    candidates = [watermark_ms] if watermark_ms is not None else []
    if watermark_ms is None and newest_ms is not None:
        candidates.append(newest_ms)
    if prev.height:
        candidates.append(int(prev["watermark"].dt.epoch("ms").max()))  # type: ignore[arg-type]
    return max(candidates, default=0)


def _rebuilt_rows(
    kept: pl.DataFrame, evicted: pl.DataFrame, touched: pl.DataFrame, prev: pl.DataFrame, watermark: int
) -> pl.DataFrame:
    """HISTORY rows of the users that received new events."""
    lists = kept.group_by("user_id", maintain_order=True).agg(
        pl.struct(_EVENT_FIELDS).alias("events"),
        pl.col("event_time").max().alias("last_event_time"),
    )
    users = (
        lists.join(evicted, on="user_id", how="left")
        .join(_previous_summary(prev).join(touched, on="user_id", how="semi"), on="user_id", how="left")
        .join(touched.select("user_id", "_new"), on="user_id", how="left")
    )
    return users.select(
        "user_id",
        "events",
        _combined_summary(users).alias("summary"),
        (pl.col("p_total").fill_null(0) + pl.col("_new")).alias("num_events_total"),
        "last_event_time",
        pl.lit(watermark).cast(pl.Datetime("ms", "UTC")).alias("watermark"),
    )
