"""Inline REPRESENTATION tables for the store tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipelines.schemas.layouts import representation_schema

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
T0_S = T0_MS / 1000


def reps(
    keys: Sequence[tuple[int, int | None]],
    *,
    dim: int = 64,
    computed_at_ms: int | Sequence[int] = T0_MS,
    version: str | Sequence[str] = "gem-v1",
    seed: int = 0,
    scale: Sequence[float] | None = None,
) -> pa.Table:
    """One row per key: seeded float16 embeddings (or int8 codes when ``scale`` is given)."""
    n = len(keys)
    rng = np.random.default_rng(seed)
    if scale is None:
        emb = rng.normal(size=(n, dim)).astype(np.float16)
    else:
        emb = rng.integers(-127, 128, size=(n, dim)).astype(np.float16)
    at = np.broadcast_to(np.asarray(computed_at_ms, dtype=np.int64), (n,))
    versions = [version] * n if isinstance(version, str) else list(version)
    return pa.Table.from_arrays(
        [
            pa.array([k[0] for k in keys], pa.int64()),
            pa.array([k[1] for k in keys], pa.int64()),
            pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float16()), dim),
            pa.array(scale if scale is not None else [None] * n, pa.float32()),
            pa.array(rng.random(n), pa.float32()),
            pa.array(rng.random(n) / 10, pa.float32()),
            pa.array(versions, pa.string()),
            pa.array(at - 60_000, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(at, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        ],
        schema=representation_schema(dim),
    )


def grid(users: int, ads: int, *, user_level: bool = True) -> list[tuple[int, int | None]]:
    """Keys (u, a) for u < users, a < ads, plus (u, None) for each user when ``user_level``."""
    keys: list[tuple[int, int | None]] = []
    for u in range(users):
        if user_level:
            keys.append((u, None))
        keys.extend((u, 1000 + a) for a in range(ads))
    return keys
