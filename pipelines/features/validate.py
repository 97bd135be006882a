"""Validate event tables read from columnar files (Parquet), vectorised.

The columnar counterpart of :mod:`parse`: the same rules and reason codes, but
expressed as Polars expressions over a whole batch. Enum columns may hold the
layout's int8 codes or the wire format's lower-case strings; integer columns may
be any width, signed or not (a uint64 id above 2^63 - 1 is ``out_of_range``).
:func:`check_columns` refuses, before any row is read, a file that lacks a required
column or whose column types no rule can take (a file-level fault, not a dead letter
per row); an absent optional column (``advertiser_id``, ``value``, ``device``) reads as
nulls, as an absent optional field of a JSON line does.
"""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa

from pipelines.features import reasons
from pipelines.features.parse import (
    FLOAT32_MAX,
    INT32_MAX,
    INT64_MAX,
    MAX_EVENT_ID_CHARS,
    MAX_TIME_MS,
    ParseResult,
)
from pipelines.io.deadletters import dead_letter_table
from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT

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


def _acceptable(name: str, dtype: pa.DataType) -> bool:
    """Whether a column of ``dtype`` can hold field ``name`` (values are checked per row)."""
    t = pa.types
    if t.is_null(dtype) or (t.is_dictionary(dtype) and name in _ENUMS):
        return True
    if name == "event_id":
        return t.is_string(dtype) or t.is_large_string(dtype)
    if name == "is_ad":
        return t.is_boolean(dtype)
    if name == "event_time":
        return t.is_timestamp(dtype) or t.is_integer(dtype)
    if name == "value":
        return t.is_floating(dtype) or t.is_integer(dtype)
    if name in _ENUMS:
        return t.is_string(dtype) or t.is_large_string(dtype) or t.is_integer(dtype)
    return t.is_integer(dtype)


def check_columns(schema: pa.Schema) -> str | None:
    """Why a file with ``schema`` cannot be validated (None when it can): a required column is absent,
    or a field's column has a type that no per-row rule can take, e.g. a list or a struct."""
    missing = [f.name for f in EVENT.schema if not f.nullable and f.name not in schema.names]
    if missing:
        return f"required column(s) {', '.join(missing)} absent (the file has {', '.join(schema.names) or 'none'})"
    for field in EVENT.schema:
        if field.name in schema.names and not _acceptable(field.name, schema.field(field.name).type):
            return f"column {field.name!r} is {schema.field(field.name).type}, which the event layout cannot take"
    return None


def _reason(df: pl.DataFrame, max_time_ms: int) -> pl.Expr:
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
        *[(pl.col(n) > INT64_MAX, reasons.OUT_OF_RANGE, f"{n} > int64") for n in _INTS if _unsigned(df, n)],
        (pl.col("item_category") > INT32_MAX, reasons.OUT_OF_RANGE, "item_category > int32"),
        *[(pl.col(f"_{n}") < 0, reasons.UNKNOWN_ENUM, f"unknown {n}") for n in _ENUMS if n != "device"],
        (pl.col("device").is_not_null() & (pl.col("_device") < 0), reasons.UNKNOWN_ENUM, "unknown device"),
        (~pl.col("_time").is_between(0, MAX_TIME_MS), reasons.BAD_TIMESTAMP, "event_time outside [1970, 9999]"),
        (pl.col("_time") > max_time_ms, reasons.FUTURE_TIME, f"event_time after the run's limit {max_time_ms} ms"),
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


def _unsigned(df: pl.DataFrame, name: str) -> bool:
    return df.schema[name] in (pl.UInt64,)


def _typed_nulls(table: pa.Table) -> pa.Table:
    """All-null columns (Arrow type ``null``) cast to the layout's type."""
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(EVENT.schema.field(field.name).type))
    return table


def _missing_columns(table: pa.Table) -> list[str]:
    """Absent required columns (absent optional ones read as nulls: :func:`_with_optional_columns`)."""
    return [f.name for f in EVENT.schema if not f.nullable and f.name not in table.column_names]


def _with_optional_columns(table: pa.Table) -> pa.Table:
    for field in EVENT.schema:
        if field.nullable and field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(table.num_rows, field.type))
    return table


def _all_dead(table: pa.Table, reason: str, detail: str, source: str, first_row: int) -> ParseResult:
    payloads = [json.dumps(r, default=str).encode() for r in table.to_pylist()]
    rejects = [(reason, detail, p, f"{source}:{first_row + i}") for i, p in enumerate(payloads)]
    return ParseResult(EVENT.schema.empty_table(), dead_letter_table("parse", rejects))


def validate_event_table(
    table: pa.Table, source: str, first_row: int = 0, max_time_ms: int = MAX_TIME_MS
) -> ParseResult:
    """Split a columnar batch into valid events and dead letters (source = ``file:row``);
    events later than ``max_time_ms`` are ``future_time``."""
    missing = _missing_columns(table)
    if missing:
        return _all_dead(table, reasons.MISSING_FIELD, f"column(s) {missing} absent", source, first_row)
    df = pl.from_arrow(_typed_nulls(_with_optional_columns(table).select(EVENT.schema.names)))
    assert isinstance(df, pl.DataFrame)
    try:
        df = df.with_columns(
            *[_enum_codes(df, n).alias(f"_{n}") for n in _ENUMS],
            _time_ms(df).alias("_time"),
            pl.int_range(first_row, first_row + df.height, dtype=pl.Int64).alias("_row"),
        ).with_columns(_reason(df, max_time_ms).alias("_reason"))
    except (pl.exceptions.PolarsError, pa.ArrowException, TypeError, ValueError) as exc:
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
