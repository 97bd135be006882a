"""Small inline event tables for the features tests."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipelines.schemas.layouts import EVENT

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def event(event_id: str, user_id: int, t: int, event_type: int = 0, item_id: int = 7, **extra: Any) -> dict:
    """One EVENT-layout row (enum codes), ``t`` ms after T0."""
    row = dict(
        event_id=event_id,
        user_id=user_id,
        item_id=item_id,
        is_ad=True,
        advertiser_id=3,
        item_category=2,
        surface=0,
        event_type=event_type,
        event_time=T0 + t,
        value=None,
        device=1,
    )
    row.update(extra)
    return row


def events_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=EVENT.schema)


def wire(**overrides: Any) -> dict:
    """One valid event in the JSON wire format."""
    obj = dict(
        event_id="e1",
        user_id=1,
        item_id=7,
        is_ad=True,
        advertiser_id=3,
        item_category=2,
        surface="facebook_feed",
        event_type="impression",
        event_time=T0,
        value=1.5,
        device="ios",
    )
    obj.update(overrides)
    return obj


def line(**overrides: Any) -> bytes:
    return json.dumps(wire(**overrides)).encode()
