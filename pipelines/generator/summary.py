"""Counts and distributions of a generated world, for world.json and the CLI summary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.generator.events import GeneratedEvents
from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES


def _named_counts(codes: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    counts = np.bincount(codes, minlength=len(names))
    return {name: int(n) for name, n in zip(names, counts, strict=True)}


def distribution(values: np.ndarray) -> dict[str, float]:
    """Median, p90, p99, max and mean of ``values`` (zeros if empty)."""
    if len(values) == 0:
        return {"median": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "median": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
        "mean": round(float(values.mean()), 3),
    }


def events_per_user(generated: GeneratedEvents) -> np.ndarray:
    """(U,) number of events of each user of the world (zeros included), in user order."""
    users = generated.world.users.user_id
    index = np.searchsorted(users, generated.events["user_id"].to_numpy())
    return np.bincount(index, minlength=len(users))


def events_summary(generated: GeneratedEvents) -> dict[str, Any]:
    """The counts written into world.json: events, their mix and the per-user shape."""
    events, world = generated.events, generated.world
    per_user = events_per_user(generated)
    device = events["device"].to_numpy(zero_copy_only=False)
    device_codes = np.nan_to_num(device.astype(np.float64), nan=len(DEVICES)).astype(np.int64)
    time = events["event_time"].cast(pa.int64()).to_numpy()
    return {
        "events": events.num_rows,
        "users": len(per_user),
        "users_with_events": int((per_user > 0).sum()),
        "users_over_20000_events": int((per_user > 20_000).sum()),
        "events_per_user": distribution(per_user),
        "items": len(world.items.item_id),
        "ads": world.items.num_ads,
        "advertisers": int(np.unique(world.items.advertiser_id[world.items.is_ad]).size),
        "segments": int(world.config.segments),
        "categories": int(world.config.categories),
        "event_types": _named_counts(events["event_type"].to_numpy(), EVENT_TYPES),
        "surfaces": _named_counts(events["surface"].to_numpy(), SURFACES),
        "devices": _named_counts(device_codes, (*DEVICES, "unknown")),
        "first_event_time_ms": int(time.min()) if len(time) else None,
        "last_event_time_ms": int(time.max()) if len(time) else None,
    }


def candidates_summary(table: pa.Table, name: str) -> dict[str, Any]:
    sizes = np.diff(table["ad_ids"].combine_chunks().offsets.to_numpy())
    return {
        "file": name,
        "requests": table.num_rows,
        "users": int(np.unique(table["user_id"].to_numpy()).size),
        "ads_per_request": distribution(sizes),
    }
