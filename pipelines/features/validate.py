"""Validate event tables read from columnar files (Parquet), vectorised.

The columnar counterpart of :mod:`parse`: the same rules and reason codes, but
expressed as Polars expressions over a whole batch. Enum columns may hold the
layout's int8 codes or the wire format's lower-case strings.
"""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa

from pipelines.features import reasons
from pipelines.features.parse import (
    FLOAT32_MAX,
    INT32_MAX,
    MAX_EVENT_ID_CHARS,
    MAX_TIME_MS,
    ParseResult,
)
from pipelines.io.deadletters import dead_letter_table
from schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from schemas.layouts import EVENT

_ENUMS: dict[str, tuple[str, ...]] = {"surface": SURFACES, "event_type": EVENT_TYPES, "device": DEVICES}
_INTS = ("user_id", "item_id", "advertiser_id", "item_category")


def _enum_codes(df: pl.DataFrame, name: str) -> pl.Expr:
    values = _ENUMS[name]
    if df.schema[name] in (pl.String, pl.Categorical):
        mapping = {v: i for i, v in enumerate(values)}
        codes = pl.col(name).cast(pl.String).replace_strict(mapping, default=-1, return_dtype=pl.Int16)
        return pl.when(pl.col(name).is_null()).then(None).otherwise(codes)
    code = pl.col(name).cast(pl.Int16, strict=False)
    return pl.when(code.is_null()).then(None).when(code.is_between(0, len(values) - 1)).then(code).otherwise(-1)


def _time_ms(df: pl.DataFrame) -> pl.Expr:
    dtype = df.schema["event_time"]
    if isinstance(dtype, pl.Datetime):
        return pl.col("event_time").dt.epoch("ms")
    if dtype.is_integer():
        return pl.col("event_time").cast(pl.Int64)
    return pl.lit(-1, pl.Int64)


def _reason(df: pl.DataFrame) -> pl.Expr:
    """The first failed rule per row (null when the row is valid)."""
    rules: list[tuple[pl.Expr, str, str]] = []
    for field in EVENT.schema:
        if not field.nullable:
            rules.append((pl.col(field.name).is_null(), reasons.MISSING_FIELD, f"missing {field.name}"))
    rules += [
        (
            ~pl.col("event_id").str.len_chars().is_between(1, MAX_EVENT_ID_CHARS),
            reasons.OUT_OF_RANGE,
            "event_id length",
        ),
        *[(pl.col(n) < 0, reasons.OUT_OF_RANGE, f"{n} negative") for n in _INTS],
        (pl.col("item_category") > INT32_MAX, reasons.OUT_OF_RANGE, "item_category > int32"),
        *[(pl.col(f"_{n}") < 0, reasons.UNKNOWN_ENUM, f"unknown {n}") for n in _ENUMS if n != "device"],
        (pl.col("device").is_not_null() & (pl.col("_device") < 0), reasons.UNKNOWN_ENUM, "unknown device"),
        (~pl.col("_time").is_between(0, MAX_TIME_MS), reasons.BAD_TIMESTAMP, "event_time outside [1970, 9999]"),
        (~pl.col("value").is_finite(), reasons.NON_FINITE, "value is not finite"),
        (pl.col("value").abs() > FLOAT32_MAX, reasons.OUT_OF_RANGE, "value overflows float32"),
        (
            pl.col("is_ad") & pl.col("advertiser_id").is_null(),
            reasons.AD_WITHOUT_ADVERTISER,
            "is_ad is true but advertiser_id is missing",
        ),
        (
            ~pl.col("is_ad") & pl.col("advertiser_id").is_not_null(),
            reasons.ORGANIC_WITH_ADVERTISER,
            "advertiser_id is set on organic content",
        ),
    ]
    # Built inside out so the first rule wins: when(r0) then .. otherwise(when(r1) ...).
    expr: pl.Expr = pl.lit(None, pl.String)
    for cond, code, detail in reversed(rules):
        expr = pl.when(cond.fill_null(False)).then(pl.lit(f"{code}|{detail}")).otherwise(expr)
    return expr


def _typed_nulls(table: pa.Table) -> pa.Table:
    """All-null columns (Arrow type ``null``) cast to the layout's type."""
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(EVENT.schema.field(field.name).type))
    return table


def _missing_columns(table: pa.Table) -> list[str]:
    return [f.name for f in EVENT.schema if f.name not in table.column_names]


def _all_dead(table: pa.Table, reason: str, detail: str, source: str, first_row: int) -> ParseResult:
    payloads = [json.dumps(r, default=str).encode() for r in table.to_pylist()]
    rejects = [(reason, detail, p, f"{source}:{first_row + i}") for i, p in enumerate(payloads)]
    return ParseResult(EVENT.schema.empty_table(), dead_letter_table("parse", rejects))


def validate_event_table(table: pa.Table, source: str, first_row: int = 0) -> ParseResult:
    """Split a columnar batch into valid events and dead letters (source = ``file:row``)."""
    missing = _missing_columns(table)
    if missing:
        return _all_dead(table, reasons.MISSING_FIELD, f"column(s) {missing} absent", source, first_row)
    df = pl.from_arrow(_typed_nulls(table.select(EVENT.schema.names)))
    assert isinstance(df, pl.DataFrame)
    try:
        df = df.with_columns(
            *[_enum_codes(df, n).alias(f"_{n}") for n in _ENUMS],
            _time_ms(df).alias("_time"),
            pl.int_range(first_row, first_row + df.height, dtype=pl.Int64).alias("_row"),
        ).with_columns(_reason(df).alias("_reason"))
    except (pl.exceptions.PolarsError, TypeError) as exc:
        detail = f"columns do not match the event layout: {str(exc).splitlines()[0][:200]}"
        return _all_dead(table, reasons.WRONG_TYPE, detail, source, first_row)
    good = df.filter(pl.col("_reason").is_null())
    events = good.select(
        *[pl.col(f"_{n}").alias(n) if n in _ENUMS else pl.col(n) for n in EVENT.schema.names if n != "event_time"],
        pl.col("_time").alias("event_time"),
    ).select(EVENT.schema.names)
    return ParseResult(_to_event_layout(events), _dead_letters(df.filter(pl.col("_reason").is_not_null()), source))


def _to_event_layout(events: pl.DataFrame) -> pa.Table:
    arrow = events.to_arrow()
    arrays = [arrow.column(f.name).cast(f.type) for f in EVENT.schema]
    return pa.Table.from_arrays(arrays, schema=EVENT.schema)


def _dead_letters(bad: pl.DataFrame, source: str) -> pa.Table:
    rejects = []
    for row in bad.drop("_surface", "_event_type", "_device", "_time").iter_rows(named=True):
        code, detail = row.pop("_reason").split("|", 1)
        line = row.pop("_row")
        rejects.append((code, detail, json.dumps(row, default=str).encode(), f"{source}:{line}"))
    return dead_letter_table("parse", rejects)
