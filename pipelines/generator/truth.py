"""The ground truth written beside the events, so later stages can be judged against it.

For events at ``X.jsonl`` (or ``X.jsonl.gz``, ``X.parquet``) the folder ``X.truth/``
holds ``users.parquet`` (TRUTH_USERS), ``items.parquet`` (TRUTH_ITEMS) and
``world.json`` (parameters, seed, counts). No pipeline stage reads them, only
tests and evaluations; their layouts are registered in ``schemas/`` like every other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.generator.world import World
from pipelines.io.parquet import write_table
from pipelines.schemas.layouts import TRUTH_ITEMS, TRUTH_USERS

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
