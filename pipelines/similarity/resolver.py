"""The Solaris resolver: a representation for every (user, candidate ad) of a request.

    resolver = Resolver(open_store("lmdb:///out/store"), UserIndex.load("out/index"),
                        ResolverConfig(max_age_s=3600, fallback_max_age_s=7 * 86400, k=10))
    got = resolver.resolve(user_id=42, ad_ids=[7, 8, 9])
    got.path_names()   # ["exact", "similar_users", "none"]
    got.embedding      # (3, D) float32, NaN rows for "none"
    got.age_s          # (3,) seconds, by the resolver's clock

One request costs one faiss search (the user's k nearest users, from the vector
stored at its index position) and one store round trip (``read_for_request``: the
exact pairs, the user-level record and the neighbours' pairs together); the path
choice is :mod:`pipelines.similarity.policy`. The search runs on the calling thread only;
the read makes no Python object per key but the key and the value (keys cut from numpy
arrays, values decoded by one ``frombuffer``), and only the rows an answer uses are
widened to float32. Ages come from ``computed_at`` and the
resolver's own clock (injectable, e.g. ``ManualClock``). Any record of another
model_version than the index's, or a request asking for another one, raises
:class:`VersionMismatchError`: representations of different models never mix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipelines.errors import PipelinesError
from pipelines.similarity.faiss_ops import faiss
from pipelines.similarity.policy import PATHS, FallbackPath, ResolverConfig, blend_neighbors, pick_paths
from pipelines.similarity.user_index import UserIndex
from pipelines.store import Clock, OnlineStore, ReadResult, pair_grid

__all__ = ["Answer", "DimensionMismatchError", "Resolution", "Resolver", "VersionMismatchError"]


class VersionMismatchError(PipelinesError, ValueError):
    """Index, store records and request disagree on the model_version."""


class DimensionMismatchError(PipelinesError, TypeError):
    """Stored embeddings do not have the index's dimension."""


@dataclass(frozen=True)
class Answer:
    """One (user, ad)'s answer: the representation, the path taken and its age."""

    user_id: int
    ad_id: int
    path: str
    embedding: np.ndarray | None
    age_s: float | None
    p_click: float | None
    neighbors_used: int
    similarity: float | None


@dataclass(frozen=True)
class Resolution:
    """A request's answers, row j for ``ad_ids[j]``: ``path (A,) int8`` (:class:`FallbackPath`),
    ``embedding (A, D) float32`` (NaN rows for none), ``age_s (A,)`` (NaN for none),
    ``p_click (A,)`` (stored score, neighbours' weighted score, NaN for user-level and none),
    ``neighbors_used (A,)``, ``similarity (A,)`` (neighbours' weighted mean similarity)."""

    user_id: int
    ad_ids: np.ndarray
    path: np.ndarray
    embedding: np.ndarray
    age_s: np.ndarray
    p_click: np.ndarray
    neighbors_used: np.ndarray
    similarity: np.ndarray
    neighbor_ids: np.ndarray
    model_version: str

    def __len__(self) -> int:
        return len(self.ad_ids)

    def path_names(self) -> list[str]:
        return [PATHS[p] for p in self.path.tolist()]

    def counts(self) -> dict[str, int]:
        """Answers per path, every path named."""
        found = np.bincount(self.path.astype(np.int64), minlength=len(PATHS))
        return {name: int(found[i]) for i, name in enumerate(PATHS)}

    def answers(self) -> list[Answer]:
        def opt(x: float) -> float | None:
            return None if np.isnan(x) else float(x)

        return [
            Answer(
                self.user_id,
                int(ad),
                PATHS[p],
                None if p == FallbackPath.NONE else self.embedding[j],
                opt(self.age_s[j]),
                opt(self.p_click[j]),
                int(self.neighbors_used[j]),
                opt(self.similarity[j]),
            )
            for j, (ad, p) in enumerate(zip(self.ad_ids.tolist(), self.path.tolist(), strict=True))
        ]

    def to_arrow(self) -> pa.Table:
        """One row per ad: user_id, ad_id, path, age_s, p_click, neighbors_used, similarity, embedding."""
        dim = self.embedding.shape[1]
        none = self.path == FallbackPath.NONE
        flat = pa.array(np.nan_to_num(self.embedding).reshape(-1), pa.float32())
        return pa.table(
            {
                "user_id": pa.array(np.full(len(self), self.user_id, np.int64)),
                "ad_id": pa.array(self.ad_ids),
                "path": pa.array([PATHS[p] for p in self.path.tolist()], pa.string()),
                "age_s": pa.array(self.age_s, pa.float64(), mask=np.isnan(self.age_s)),
                "p_click": pa.array(self.p_click, pa.float32(), mask=np.isnan(self.p_click)),
                "neighbors_used": pa.array(self.neighbors_used.astype(np.int32)),
                "similarity": pa.array(self.similarity, pa.float32(), mask=np.isnan(self.similarity)),
                "embedding": pa.FixedSizeListArray.from_arrays(flat, dim, mask=pa.array(none)),
            }
        )


