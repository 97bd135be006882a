"""Put a world's events together: one EVENT-layout table, sorted by time, with unique ids.

:func:`generate_events` is the whole generator minus the writing: a pure function
of the config, so tests and benchmarks call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipelines.generator.config import WorldConfig
from pipelines.generator.engagement import Engagement, simulate_engagement
from pipelines.generator.sessions import simulate_impressions
from pipelines.generator.world import World, build_world
from pipelines.schemas.layouts import EVENT

#: Independent random streams, so that adding one stage never changes another's draws.
STREAMS = ("world", "sessions", "engagement", "candidates", "duplicates", "corruption", "funnel")

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_EVENT_SALT = 0x6576656E74  # "event"


@dataclass(frozen=True)
class GeneratedEvents:
    """A world and its events (EVENT layout, sorted by event_time, then generation order)."""

    world: World
    events: pa.Table
    impression_item: np.ndarray  # (N,) item index of each impression (diagnostics)


def rngs(seed: int) -> dict[str, np.random.Generator]:
    """One generator per stage, all derived from ``seed``."""
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.Generator(np.random.PCG64(child)) for name, child in zip(STREAMS, children, strict=True)}


def generate_events(config: WorldConfig) -> GeneratedEvents:
    """The world of ``config`` and every event that happens in it during the period."""
    streams = rngs(config.seed)
    world = build_world(config, streams["world"])
    impressions = simulate_impressions(world, streams["sessions"])
    engagement = simulate_engagement(world, impressions, streams["engagement"])
    table = _to_table(world, impressions.user, impressions.surface, impressions.device, engagement)
    return GeneratedEvents(world, table, engagement.item)


def _to_table(
    world: World, user: np.ndarray, surface: np.ndarray, device: np.ndarray, engagement: Engagement
) -> pa.Table:
    events = engagement.events
    keep = np.flatnonzero(events.time_ms < world.config.end_ms)
    keep = keep[np.argsort(events.time_ms[keep], kind="stable")]
    source = events.source[keep]
    item = engagement.item[source]
    items = world.items
    advertiser = items.advertiser_id[item]
    value = events.value[keep]
    device_code = device[source]
    columns = {
        "event_id": event_ids(world.config.seed, len(keep), _EVENT_SALT),
        "user_id": pa.array(world.users.user_id[user[source]]),
        "item_id": pa.array(items.item_id[item]),
        "is_ad": pa.array(items.is_ad[item]),
        "advertiser_id": pa.array(advertiser, mask=advertiser < 0),
        "item_category": pa.array(items.category[item]),
        "surface": pa.array(surface[source]),
        "event_type": pa.array(events.event_type[keep]),
        "event_time": pa.array(events.time_ms[keep]).cast(pa.timestamp("ms", tz="UTC")),
        "value": pa.array(value, mask=np.isnan(value)),
        "device": pa.array(device_code, mask=device_code < 0),
    }
    return pa.table(columns, schema=EVENT.with_metadata())


def event_ids(seed: int, n: int, salt: int) -> pa.Array:
    """``n`` distinct 16-hex-digit ids: splitmix64 (a bijection) of consecutive counters.

    The counters start at a point derived from (seed, salt), so ids differ across
    seeds and kinds of record, and are unique within one run.
    """
    start = _splitmix64(np.array([seed * 0x1000003 + salt], dtype=np.uint64))[0]
    counters = np.arange(n, dtype=np.uint64) + start  # wraps modulo 2**64: still distinct
    mixed = _splitmix64(counters)
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    digits = _HEX[((mixed[:, None] >> shifts) & np.uint64(0xF)).astype(np.intp)]
    offsets = np.arange(0, 16 * (n + 1), 16, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes()))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
