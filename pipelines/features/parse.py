"""Parse the JSON wire format into Arrow: the one place where records are rows.

:func:`parse_json_lines` turns raw payloads (JSONL lines, Kafka message values)
into an EVENT-layout table plus a DEAD_LETTER table; every payload ends up in
exactly one of the two, whatever its bytes: no exception a payload can raise
escapes (an unforeseen one becomes an ``unexpected_error`` dead letter).
Validation rules follow ``pipelines/schemas/event.schema.json``; a key that appears twice
in an object is a ``duplicate_key``, and an event time later than
``max_time_ms`` (the run's clock plus ``--max-future``) is a ``future_time``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from pipelines.features import reasons
from pipelines.io.deadletters import dead_letter_table
from pipelines.schemas.enums import DEVICE_CODE, EVENT_TYPE_CODE, SURFACE_CODE
from pipelines.schemas.layouts import EVENT

MAX_LINE_BYTES = 1 << 20
_NUL = b"\x00"
MAX_PAYLOAD_KEPT = 64 << 10
MAX_EVENT_ID_CHARS = 256
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
FLOAT32_MAX = 3.4028234663852886e38

_COLUMNS = tuple(EVENT.schema.names)
log = logging.getLogger(__name__)


class Reject(Exception):
    """A record is invalid: ``reason`` is a code from :mod:`reasons`, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ParseResult:
    """Valid events (EVENT layout) and dead letters (DEAD_LETTER layout)."""

    events: pa.Table
    dead_letters: pa.Table

    @property
    def num_records(self) -> int:
        return self.events.num_rows + self.dead_letters.num_rows


