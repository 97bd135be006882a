"""Inline inputs for the similarity tests: clustered unit vectors, user vectors, representation tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.io.commit import commit_folder
from pipelines.io.parquet import write_table
from pipelines.schemas.layouts import REPRESENTATION, representation_schema
from pipelines.similarity.vectors import UserVectors

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
T0_S = T0_MS / 1000
VERSION = "gem-test-v1"


def clustered(n: int, dim: int, *, clusters: int = 20, noise: float = 0.35, seed: int = 0) -> np.ndarray:
    """``(n, dim)`` float32 unit vectors around ``clusters`` random centres, float16-exact."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    x = centres[rng.integers(0, clusters, n)] + noise * rng.normal(size=(n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float16).astype(np.float32)


def user_ids(n: int) -> np.ndarray:
    """Sparse, unsorted-looking ids: 10 + 3 i."""
    return 10 + 3 * np.arange(n, dtype=np.int64)


def users(vectors: np.ndarray, *, version: str = VERSION, computed_at_ms: int = T0_MS) -> UserVectors:
    n = len(vectors)
    return UserVectors(user_ids(n), vectors, np.full(n, computed_at_ms, np.int64), np.full(n, version, dtype=object))


def rep_table(
    user: Sequence[int],
    ad: Sequence[int | None],
    embedding: np.ndarray,
    *,
    computed_at_ms: int | Sequence[int] = T0_MS,
    version: str = VERSION,
) -> pa.Table:
    """A REPRESENTATION table with the given keys and ``embedding (N, D)`` (stored as float16)."""
    n, dim = embedding.shape
    at = np.broadcast_to(np.asarray(computed_at_ms, np.int64), (n,))
    flat = pa.array(embedding.astype(np.float16).reshape(-1), pa.float16())
    return pa.Table.from_arrays(
        [
            pa.array(list(user), pa.int64()),
            pa.array(list(ad), pa.int64()),
            pa.FixedSizeListArray.from_arrays(flat, dim),
            pa.nulls(n, pa.float32()),
            pa.array(np.full(n, 0.1), pa.float32()),
            pa.array(np.full(n, 0.01), pa.float32()),
            pa.array([version] * n, pa.string()),
            pa.array(at - 60_000, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(at, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        ],
        schema=representation_schema(dim),
    )


def write_representations(folder: Path, tables: Sequence[pa.Table]) -> Path:
    """``folder/representations/shard=NNNNN/part-00000.parquet``, one file per table, committed (as
    precompute writes)."""
    for shard, table in enumerate(tables):
        write_table(
            table, str(folder / "representations" / f"shard={shard:05d}" / "part-00000.parquet"), REPRESENTATION
        )
    commit_folder(str(folder), holds="representations")
    return folder
