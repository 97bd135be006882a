"""A loaded user index: positions <-> user ids, query vectors, k-nearest-user search.

    index = UserIndex.load("out/index", gpu="auto")
    found = index.neighbors(np.array([42, 7]), k=10)     # one faiss search for all users
    found.user_ids  # (2, 10) int64, -1 where fewer neighbours exist
    found.similarity  # (2, 10) float32: inner product, or 1 - d²/2 for l2 (cosine on unit vectors)

A user's query vector is the one stored at its position (``vectors.npy``), so a
lookup needs no store read before the search.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.errors import ConfigError
from pipelines.io.objects import is_local
from pipelines.io.snapshot import local_copy, open_snapshot
from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.artifact import IndexManifest, read_id_map, read_manifest, read_vectors
from pipelines.similarity.build import BuiltIndex
from pipelines.similarity.faiss_ops import faiss
from pipelines.similarity.ondisk import read_index_file
from pipelines.similarity.vectors import as_vectors

__all__ = ["Neighbors", "UserIndex"]


@dataclass(frozen=True)
class Neighbors:
    """Per query user: ``user_ids (Q, k) int64`` (-1 = none), ``similarity (Q, k) float32`` (NaN = none),
    nearest first; the user itself is never among its neighbours."""

    user_ids: np.ndarray
    similarity: np.ndarray


class UserIndex:
    """A FAISS index of user representations with its id map and manifest."""

    def __init__(
        self,
        index: Any,
        manifest: IndexManifest,
        user_ids: np.ndarray,
        vectors: np.ndarray,
        parts: list[Any] | None = None,
        on_gpu: bool = False,
    ) -> None:
        if len(user_ids) != manifest.count or index.ntotal != manifest.count:
            raise ConfigError(
                "--index",
                f"manifest says {manifest.count} vectors, the id map has {len(user_ids)} and the index {index.ntotal}",
                "rebuild the index folder",
            )
        self.index = ops.searchable(index, manifest.factory, vectors, manifest.metric)
        self.manifest = manifest
        self.user_ids = np.asarray(user_ids, dtype=np.int64)
        self.vectors = vectors
        self.on_gpu = on_gpu
        self._parts = parts or []  # IndexShards does not own its shards: keep them alive

    @classmethod
    def load(cls, folder: str | Path, *, gpu: ops.GpuMode = "auto") -> UserIndex:
        """Load a committed index folder (refused when uncommitted or its files differ from the commit:
        sizes are checked, not checksums, so a lookup stays fast); on a GPU when ``gpu="auto"`` finds
        one and the index type supports it. An ``ondisk`` index maps its inverted lists read-only
        (``lists.ivfdata``): the operating system pages in the lists that searches touch. An index on
        an object store is first downloaded (every byte CRC-checked) into a local folder that lives
        as long as the returned object."""
        writer = "python -m pipelines index"
        snapshot = open_snapshot(str(folder), flag="--index", writer=writer, deep=False, pin=False)
        if not is_local(str(folder)):  # FAISS reads local files: fetch the committed ones first
            local = tempfile.mkdtemp(prefix="gem-index-")
            try:
                local_copy(snapshot, local, flag="--index", writer=writer)
                loaded = cls.load(local, gpu=gpu)
            except BaseException:
                shutil.rmtree(local, ignore_errors=True)
                raise
            weakref.finalize(loaded, shutil.rmtree, local, True)
            return loaded
        manifest = read_manifest(folder)
        names = manifest.files[:1] if manifest.layout == "ondisk" else manifest.files
        parts = [read_index_file(Path(folder) / name) for name in names]
        if manifest.layout == "sharded":
            index = faiss.IndexShards(manifest.dim, True, True)
            for part in parts:
                index.add_shard(part)
            index.metric_type = parts[0].metric_type
        else:
            index = parts[0]
        index, on_gpu = ops.to_gpu(index, gpu) if manifest.layout != "sharded" else (index, False)
        ops.set_search_params(index, manifest.search_params)
        return cls(index, manifest, read_id_map(folder), read_vectors(folder), parts, on_gpu)

    @classmethod
    def from_built(cls, built: BuiltIndex) -> UserIndex:
        """Wrap an index built in this process (tests, evaluation, benchmarks)."""
        return cls(built.index, built.manifest, built.user_ids, built.vectors, built.parts)

    @property
    def model_version(self) -> str:
        return self.manifest.model_version

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def __len__(self) -> int:
        return len(self.user_ids)

    def positions_of(self, user_ids: np.ndarray) -> np.ndarray:
        """``(N,)`` position of each user id, -1 for users not in the index."""
        users = np.asarray(user_ids, dtype=np.int64)
        if len(self.user_ids) == 0:
            return np.full(len(users), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.user_ids, users), len(self.user_ids) - 1)
        return np.where(self.user_ids[pos] == users, pos, -1)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, positions)`` ``(Q, k)`` of raw faiss search; positions -1 where none."""
        if k < 1:
            raise ConfigError("--k", f"got {k}", "pass a positive number of neighbours")
        queries = as_vectors(queries, self.dim, "queries")
        if len(self) == 0 or len(queries) == 0:
            return np.full((len(queries), k), np.nan, np.float32), np.full((len(queries), k), -1, np.int64)
        scores, positions = self.index.search(queries, k)
        return scores, positions

    def similarity(self, scores: np.ndarray) -> np.ndarray:
        """Search scores as similarities (higher = closer): inner product, or 1 - d²/2 for l2."""
        return scores if self.manifest.metric == "ip" else 1.0 - scores / 2.0

    def neighbors(self, user_ids: np.ndarray, k: int) -> Neighbors:
        """The ``k`` nearest other users of each user, one search for all; none for unknown users."""
        users = np.asarray(user_ids, dtype=np.int64)
        pos = self.positions_of(users)
        queries = np.zeros((len(users), self.dim), np.float32)
        found = pos >= 0
        queries[found] = self.vectors[pos[found]]
        return self.nearest(queries, k, own=pos, searched=found)

    def nearest(
        self, queries: np.ndarray, k: int, *, own: np.ndarray | None = None, searched: np.ndarray | None = None
    ) -> Neighbors:
        """The ``k`` nearest indexed users of each query vector ``(Q, D)``, one search for all; the
        position ``own (Q,)`` of each query's user (-1: not indexed) is never among its answers, and
        rows where ``searched (Q,)`` is False get none."""
        n = len(queries)
        own = np.full(n, -1, np.int64) if own is None else np.asarray(own, np.int64)
        out_ids = np.full((n, k), -1, dtype=np.int64)
        out_sim = np.full((n, k), np.nan, dtype=np.float32)
        rows = np.arange(n) if searched is None else np.flatnonzero(searched)
        if len(rows) == 0 or len(self) == 0:
            return Neighbors(out_ids, out_sim)
        scores, found = self.search(np.asarray(queries[rows], dtype=np.float32), min(k + 1, len(self)))
        keep = (found >= 0) & (found != own[rows][:, None])
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept ones first, nearest first
        taken = np.take_along_axis(found, order, axis=1)
        valid = np.take_along_axis(keep, order, axis=1)
        sims = self.similarity(np.take_along_axis(scores, order, axis=1))
        width = taken.shape[1]
        out_ids[rows, :width] = np.where(valid, self.user_ids[np.maximum(taken, 0)], -1)
        out_sim[rows, :width] = np.where(valid, sims, np.nan)
        return Neighbors(out_ids, out_sim)
