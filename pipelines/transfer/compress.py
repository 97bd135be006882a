"""Representation features for the ranker, and their compressed forms (int8, a PCA projection).

Bytes are those of the embedding as a store would keep it: float16 (2 bytes a value), int8
with one float32 scale per vector (1 byte a value + 4), the PCA projection in float16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.similarity.policy import PATHS
from pipelines.transfer.snapshots import RepFeatures

__all__ = ["Codec", "fit_codec", "rep_block"]


@dataclass(frozen=True)
class Codec:
    """A way to store representation vectors: ``name``, bytes per stored vector, and for a
    projection the fitted ``mean (R,)`` and ``basis (R, K)`` of the user and pair vectors."""

    name: str
    dims: int
    bytes_per_vector: int
    user_proj: tuple[np.ndarray, np.ndarray] | None = None
    pair_proj: tuple[np.ndarray, np.ndarray] | None = None

    def apply(self, vectors: np.ndarray, kind: str) -> np.ndarray:
        """Round-trip ``vectors (N, R)`` through the stored form; all-zero rows (missing) stay zero."""
        present = np.any(vectors != 0, axis=1)
        if self.name == "int8":
            scale = np.abs(vectors).max(axis=1, keepdims=True) / 127.0
            safe = np.where(scale > 0, scale, 1.0)
            out = np.clip(np.round(vectors / safe), -127, 127) * safe
        elif self.name.startswith("pca"):
            proj = self.user_proj if kind == "user" else self.pair_proj
            assert proj is not None
            mean, basis = proj
            out = ((vectors - mean) @ basis).astype(np.float16).astype(np.float32)
        else:
            out = vectors.astype(np.float16).astype(np.float32)
        return np.where(present[:, None], out, 0.0).astype(np.float32)


def _pca(vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    present = vectors[np.any(vectors != 0, axis=1)]
    if len(present) < 2:
        dim = vectors.shape[1]
        return np.zeros(dim, np.float32), np.eye(dim, k, dtype=np.float32)
    mean = present.mean(axis=0)
    _, _, vt = np.linalg.svd(present - mean, full_matrices=False)
    basis = np.zeros((vectors.shape[1], k), np.float32)
    basis[:, : min(k, vt.shape[0])] = vt[:k].T
    return mean.astype(np.float32), basis


def fit_codec(name: str, train: RepFeatures | None = None) -> Codec:
    """``float16``, ``int8`` or ``pcaK`` (fitted on the training split's user and pair vectors)."""
    if train is None and name.startswith("pca"):
        raise ValueError("a PCA codec is fitted on the training split's features")
    dim = 0 if train is None else train.user.shape[1]
    if name == "float16":
        return Codec(name, dim, 2 * dim)
    if name == "int8":
        return Codec(name, dim, dim + 4)
    if name.startswith("pca"):
        assert train is not None
        k = int(name[3:])
        return Codec(name, k, 2 * k, _pca(train.user, k), _pca(train.pair, k))
    raise ValueError(f"unknown codec {name!r}; use float16, int8 or pcaK")


def rep_block(f: RepFeatures, codec: Codec) -> np.ndarray:
    """``(N, 2K + len(PATHS) + 2) float32``: the stored user and pair slot vectors, the fallback
    path one-hot and log1p of their ages in hours (0 where none)."""
    onehot = np.eye(len(PATHS), dtype=np.float32)[f.path.astype(np.int64)]
    ages = np.stack([f.user_age_s, f.pair_age_s], axis=1) / 3600.0
    ages = np.log1p(np.nan_to_num(ages, nan=0.0)).astype(np.float32)
    return np.concatenate([codec.apply(f.user, "user"), codec.apply(f.pair, "pair"), onehot, ages], axis=1)
