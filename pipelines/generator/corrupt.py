"""Realistic malformed JSONL lines, for testing that a reader dead-letters them.

Each bad line starts from a real event of the world (given a fresh ``bad...``
event id, so it never collides with a good one) and breaks it one way. Every kind
violates the wire format (``pipelines/schemas/event.schema.json`` plus the 1 MB line limit)
on its own, so a correct reader rejects every one of them:

invalid_json, truncated_json, non_object_json, missing_field, wrong_type,
negative_id, out_of_range, unknown_enum, uppercase_enum, float_timestamp,
iso_without_timezone, negative_timestamp, non_finite, nul_byte, non_utf8,
ad_without_advertiser, organic_with_advertiser, oversized_line (rare: > 1 MB).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES

Record = dict[str, Any]
Maker = Callable[[Record, np.random.Generator], bytes]

MAX_LINE_BYTES = 1 << 20
_REQUIRED = ("event_id", "user_id", "item_id", "is_ad", "item_category", "surface", "event_type", "event_time")
_OVERSIZED_EVERY = 2_000  # one line over 1 MB per this many bad lines (and one from 50 up)


def _dumps(record: Any) -> str:
    return json.dumps(record, separators=(",", ":"))


def _pick(rng: np.random.Generator, options: list[Any] | tuple[Any, ...]) -> Any:
    return options[int(rng.integers(len(options)))]


def _invalid_json(record: Record, rng: np.random.Generator) -> bytes:
    text = _dumps(record)
    variants = [
        text.replace('":', '" ', 1),  # missing colon
        text[:-1] + ",}",  # trailing comma
        text.replace('"', "'"),  # single quotes
        text.replace('"user_id"', "user_id", 1),  # unquoted key
        text + "}",  # extra closing brace
    ]
    return str(_pick(rng, variants)).encode()


def _truncated_json(record: Record, rng: np.random.Generator) -> bytes:
    text = _dumps(record)
    return text[: int(rng.integers(1, len(text) - 1))].encode()


def _non_object_json(record: Record, rng: np.random.Generator) -> bytes:
    variants = [list(record.values()), [record], record["event_type"], record["user_id"], None, True]
    return _dumps(_pick(rng, variants)).encode()


def _missing_field(record: Record, rng: np.random.Generator) -> bytes:
    del record[_pick(rng, _REQUIRED)]
    return _dumps(record).encode()


def _wrong_type(record: Record, rng: np.random.Generator) -> bytes:
    field, bad = _pick(
        rng,
        [
            ("user_id", f"u{record['user_id']}"),
            ("item_id", [record["item_id"]]),
            ("is_ad", "yes"),
            ("item_category", {"id": record["item_category"]}),
            ("event_type", EVENT_TYPES.index(record["event_type"])),
            ("surface", [record["surface"]]),
            ("value", "fast"),
            ("event_id", {"id": record["event_id"]}),
        ],
    )
    record[field] = bad
    return _dumps(record).encode()


def _negative_id(record: Record, rng: np.random.Generator) -> bytes:
    fields = ["user_id", "item_id", "item_category"] + (["advertiser_id"] if record["is_ad"] else [])
    field = _pick(rng, fields)
    record[field] = -int(record[field]) - 1
    return _dumps(record).encode()


def _out_of_range(record: Record, rng: np.random.Generator) -> bytes:
    field, bad = _pick(
        rng, [("user_id", 2**63 + 17), ("item_id", 2**64), ("item_category", 2**31 + 5), ("value", 1e39)]
    )
    record[field] = bad
    return _dumps(record).encode()


def _unknown_enum(record: Record, rng: np.random.Generator) -> bytes:
    field, bad = _pick(
        rng,
        [
            ("surface", "myspace"),
            ("surface", "tiktok_feed"),
            ("event_type", "purchase"),
            ("event_type", "swipe_up"),
            ("device", "blackberry"),
            ("device", "smart_fridge"),
        ],
    )
    record[field] = bad
    return _dumps(record).encode()


def _uppercase_enum(record: Record, rng: np.random.Generator) -> bytes:
    field = _pick(rng, ["surface", "event_type"] + (["device"] if record["device"] else []))
    record[field] = _pick(rng, [str.upper, str.title])(record[field])
    return _dumps(record).encode()


def _float_timestamp(record: Record, rng: np.random.Generator) -> bytes:
    ms = record["event_time"]
    record["event_time"] = _pick(rng, [ms + 0.5, ms / 1000.0 + 0.0005])  # fractional ms, or seconds
    return _dumps(record).encode()


def _iso_without_timezone(record: Record, rng: np.random.Generator) -> bytes:
    naive = datetime.fromtimestamp(record["event_time"] / 1000, tz=UTC).replace(tzinfo=None)
    record["event_time"] = naive.isoformat(sep=_pick(rng, ["T", " "]), timespec="milliseconds")
    return _dumps(record).encode()


def _negative_timestamp(record: Record, rng: np.random.Generator) -> bytes:
    record["event_time"] = _pick(rng, [-record["event_time"], -1])
    return _dumps(record).encode()


def _non_finite(record: Record, rng: np.random.Generator) -> bytes:
    record["value"] = _pick(rng, [float("nan"), float("inf"), float("-inf")])
    return _dumps(record).encode()  # json writes the NaN / Infinity tokens JSON forbids


def _nul_byte(record: Record, rng: np.random.Generator) -> bytes:
    raw = _dumps(record).encode()
    at = int(rng.integers(1, len(raw)))
    return raw[:at] + b"\x00" + raw[at:]


def _non_utf8(record: Record, rng: np.random.Generator) -> bytes:
    raw = _dumps(record).encode()
    at = raw.index(b'"event_id":"') + len(b'"event_id":"')
    return raw[:at] + _pick(rng, [b"\xff\xfe", b"\xe9", b"\xc3\x28", b"\x80"]) + raw[at:]


def _ad_without_advertiser(record: Record, rng: np.random.Generator) -> bytes:
    record["is_ad"] = True
    if rng.random() < 0.5:
        record.pop("advertiser_id", None)
    else:
        record["advertiser_id"] = None
    return _dumps(record).encode()


def _organic_with_advertiser(record: Record, rng: np.random.Generator) -> bytes:
    record["is_ad"] = False
    record["advertiser_id"] = int(rng.integers(5_000, 10_000))
    return _dumps(record).encode()


def _oversized_line(record: Record, rng: np.random.Generator) -> bytes:
    # A producer that attached a debug blob: valid JSON, but over the 1 MB line limit.
    record["debug_payload"] = "A" * (MAX_LINE_BYTES + int(rng.integers(1, 200_000)))
    return _dumps(record).encode()


KINDS: dict[str, tuple[float, Maker]] = {
    "invalid_json": (8, _invalid_json),
    "truncated_json": (10, _truncated_json),
    "non_object_json": (5, _non_object_json),
    "missing_field": (10, _missing_field),
    "wrong_type": (10, _wrong_type),
    "negative_id": (6, _negative_id),
    "out_of_range": (4, _out_of_range),
    "unknown_enum": (7, _unknown_enum),
    "uppercase_enum": (6, _uppercase_enum),
    "float_timestamp": (5, _float_timestamp),
    "iso_without_timezone": (5, _iso_without_timezone),
    "negative_timestamp": (3, _negative_timestamp),
    "non_finite": (5, _non_finite),
    "nul_byte": (4, _nul_byte),
    "non_utf8": (4, _non_utf8),
    "ad_without_advertiser": (5, _ad_without_advertiser),
    "organic_with_advertiser": (2, _organic_with_advertiser),
}
OVERSIZED = "oversized_line"


def wire_records(events: pa.Table) -> list[Record]:
    """EVENT-layout rows as wire-format dicts (enum strings, integer ms)."""
    rows = events.set_column(
        events.schema.get_field_index("event_time"), "event_time", events["event_time"].cast(pa.int64())
    ).to_pylist()
    for row in rows:
        row["surface"] = SURFACES[row["surface"]]
        row["event_type"] = EVENT_TYPES[row["event_type"]]
        row["device"] = None if row["device"] is None else DEVICES[row["device"]]
    return rows


def bad_lines(events: pa.Table, count: int, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    """``count`` malformed lines (kind, bytes without newline) built from random events."""
    if count <= 0 or events.num_rows == 0:
        return []
    oversized = count // _OVERSIZED_EVERY + (1 if count >= 50 else 0)
    names = list(KINDS)
    weights = np.array([KINDS[name][0] for name in names], dtype=np.float64)
    chosen = [names[i] for i in rng.choice(len(names), size=count - oversized, p=weights / weights.sum())]
    chosen += [OVERSIZED] * oversized
    order = rng.permutation(count)
    templates = wire_records(events.take(rng.integers(0, events.num_rows, size=count)))
    out: list[tuple[str, bytes]] = []
    for k, i in enumerate(order):
        kind, record = chosen[i], templates[k]
        record["event_id"] = f"bad{k:07d}{record['event_id'][:6]}"
        maker = _oversized_line if kind == OVERSIZED else KINDS[kind][1]
        out.append((kind, maker(record, rng)))
    return out
