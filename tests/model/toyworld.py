"""A small planted-signal world in the ``history`` and ``training_example`` layouts.

For tests and for the benchmark when the project's generator and features pipeline
are not at hand. Each user has one or two interest categories; each impression is
followed by a click with a probability that is much higher when the item's category
is an interest, and some clicks by a conversion. So a model that reads the history
(which categories the user clicked) can beat popularity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.durations import DAY_MS
from pipelines.io.commit import commit_folder
from pipelines.schemas.enums import CLICK, EVENT_TYPE_CODE, EVENT_TYPES, IMPRESSION, SURFACES
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE

START_MS = 1_760_000_000_000


@dataclass(frozen=True)
class ToyWorld:
    """Parameters of :func:`make_world`."""

    users: int = 200
    mean_impressions: int = 30
    days: int = 4
    categories: int = 12
    items: int = 600
    seed: int = 0


def _user_events(rng: np.random.Generator, world: ToyWorld, user: int, catalog: dict[str, np.ndarray]) -> list[dict]:
    interests = rng.choice(world.categories, size=int(rng.integers(1, 3)), replace=False)
    n = max(1, int(rng.pareto(1.5) * world.mean_impressions * 0.5) + 1)
    n = min(n, world.mean_impressions * 20)
    times = np.sort(rng.integers(0, world.days * DAY_MS - 60_000, size=n)) + START_MS
    in_interest = rng.random(n) < 0.5
    cat_items = [np.flatnonzero(np.isin(catalog["category"], interests)), np.arange(world.items)]
    events: list[dict] = []
    for i in range(n):
        pool = cat_items[0] if in_interest[i] and len(cat_items[0]) else cat_items[1]
        item = int(rng.choice(pool))
        liked = catalog["category"][item] in interests
        surface = int(rng.integers(len(SURFACES)))
        base = dict(
            item_id=item,
            is_ad=bool(catalog["is_ad"][item]),
            advertiser_id=int(catalog["advertiser"][item]) if catalog["is_ad"][item] else None,
            item_category=int(catalog["category"][item]),
            surface=surface,
        )
        t = int(times[i])
        events.append({**base, "event_type": IMPRESSION, "event_time": t, "value": None})
        if rng.random() < (0.45 if liked else 0.04):
            events.append({**base, "event_type": CLICK, "event_time": t + 10_000, "value": 5.0})
            if rng.random() < 0.3:
                events.append(
                    {**base, "event_type": EVENT_TYPE_CODE["conversion"], "event_time": t + 20_000, "value": 20.0}
                )
    events.sort(key=lambda e: e["event_time"])
    for j, e in enumerate(events):
        e["event_id"] = f"u{user}-e{j}"
    return events


def make_world(world: ToyWorld = ToyWorld()) -> tuple[pa.Table, pa.Table]:
    """``(histories, training_examples)`` tables conforming to the layouts (with metadata)."""
    rng = np.random.default_rng(world.seed)
    catalog = {
        "category": rng.integers(0, world.categories, world.items),
        "is_ad": rng.random(world.items) < 0.6,
        "advertiser": rng.integers(1, 40, world.items),
    }
    history_rows, example_rows = [], []
    for user in range(world.users):
        events = _user_events(rng, world, user, catalog)
        device = int(rng.integers(3))
        for j, e in enumerate(events):
            if e["event_type"] != IMPRESSION:
                continue
            later = [x for x in events[j + 1 : j + 4] if x["item_id"] == e["item_id"]]
            example_rows.append(
                {
                    "event_id": e["event_id"],
                    "user_id": user,
                    "item_id": e["item_id"],
                    "is_ad": e["is_ad"],
                    "advertiser_id": e["advertiser_id"],
                    "item_category": e["item_category"],
                    "surface": e["surface"],
                    "device": device,
                    "event_time": e["event_time"],
                    "clicked": any(x["event_type"] == CLICK for x in later),
                    "converted": any(x["event_type"] == EVENT_TYPE_CODE["conversion"] for x in later),
                    "history_length": j,
                    "history_end": j,
                }
            )
        history_rows.append(history_row(user, events))
    histories = pa.Table.from_pylist(history_rows, schema=HISTORY.with_metadata())
    examples = pa.Table.from_pylist(example_rows, schema=TRAINING_EXAMPLE.with_metadata())
    return histories, examples


def history_row(user_id: int, events: list[dict], evicted: int = 0) -> dict:
    """One ``history`` row from event dicts (oldest first; ``event_time`` in ms)."""
    last = events[-1]["event_time"] if events else START_MS
    return {
        "user_id": user_id,
        "events": events,
        "summary": {
            "evicted_count": evicted,
            "surface_counts": [0] * len(SURFACES),
            "event_type_counts": [0] * len(EVENT_TYPES),
            "first_event_time": None,
            "last_event_time": None,
        },
        "num_events_total": len(events) + evicted,
        "last_event_time": last,
        "watermark": last,
    }


def write_features_dir(directory: str | Path, histories: pa.Table, examples: pa.Table, shards: int = 2) -> Path:
    """Lay the tables out like the features pipeline does: ``histories/shard=N/``,
    ``training_examples/shard=N/`` (by user id modulo ``shards``), committed."""
    root = Path(directory)
    for name, table in (("histories", histories), ("training_examples", examples)):
        users = np.asarray(table.column("user_id").to_numpy())
        for shard in range(shards):
            part = table.filter(pa.array(users % shards == shard))
            folder = root / name / f"shard={shard:05d}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, folder / "part-0.parquet")
    (root / "summary.json").write_text('{"source": "toyworld"}\n')
    commit_folder(str(root), holds="a toy features snapshot")
    return root
