"""Representations to write, as columns: built from an Arrow table or from numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.errors import LayoutError
from pipelines.schemas.layouts import representation_schema
from pipelines.store.codec import NULL_MS

__all__ = ["RepresentationArrays"]


@dataclass(frozen=True)
class RepresentationArrays:
    """N representations in the REPRESENTATION layout, as numpy columns.

    Shapes: ``user_id``, ``ad_id`` int64 (N,) (``ad_id`` ignored where ``has_ad`` is
    False: a user-level representation); ``embedding`` (N, D) float16/float32, or the
    int8 codes when ``embedding_scale`` (N,) float32 is given (NaN rows = not
    quantised); ``p_click``, ``p_conversion`` float32 (N,); ``model_version`` (N,)
    str; ``computed_at_ms``, ``history_watermark_ms`` int64 (N,) epoch ms (watermark
    ``NULL_MS`` = null). Validated in ``__post_init__`` (O(N·D), once per batch).
    """

    user_id: np.ndarray
    ad_id: np.ndarray
    has_ad: np.ndarray
    embedding: np.ndarray
    p_click: np.ndarray
    p_conversion: np.ndarray
    model_version: np.ndarray
    computed_at_ms: np.ndarray
    history_watermark_ms: np.ndarray
    embedding_scale: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.user_id)
        if self.embedding.ndim != 2 or len(self.embedding) != n:
            raise ValueError(f"embedding must be (N={n}, D), got shape {self.embedding.shape}")
        for name in (
            "ad_id",
            "has_ad",
            "p_click",
            "p_conversion",
            "model_version",
            "computed_at_ms",
            "history_watermark_ms",
        ):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.embedding_scale is not None and len(self.embedding_scale) != n:
            raise ValueError(f"embedding_scale has {len(self.embedding_scale)} rows, expected {n}")
        if not 0 < self.dim < 2**16:
            raise ValueError(f"embedding dim must be in 1..65535, got {self.dim}")
        bad = ~np.isfinite(self.values()).all(axis=1)
        if bad.any():
            raise ValueError(f"{int(bad.sum())} embeddings have NaN/inf values, first at row {int(bad.argmax())}")
        if any(not v for v in self.model_version.tolist()):
            raise ValueError("model_version must be a non-empty string on every row")
        if (self.computed_at_ms == NULL_MS).any():
            raise ValueError("computed_at must be set on every row")

    def __len__(self) -> int:
        return len(self.user_id)

    @property
    def dim(self) -> int:
        return int(self.embedding.shape[1])

    def values(self) -> np.ndarray:
        """The real embedding values (N, D) float32 (int8 codes times their scale)."""
        values = self.embedding.astype(np.float32)
        if self.embedding_scale is not None:
            scale = np.nan_to_num(self.embedding_scale.astype(np.float32), nan=1.0)
            values *= scale[:, None]
        return values

    def int8_codes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(codes int8 (N, D), scale (N,)) when every row is already int8-quantised, else None."""
        if self.embedding_scale is None or np.isnan(self.embedding_scale).any():
            return None
        codes = self.embedding.astype(np.float32)
        if np.abs(codes).max(initial=0) > 127 or not np.array_equal(codes, np.rint(codes)):
            return None
        return codes.astype(np.int8), self.embedding_scale.astype(np.float32)

    @classmethod
    def from_arrow(cls, table: pa.Table | pa.RecordBatch) -> RepresentationArrays:
        """Columns of a table in the REPRESENTATION layout (any embedding dim)."""
        names = set(table.schema.names)
        missing = [n for n in representation_schema(1).names if n not in names]
        if missing:
            raise LayoutError(f"representation table lacks columns {missing}")
        for name in ("user_id", "embedding", "p_click", "p_conversion", "model_version", "computed_at"):
            if table.column(name).null_count:
                raise ValueError(f"representation column {name} has nulls")
        emb = _combine(table.column("embedding"))
        if not pa.types.is_fixed_size_list(emb.type):
            raise LayoutError(f"embedding must be a fixed-size list, got {emb.type}")
        dim = emb.type.list_size
        flat = emb.flatten().to_numpy(zero_copy_only=False)
        ad = _combine(table.column("ad_id"))
        scale = _combine(table.column("embedding_scale"))
        return cls(
            user_id=_ints(table.column("user_id")),
            ad_id=_ints(ad, fill=0),
            has_ad=ad.is_valid().to_numpy(zero_copy_only=False),
            embedding=flat.reshape(len(table), dim),
            p_click=_floats(table.column("p_click")),
            p_conversion=_floats(table.column("p_conversion")),
            model_version=np.asarray(table.column("model_version").to_pylist(), dtype=object),
            computed_at_ms=_ints(table.column("computed_at")),
            history_watermark_ms=_ints(table.column("history_watermark"), fill=NULL_MS),
            embedding_scale=None if scale.null_count == len(scale) else _floats(scale),
        )


def _combine(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _ints(column: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    arr = _combine(column)
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.timestamp("ms", tz=arr.type.tz), safe=False).cast(pa.int64())
    return pc.fill_null(arr.cast(pa.int64()), fill).to_numpy(zero_copy_only=False)


def _floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    arr = pc.fill_null(_combine(column).cast(pa.float32()), np.float32("nan"))
    return arr.to_numpy(zero_copy_only=False)
