"""An independent, strict checker of the event wire format (pipelines/schemas/event.schema.json + 1 MB lines).

Written from the documented format, not from the generator, so that a test can
tell a well-formed line from a malformed one without trusting either side.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES

MAX_LINE_BYTES = 1 << 20
REQUIRED = ("event_id", "user_id", "item_id", "is_ad", "item_category", "surface", "event_type", "event_time")
FLOAT32_MAX = 3.4028234663852886e38


def _reject_constant(name: str) -> float:
    raise ValueError(f"constant {name}")


def _is_int(value: Any, top: int) -> bool:
    return type(value) is int and 0 <= value <= top


def _time_ok(value: Any) -> bool:
    if type(value) is int:
        return value >= 0
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).tzinfo is not None
        except ValueError:
            return False
    return False


def _fields_problem(obj: dict[str, Any]) -> str | None:
    missing = [name for name in REQUIRED if name not in obj]
    if missing:
        return f"missing {missing}"
    checks = {
        "event_id": isinstance(obj["event_id"], str) and 0 < len(obj["event_id"]) <= 256,
        "user_id": _is_int(obj["user_id"], 2**63 - 1),
        "item_id": _is_int(obj["item_id"], 2**63 - 1),
        "is_ad": type(obj["is_ad"]) is bool,
        "item_category": _is_int(obj["item_category"], 2**31 - 1),
        "surface": obj["surface"] in SURFACES,
        "event_type": obj["event_type"] in EVENT_TYPES,
        "device": obj.get("device") is None or obj["device"] in DEVICES,
        "event_time": _time_ok(obj["event_time"]),
    }
    value = obj.get("value")
    checks["value"] = value is None or (
        type(value) in (int, float) and math.isfinite(value) and abs(value) <= FLOAT32_MAX
    )
    advertiser = obj.get("advertiser_id")
    checks["advertiser_id"] = _is_int(advertiser, 2**63 - 1) if obj["is_ad"] is True else advertiser is None
    bad = [name for name, ok in checks.items() if not ok]
    return f"bad {bad}" if bad else None


def wire_problem(raw: bytes) -> str | None:
    """Why ``raw`` (one line, no newline) is not a valid event, or None if it is."""
    if len(raw) > MAX_LINE_BYTES:
        return "line over 1 MB"
    if b"\x00" in raw:
        return "NUL byte"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return "not JSON"
    if not isinstance(obj, dict):
        return "not an object"
    return _fields_problem(obj)
