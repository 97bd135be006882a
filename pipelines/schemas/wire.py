"""The event wire format (one JSON object per Kafka message or JSONL line).

:func:`event_json_schema` derives a JSON Schema (draft 2020-12) from the Arrow
event layout, so a producer in any language can validate what it writes. The
generated document is committed as ``pipelines/schemas/event.schema.json``; regenerate it
with ``python -m pipelines.schemas`` after a layout change.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

_ENUMS: dict[str, tuple[str, ...]] = {
    "surface": SURFACES,
    "event_type": EVENT_TYPES,
    "device": DEVICES,
}

_DESCRIPTIONS: dict[str, str] = {
    "event_id": "Producer-assigned unique id; redeliveries carry the same id and are deduplicated.",
    "user_id": "Non-negative user id. Also the Kafka message key (decimal string).",
    "item_id": "Non-negative id of the ad or organic item.",
    "is_ad": "True for an ad, false for organic content.",
    "advertiser_id": "Advertiser of an ad (required when is_ad is true); null or absent for organic.",
    "item_category": "Non-negative item category (int32).",
    "surface": "Where the event happened (lower-case).",
    "event_type": "What happened (lower-case).",
    "event_time": (
        "Integer milliseconds since the Unix epoch (canonical), or an ISO-8601 string "
        "with a timezone such as 2026-05-01T12:00:00Z. Floats, negative values and "
        "strings without a timezone are rejected."
    ),
    "value": "Dwell seconds or conversion value; finite float32, null allowed.",
    "device": "Device of the event, null allowed.",
}


def _field_schema(field: pa.Field) -> dict[str, Any]:
    schema: dict[str, Any]
    if field.name in _ENUMS:
        schema = {"type": "string", "enum": list(_ENUMS[field.name])}
    elif field.name == "event_time":
        schema = {
            "oneOf": [
                {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                {"type": "string", "format": "date-time"},
            ]
        }
    elif pa.types.is_integer(field.type):
        top = INT32_MAX if field.type == pa.int32() else INT64_MAX
        schema = {"type": "integer", "minimum": 0, "maximum": top}
    elif pa.types.is_floating(field.type):
        schema = {"type": "number"}
    elif pa.types.is_boolean(field.type):
        schema = {"type": "boolean"}
    else:
        schema = {"type": "string", "minLength": 1, "maxLength": 256}
    if field.nullable and field.name not in ("event_time",):
        schema = {"anyOf": [schema, {"type": "null"}]}
    schema["description"] = _DESCRIPTIONS[field.name]
    return schema


def event_json_schema() -> dict[str, Any]:
    """The JSON Schema of one engagement event on the wire."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"gem-pipelines/event/v{EVENT.version}",
        "title": f"Engagement event (layout version {EVENT.version})",
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in EVENT.schema},
        "required": [f.name for f in EVENT.schema if not f.nullable],
        "additionalProperties": True,
        "if": {"properties": {"is_ad": {"const": True}}},
        "then": {"required": ["advertiser_id"], "properties": {"advertiser_id": {"type": "integer"}}},
    }


def render_event_json_schema() -> str:
    """The committed text of ``pipelines/schemas/event.schema.json``."""
    return json.dumps(event_json_schema(), indent=2) + "\n"
