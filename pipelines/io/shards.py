"""User sharding: which shard a user lives in (pure numpy, stable forever) and where a shard's files go."""

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
    return split_by(table, user_shard(table.column("user_id").to_numpy(), num_shards))


def split_by(table: pa.Table, keys: np.ndarray) -> list[tuple[int, pa.Table]]:
    """``table`` cut into one sub-table per distinct value of ``keys`` (one per row), in key order,
    rows in their order: zero-copy slices of one stable sort."""
    if table.num_rows == 0:
        return []
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(order)]
    taken = table.take(pa.array(order))
    return [(int(ordered[s]), taken.slice(s, e - s)) for s, e in zip(starts, ends, strict=True)]


def newest_per_user(tables: list[pa.Table], empty: pa.Table) -> pa.Table:
    """Rows with a ``user_id``, one per user, sorted by user: each user's **last** row across ``tables``
    in order (a later table, and a later row of one table, is newer: a bundle writes a user flushed
    twice in it in the order of its flushes); ``empty`` when no table has a row. Tables of one
    layout, cast to the last one's schema."""
    table = _concat(tables, empty)
    users = table.column("user_id").to_numpy()
    order = np.lexsort((-np.arange(len(users)), users))  # by user, the last row first
    ordered = users[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]] if len(ordered) else np.zeros(0, bool)
    return table.take(pa.array(order[first]))


def once_per_user(tables: list[pa.Table], empty: pa.Table) -> pa.Table:
    """The rows of ``tables`` with each user once, its last row: :func:`newest_per_user`, but the rows
    as they are (no sort, no copy) when no user repeats, the common case of a bundle's changed rows."""
    table = _concat(tables, empty)
    users = table.column("user_id").to_numpy()
    return table if len(np.unique(users)) == len(users) else newest_per_user([table], empty)


def _concat(tables: list[pa.Table], empty: pa.Table) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty
    schema = tables[-1].schema
    return pa.concat_tables([t if t.schema.equals(schema) else t.cast(schema) for t in tables])


#: How a shard's folder is named inside a kind's folder (``histories/shard=00007/``).
SHARD_DIR = "shard={:05d}"
#: Matches every shard folder of a kind.
SHARD_GLOB = "shard=*"


def shard_dir(root: str, kind: str, shard: int) -> str:
    """``root/kind/shard=NNNNN``: the folder of one shard of one kind of output."""
    return "/".join([root.rstrip("/"), kind, SHARD_DIR.format(shard)])


def shard_path(root: str, kind: str, shard: int, name: str = "part-00000.parquet") -> str:
    """The file ``name`` in one shard's folder (batch stages write one part per shard)."""
    return f"{shard_dir(root, kind, shard)}/{name}"


def kind_glob(root: str, kind: str, name: str = "*.parquet") -> str:
    """A glob over every shard's files of one kind: ``root/kind/shard=*/NAME``."""
    return "/".join([root.rstrip("/"), kind, SHARD_GLOB, name])
