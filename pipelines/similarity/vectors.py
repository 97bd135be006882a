"""User-level representations as float32 vectors (pure: pyarrow + numpy, no Beam, no faiss).

A REPRESENTATION row with a null ``ad_id`` is a user-level representation; its
``embedding`` is float16, or int8 codes times ``embedding_scale``. These helpers
find the representation files, read the user-level rows of one file as
:class:`UserVectors`, keep the newest row per user, and check arrays before they
reach FAISS (dtype, shape, contiguity) with errors that name the expected and the
actual value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.errors import ConfigError, InputNotFoundError, LayoutError
from pipelines.io.commit import read_commit
from pipelines.io.objects import arrow_filesystem, is_local
from pipelines.io.snapshot import REPRESENTATIONS, open_snapshot
from pipelines.schemas.embeddings import decode_embeddings
from pipelines.schemas.layouts import REPRESENTATION, layout_of

__all__ = [
    "UserVectors",
    "as_vectors",
    "decode_embeddings",
    "embedding_dim",
    "representation_files",
    "user_vectors",
]

FLAG = "--representations"
USER_COLUMNS = ["user_id", "ad_id", "embedding", "embedding_scale", "model_version", "computed_at"]


@dataclass(frozen=True)
class UserVectors:
    """N user-level representations: ``user_id (N,) int64``, ``vectors (N, D) float32``,
    ``computed_at_ms (N,) int64``, ``model_version (N,) object`` (str)."""

    user_id: np.ndarray
    vectors: np.ndarray
    computed_at_ms: np.ndarray
    model_version: np.ndarray

    def __len__(self) -> int:
        return len(self.user_id)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def take(self, rows: np.ndarray) -> UserVectors:
        return UserVectors(self.user_id[rows], self.vectors[rows], self.computed_at_ms[rows], self.model_version[rows])

    @classmethod
    def empty(cls, dim: int) -> UserVectors:
        return cls(
            np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, np.int64), np.zeros(0, dtype=object)
        )

    @classmethod
    def concat(cls, parts: list[UserVectors], dim: int) -> UserVectors:
        if not parts:
            return cls.empty(dim)
        return cls(
            np.concatenate([p.user_id for p in parts]),
            np.concatenate([p.vectors for p in parts]),
            np.concatenate([p.computed_at_ms for p in parts]),
            np.concatenate([p.model_version for p in parts]),
        )

    def newest_per_user(self) -> UserVectors:
        """One row per user (the newest ``computed_at``; ties: the larger vector bytes), sorted by user."""
        if len(self) == 0:
            return self
        tie = np.ascontiguousarray(self.vectors).view(np.uint8).reshape(len(self), -1).sum(axis=1)
        order = np.lexsort((tie, self.computed_at_ms, self.user_id))
        users = self.user_id[order]
        last = np.r_[users[1:] != users[:-1], True]
        return self.take(order[last])


def representation_files(root: str | Path) -> list[str]:
    """Parquet files of a committed precompute output (``DIR``, ``DIR/representations`` or one file), sorted.

    A folder must be a committed snapshot whose files match their commit
    (:func:`pipelines.io.snapshot.open_snapshot`); only the files the commit lists are read.
    """
    text = str(root).rstrip("/")
    if is_local(text) and Path(text).is_file():
        return [text]
    parent, _, name = text.rpartition("/")
    folder = (parent or ".") if name == REPRESENTATIONS and read_commit(text) is None else text
    snapshot = open_snapshot(folder, flag=FLAG, writer="python -m pipelines precompute")
    files = snapshot.files(REPRESENTATIONS)
    if not files:
        raise InputNotFoundError(
            f"{FLAG} {str(root)!r} holds no Parquet files; pass the --output folder of `python -m pipelines precompute`"
        )
    return files


def embedding_dim(schema: pa.Schema, where: str) -> int:
    """The embedding width of a REPRESENTATION schema; :class:`LayoutError` for other layouts."""
    found = layout_of(schema)
    if found is not None and found[0] != REPRESENTATION.name:
        raise LayoutError(f"{where}: layout {found[0]} v{found[1]}, expected {REPRESENTATION.name}")
    missing = [c for c in USER_COLUMNS if c not in schema.names]
    if missing:
        raise LayoutError(f"{where}: not a representation file (no columns {missing})")
    kind = schema.field("embedding").type
    if not pa.types.is_fixed_size_list(kind):
        raise LayoutError(f"{where}: embedding is {kind}, expected fixed_size_list<float16>[dim]")
    return int(kind.list_size)


def user_vectors(table: pa.Table, where: str = "table") -> UserVectors:
    """The user-level rows (``ad_id`` null) of a REPRESENTATION table as float32 vectors."""
    embedding_dim(table.schema, where)
    users = table.filter(pc.is_null(table.column("ad_id")))
    computed = users.column("computed_at").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    return UserVectors(
        user_id=np.asarray(users.column("user_id").to_numpy(), dtype=np.int64),
        vectors=decode_embeddings(users.column("embedding"), users.column("embedding_scale")),
        computed_at_ms=np.asarray(computed.to_numpy(), dtype=np.int64),
        model_version=np.asarray(users.column("model_version").to_pylist(), dtype=object),
    )


def read_user_vectors(path: str) -> UserVectors:
    """User-level rows of one representation Parquet file."""
    fs, where = arrow_filesystem(path)
    return user_vectors(pq.read_table(where, filesystem=fs, columns=USER_COLUMNS), path)


def as_vectors(x: object, dim: int, name: str = "vectors") -> np.ndarray:
    """``x`` as a C-contiguous ``(N, dim) float32`` array; :class:`TypeError` naming expected vs actual."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array of shape (N, {dim}) float32, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float16, np.float64):
        raise TypeError(f"{name}: expected dtype float32 (float16/float64 are converted), got {x.dtype}")
    if x.ndim != 2 or x.shape[1] != dim:
        raise TypeError(f"{name}: expected shape (N, {dim}), got {x.shape}")
    out = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(out).all():
        raise ValueError(f"{name}: {int((~np.isfinite(out)).any(axis=1).sum())} rows hold NaN or inf")
    return out


def check_flag_positive(flag: str, value: int) -> None:
    if value < 1:
        raise ConfigError(flag, f"got {value}", "pass a positive number")
