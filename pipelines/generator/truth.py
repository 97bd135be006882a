"""The ground truth written beside the events, so later stages can be judged against it.

For events at ``X.jsonl`` (or ``X.jsonl.gz``, ``X.parquet``) the folder ``X.truth/``
holds ``users.parquet`` (TRUTH_USERS), ``items.parquet`` (TRUTH_ITEMS) and
``world.json`` (parameters, seed, counts). These layouts belong to the generator,
not to ``schemas/``: no pipeline stage reads them, only tests and evaluations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.generator.world import World
from pipelines.io.parquet import write_table
from schemas.layouts import Layout

TRUTH_USERS = Layout(
    "truth_users",
    1,
    pa.schema(
        [
            pa.field("user_id", pa.int64(), nullable=False),
            pa.field("segment", pa.int32(), nullable=False),
            # Interest over item categories (index = item_category); sums to 1.
            pa.field("interest", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False),
            pa.field("preferred_surface", pa.int8(), nullable=False),
            pa.field("preferred_device", pa.int8(), nullable=False),
            # Expected events per day (power law).
            pa.field("activity", pa.float64(), nullable=False),
        ]
    ),
)

TRUTH_ITEMS = Layout(
    "truth_items",
    1,
    pa.schema(
        [
            pa.field("item_id", pa.int64(), nullable=False),
            pa.field("is_ad", pa.bool_(), nullable=False),
            pa.field("advertiser_id", pa.int64()),
            pa.field("item_category", pa.int32(), nullable=False),
            # Share of impressions within its kind (ads or organic) at equal interest.
            pa.field("popularity", pa.float64(), nullable=False),
        ]
    ),
)

_SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")


def truth_dir_for(output: Path) -> Path:
    """``X.truth`` for an events file ``X.jsonl``, ``X.jsonl.gz`` or ``X.parquet``."""
    name = output.name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return output.with_name(name[: -len(suffix)] + ".truth")
    return output.with_name(name + ".truth")


def users_table(world: World) -> pa.Table:
    users = world.users
    n, c = users.interest.shape
    offsets = pa.array(np.arange(0, n * c + 1, c, dtype=np.int32))
    columns = {
        "user_id": pa.array(users.user_id),
        "segment": pa.array(users.segment),
        "interest": pa.ListArray.from_arrays(offsets, pa.array(users.interest.ravel())),
        "preferred_surface": pa.array(users.preferred_surface),
        "preferred_device": pa.array(users.device),
        "activity": pa.array(users.activity),
    }
    return pa.table(columns).cast(TRUTH_USERS.with_metadata())


def items_table(world: World) -> pa.Table:
    items = world.items
    columns = {
        "item_id": pa.array(items.item_id),
        "is_ad": pa.array(items.is_ad),
        "advertiser_id": pa.array(items.advertiser_id, mask=items.advertiser_id < 0),
        "item_category": pa.array(items.category),
        "popularity": pa.array(items.popularity),
    }
    return pa.table(columns).cast(TRUTH_ITEMS.with_metadata())


def write_truth(world: World, folder: Path, summary: dict[str, Any]) -> Path:
    """Write users.parquet, items.parquet and world.json into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    write_table(users_table(world), str(folder / "users.parquet"), TRUTH_USERS)
    write_table(items_table(world), str(folder / "items.parquet"), TRUTH_ITEMS)
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    (folder / "world.json").write_text(text)
    return folder
