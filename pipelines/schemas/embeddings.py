"""Decode the REPRESENTATION layout's ``embedding`` column (float16, or int8 codes with a scale)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["decode_embeddings"]


def decode_embeddings(embedding: pa.Array | pa.ChunkedArray, scale: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``(N, D) float32`` from a fixed-size-list column (float16, or int8 codes with a scale)."""
    if isinstance(embedding, pa.ChunkedArray):
        embedding = embedding.combine_chunks() if embedding.num_chunks else pa.array([], embedding.type)
    dim = embedding.type.list_size
    values = np.asarray(embedding.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    values = values.reshape(len(embedding), dim)
    scales = np.asarray(pc.fill_null(scale, 1.0).to_numpy(zero_copy_only=False), dtype=np.float32)
    if len(scales) and not np.all(scales == 1.0):
        values *= scales[:, None]
    return values
