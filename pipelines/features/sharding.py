"""User sharding: which shard a user's history lives in (pure numpy, stable forever)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def user_shard(user_ids: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard of each user id: a multiplicative hash, so consecutive ids spread evenly."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    mixed = user_ids.astype(np.uint64) * _GOLDEN
    return ((mixed >> np.uint64(32)) % np.uint64(num_shards)).astype(np.int32)


def split_by_shard(table: pa.Table, num_shards: int) -> list[tuple[int, pa.Table]]:
    """``table`` (with a ``user_id`` column) cut into one sub-table per shard present."""
    if table.num_rows == 0:
        return []
    shards = user_shard(table.column("user_id").to_numpy(), num_shards)
    order = np.argsort(shards, kind="stable")
    sorted_shards = shards[order]
    starts = np.flatnonzero(np.r_[True, sorted_shards[1:] != sorted_shards[:-1]])
    ends = np.r_[starts[1:], len(order)]
    taken = table.take(pa.array(order))
    return [(int(sorted_shards[s]), taken.slice(s, e - s)) for s, e in zip(starts, ends, strict=True)]