@contextmanager
def _one_omp_thread() -> Iterator[None]:
    """Search one query on the calling thread only: waking (and then spinning) faiss's OpenMP team
    for a single query costs more than it saves and makes the latency tail follow the machine's load.
    ``omp_set_num_threads`` sets the calling thread's setting only, so batch searches on other threads
    keep theirs; this one's is restored on exit."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


class Resolver:
    """Resolve (user, candidate ads) requests against a store and a user index; see the module docstring."""

    def __init__(
        self, store: OnlineStore, index: UserIndex, config: ResolverConfig | None = None, clock: Clock | None = None
    ) -> None:
        self.store = store
        self.index = index
        self.config = config or ResolverConfig()
        self.clock: Clock = clock or time.time

    @property
    def model_version(self) -> str:
        return self.index.model_version

    def _neighbors(self, user_id: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.config.allows(FallbackPath.SIMILAR_USERS) or len(self.index) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        with _one_omp_thread():
            found = self.index.neighbors(np.array([user_id], dtype=np.int64), self.config.k)
        keep = found.user_ids[0] >= 0
        return found.user_ids[0][keep], found.similarity[0][keep]

    def _check(self, result: ReadResult, what: str) -> None:
        versions = {v for v in result.model_version[result.found].tolist()}
        wrong = sorted(versions - {self.model_version})
        if wrong:
            raise VersionMismatchError(
                f"the store holds {what} of model_version {wrong[:3]} but the index was built from "
                f"{self.model_version!r}; rebuild the index from the same precompute output as the store"
            )
        if result.found.any() and result.codes.shape[1] != self.index.dim:
            raise DimensionMismatchError(
                f"the store's {what} have {result.codes.shape[1]} dims, the index expects {self.index.dim}"
            )

    def _rows(self, result: ReadResult, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), D)`` float32 embeddings of found ``rows`` only (decoding all of a wide read is the
        resolver's largest cost when few rows are needed)."""
        values = result.codes[rows].astype(np.float32)
        scale = result.embedding_scale[rows]
        if not np.isnan(scale).all():
            values *= np.where(np.isnan(scale), 1.0, scale)[:, None]
        return values

    def _ages(self, result: ReadResult, now_s: float) -> np.ndarray:
        return np.where(result.found, now_s - result.computed_at_ms / 1000.0, np.nan)

    def resolve(
        self, user_id: int, ad_ids: Sequence[int] | np.ndarray, *, model_version: str | None = None
    ) -> Resolution:
        """Answer every ad of one request: one index search and one store round trip (with
        ``neighbor_reads="auto"``, a second, smaller one only when the user-level representation
        predicted usable was not)."""
        if model_version is not None and model_version != self.model_version:
            raise VersionMismatchError(
                f"the request asks for model_version {model_version!r}, the index serves {self.model_version!r}"
            )
        ads = np.asarray(ad_ids, dtype=np.int64)
        if ads.ndim != 1:
            raise TypeError(f"ad_ids: expected a 1-D sequence of ints, got shape {ads.shape}")
        user = int(user_id)
        neighbor_ids, similarity = self._neighbors(user)
        prefetch = self.config.neighbor_reads == "always" or not self.config.allows(FallbackPath.SAME_USER)
        read = self.store.read_for_request(user, ads, neighbor_ids if prefetch else ())
        self._check(read.pairs, "pair records")
        self._check(read.user, "user records")
        now_s = self.clock()
        if prefetch:
            self._check(read.neighbor_pairs, "neighbours' pair records")
            return self._decide(
                user,
                ads,
                neighbor_ids,
                similarity,
                read.pairs,
                read.user,
                (read.neighbor_pairs, np.arange(len(ads))),
                now_s,
            )
        cols = np.flatnonzero(
            self._paths(read.pairs, read.user, np.zeros(len(ads), np.int64), now_s)[0] == FallbackPath.NONE
        )
        if not len(cols) or not len(neighbor_ids):
            return self._decide(
                user, ads, neighbor_ids, similarity, read.pairs, read.user, (read.neighbor_pairs, cols[:0]), now_s
            )
        users, pair_ads, order = pair_grid(neighbor_ids, ads[cols])
        late = self.store.read_arrays(users, pair_ads, np.ones(len(users), dtype=bool), order=order)
        self._check(late, "neighbours' pair records")
        return self._decide(user, ads, neighbor_ids, similarity, read.pairs, read.user, (late, cols), now_s)

    def _paths(
        self, pairs: ReadResult, user: ReadResult, neighbors_used: np.ndarray, now_s: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(path, pair_age, user_age)``: the policy's choice given how many neighbours each ad has."""
        pair_age, user_age = self._ages(pairs, now_s), self._ages(user, now_s)
        path = pick_paths(
            self.config,
            pair_found=pairs.found,
            pair_age=pair_age,
            user_found=bool(user.found[0]),
            user_age=float(user_age[0]),
            neighbors_used=neighbors_used,
        )
        return path, pair_age, user_age

    def _decide(
        self,
        user_id: int,
        ads: np.ndarray,
        neighbor_ids: np.ndarray,
        similarity: np.ndarray,
        pairs: ReadResult,
        user: ReadResult,
        neighbors: tuple[ReadResult, np.ndarray],
        now_s: float,
    ) -> Resolution:
        """Paths and answers; ``neighbors`` = (the neighbours' pair records, row n*C + c for neighbour n
        and ad ``ads[cols[c]]``, and ``cols``)."""
        neighbor_pairs, nb_cols = neighbors
        a, k, c, dim = len(ads), len(neighbor_ids), len(nb_cols), self.index.dim
        nb_age = self._ages(neighbor_pairs, now_s).reshape(k, c)
        nb_ok = neighbor_pairs.found.reshape(k, c) & (nb_age <= self.config.fallback_max_age_s)
        used = np.zeros(a, np.int64)
        used[nb_cols] = (nb_ok & (similarity > 0)[:, None]).sum(axis=0)  # NaN > 0 is False
        path, pair_age, user_age = self._paths(pairs, user, used, now_s)
        embedding = np.full((a, dim), np.nan, np.float32)
        age = np.full(a, np.nan)
        p_click = np.full(a, np.nan, np.float32)
        neighbors_used = np.zeros(a, np.int16)
        mean_similarity = np.full(a, np.nan, np.float32)
        own = np.flatnonzero((path == FallbackPath.EXACT) | (path == FallbackPath.SAME_USER_PAIR))
        if len(own):
            embedding[own], age[own], p_click[own] = self._rows(pairs, own), pair_age[own], pairs.p_click[own]
        level = path == FallbackPath.SAME_USER
        if level.any():
            embedding[level], age[level] = self._rows(user, np.array([0]))[0], user_age[0]
        cols = np.flatnonzero(path[nb_cols] == FallbackPath.SIMILAR_USERS)  # positions within nb_cols
        if len(cols):  # decode only the usable neighbours' rows of the ads that take this path
            rows, usable = np.arange(k)[:, None] * c + cols[None, :], nb_ok[:, cols]
            stack = np.zeros((k, len(cols), dim), np.float32)
            stack[usable] = self._rows(neighbor_pairs, rows[usable])
            blend = blend_neighbors(stack, usable, similarity, nb_age[:, cols], neighbor_pairs.p_click[rows])
            at = nb_cols[cols]
            embedding[at], age[at], p_click[at] = blend.embedding, blend.age_s, blend.p_click
            neighbors_used[at], mean_similarity[at] = blend.used, blend.similarity
        return Resolution(
            user_id,
            ads,
            path,
            embedding,
            age,
            p_click,
            neighbors_used,
            mean_similarity,
            neighbor_ids,
            self.model_version,
        )