def _no_constants(name: str) -> float:
    raise Reject(reasons.NON_FINITE, f"JSON constant {name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: an object whose key repeats is rejected (``json`` would keep the last)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise Reject(reasons.DUPLICATE_KEY, f"key {key[:64]!r} appears more than once in one object")
        seen.add(key)
    raise AssertionError("unreachable: fewer keys than pairs")


def _int(obj: dict[str, Any], name: str, top: int) -> int:
    value = obj[name]
    if type(value) is not int:
        raise Reject(reasons.WRONG_TYPE, f"{name} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= top:
        raise Reject(reasons.OUT_OF_RANGE, f"{name}={value} outside [0, {top}]")
    return value


def _enum(obj: dict[str, Any], name: str, codes: dict[str, int]) -> int | None:
    value = obj.get(name)
    if value is None and name == "device":
        return None
    if not isinstance(value, str):
        raise Reject(reasons.WRONG_TYPE, f"{name} must be a string, got {type(value).__name__}")
    code = codes.get(value)
    if code is None:
        raise Reject(reasons.UNKNOWN_ENUM, f"{name}={value[:64]!r} is not one of the lower-case values")
    return code


def parse_event_time(value: Any) -> int:
    """Milliseconds since the epoch from an integer or an ISO-8601 string with a timezone."""
    if type(value) is int:
        ms = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise Reject(reasons.BAD_TIMESTAMP, f"event_time {value[:64]!r} is not ISO-8601") from exc
        if parsed.tzinfo is None:
            raise Reject(reasons.BAD_TIMESTAMP, f"event_time {value[:64]!r} has no timezone")
        try:
            ms = int(parsed.timestamp() * 1000)
        except (OverflowError, ValueError) as exc:  # year 1 or 9999 shifted past the calendar by its offset
            raise Reject(reasons.BAD_TIMESTAMP, f"event_time {value[:64]!r} is outside the calendar") from exc
    else:
        raise Reject(reasons.BAD_TIMESTAMP, f"event_time must be integer ms or ISO string, got {value!r:.64}")
    if not 0 <= ms <= MAX_TIME_MS:
        raise Reject(reasons.BAD_TIMESTAMP, f"event_time {ms} ms is outside [1970, 9999]")
    return ms


def _value(obj: dict[str, Any]) -> float | None:
    value = obj.get("value")
    if value is None:
        return None
    if type(value) not in (int, float):
        raise Reject(reasons.WRONG_TYPE, f"value must be a number, got {type(value).__name__}")
    if type(value) is int and abs(value) > FLOAT32_MAX:  # before isfinite: huge ints overflow float()
        raise Reject(reasons.OUT_OF_RANGE, f"value {str(value)[:40]} overflows float32")
    if not math.isfinite(value):
        raise Reject(reasons.NON_FINITE, f"value {value} is not finite")
    if abs(value) > FLOAT32_MAX:
        raise Reject(reasons.OUT_OF_RANGE, f"value {value} overflows float32")
    return float(value)


def _advertiser(obj: dict[str, Any], is_ad: bool) -> int | None:
    if obj.get("advertiser_id") is None:
        if is_ad:
            raise Reject(reasons.AD_WITHOUT_ADVERTISER, "is_ad is true but advertiser_id is missing")
        return None
    if not is_ad:
        raise Reject(reasons.ORGANIC_WITH_ADVERTISER, "advertiser_id is set on organic content")
    return _int(obj, "advertiser_id", INT64_MAX)


def _event_id(obj: dict[str, Any]) -> str:
    value = obj["event_id"]
    if not isinstance(value, str):
        raise Reject(reasons.WRONG_TYPE, f"event_id must be a string, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_EVENT_ID_CHARS:
        raise Reject(reasons.OUT_OF_RANGE, f"event_id length {len(value)} outside [1, {MAX_EVENT_ID_CHARS}]")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate escape such as "\ud800" decodes but is not UTF-8
        raise Reject(reasons.INVALID_UTF8, f"event_id holds an unpaired surrogate at {exc.start}") from exc
    return value


def _event_time(obj: dict[str, Any], max_time_ms: int) -> int:
    ms = parse_event_time(obj["event_time"])
    if ms > max_time_ms:
        raise Reject(reasons.FUTURE_TIME, f"event_time {ms} ms is after the run's limit {max_time_ms} ms")
    return ms


def event_from_object(obj: Any, max_time_ms: int = MAX_TIME_MS) -> tuple[Any, ...]:
    """One validated event as a tuple in EVENT column order; raises :class:`Reject`.

    ``max_time_ms``: the latest event time accepted (later ones are ``future_time``).
    """
    if not isinstance(obj, dict):
        raise Reject(reasons.NOT_AN_OBJECT, f"expected a JSON object, got {type(obj).__name__}")
    missing = [name for name in _REQUIRED if name not in obj]
    if missing:
        raise Reject(reasons.MISSING_FIELD, f"missing {', '.join(missing)}")
    is_ad = obj["is_ad"]
    if type(is_ad) is not bool:
        raise Reject(reasons.WRONG_TYPE, f"is_ad must be a boolean, got {type(is_ad).__name__}")
    return (
        _event_id(obj),
        _int(obj, "user_id", INT64_MAX),
        _int(obj, "item_id", INT64_MAX),
        is_ad,
        _advertiser(obj, is_ad),
        _int(obj, "item_category", INT32_MAX),
        _enum(obj, "surface", SURFACE_CODE),
        _enum(obj, "event_type", EVENT_TYPE_CODE),
        _event_time(obj, max_time_ms),
        _value(obj),
        _enum(obj, "device", DEVICE_CODE),
    )


_REQUIRED = tuple(f.name for f in EVENT.schema if not f.nullable)


def decode_payload(payload: bytes) -> Any:
    """Raw bytes to a JSON value, rejecting what the wire format forbids."""
    if len(payload) > MAX_LINE_BYTES:
        raise Reject(reasons.LINE_TOO_LONG, f"{len(payload)} bytes > {MAX_LINE_BYTES}")
    if _NUL in payload:
        raise Reject(reasons.NUL_BYTE, f"NUL byte at offset {payload.index(_NUL)}")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Reject(reasons.INVALID_UTF8, f"invalid UTF-8 at byte {exc.start}") from exc
    try:
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise Reject(reasons.INVALID_JSON, f"{exc.msg} at column {exc.colno}") from exc
    except RecursionError as exc:
        raise Reject(reasons.INVALID_JSON, "nesting too deep") from exc
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits() (4300 digits)
        raise Reject(reasons.OUT_OF_RANGE, f"a number is too long to read ({str(exc)[:80]})") from exc


def events_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    """EVENT-layout table from validated row tuples."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _COLUMNS]
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, EVENT.schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=EVENT.schema)


def _check(payload: bytes, max_time_ms: int) -> tuple[Any, ...]:
    """One payload as a validated row; every failure is a :class:`Reject`."""
    try:
        return event_from_object(decode_payload(payload), max_time_ms)
    except Reject:
        raise
    except Exception as exc:  # a rule's blind spot must cost one record, never the run
        log.warning("unforeseen %s on a payload, dead-lettered: %s", type(exc).__name__, exc)
        raise Reject(reasons.UNEXPECTED_ERROR, f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def parse_json_lines(
    payloads: Sequence[bytes], sources: Sequence[str], stage: str = "parse", max_time_ms: int = MAX_TIME_MS
) -> ParseResult:
    """Validate JSON payloads; ``sources[i]`` names where ``payloads[i]`` came from.

    ``max_time_ms``: the latest event time accepted; later ones become ``future_time`` dead letters.
    """
    rows: list[tuple[Any, ...]] = []
    rejects: list[tuple[str, str, bytes, str]] = []
    for payload, source in zip(payloads, sources, strict=True):
        try:
            rows.append(_check(payload, max_time_ms))
        except Reject as bad:
            kept = payload if len(payload) <= MAX_PAYLOAD_KEPT else payload[:MAX_PAYLOAD_KEPT]
            detail = bad.detail if kept is payload else f"{bad.detail} (payload truncated to {len(kept)} bytes)"
            rejects.append((bad.reason, detail, kept, source))
    return ParseResult(events_table(rows), dead_letter_table(stage, rejects))
