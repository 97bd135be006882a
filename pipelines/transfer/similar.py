"""The similar-users step of the fallback chain, point-in-time.

Serving (:class:`pipelines.similarity.resolver.Resolver`) takes this path when a (user, ad) has
no usable pair and no usable user-level representation: it searches the user index for the
user's ``k`` nearest other users (the query is the user's vector at its index position), reads
each neighbour's (neighbour, ad) pair record, keeps those at most ``fallback_max_age_s`` old, and
blends them weighted by similarity (> 0) when at least ``min_neighbors`` are usable
(:func:`pipelines.similarity.policy.blend_neighbors`). Here the same, for an example at ``t``
that reads snapshot tick ``T`` (strictly before ``t - lag``):

- the index of tick ``T`` is built (:func:`pipelines.similarity.build.build_index`, the serving
  index code, FAISS on a GPU when present) from that snapshot's user-level representations only:
  every user with a history before ``T`` (at most ``index_users`` of them, a stable hash sample
  that does not depend on the examples), each computed at ``T``;
- the query is the example's user's newest user-level representation computed strictly before
  ``t - lag`` (its as-of user feature, of any age: the vector a serving index, built from each
  user's newest row, holds at the user's position); the user itself is never its own neighbour;
- each neighbour's (neighbour, ad) representation is the one snapshot ``T`` holds: computed at
  ``T``, and only for pairs the funnel covered (``covered``), as for the example's own pairs.

Nothing computed at or after ``T`` (so none after the impression) reaches an example this way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.build import BuildSpec, build_index
from pipelines.similarity.policy import FallbackPath, ResolverConfig, blend_neighbors
from pipelines.similarity.user_index import UserIndex
from pipelines.similarity.vectors import UserVectors
from pipelines.transfer.asof import SnapshotKeys, resolve_paths

__all__ = ["ExampleKeys", "NeighbourSource", "similar_users", "snapshot_index", "stable_sample"]


@dataclass(frozen=True)
class ExampleKeys:
    """N examples: ``user_id, ad_id, time_ms, surface, advertiser_id, category (N,) int64``."""

    user_id: np.ndarray
    ad_id: np.ndarray
    time_ms: np.ndarray
    surface: np.ndarray
    advertiser_id: np.ndarray
    category: np.ndarray

    def __len__(self) -> int:
        return len(self.user_id)


@dataclass(frozen=True)
class NeighbourSource:
    """What a snapshot holds: ``pool(T)`` its user-level representations (``computed_at_ms == T``),
    ``pairs(keys)`` the ``(M, R)`` pair representations of ``keys`` computed at ``keys.tick_ms``,
    ``covered(users, ads)`` whether the funnel covered each pair (so the snapshot computed it)."""

    pool: Callable[[int], UserVectors]
    pairs: Callable[[SnapshotKeys], np.ndarray]
    covered: Callable[[np.ndarray, np.ndarray], np.ndarray]
    gpu: ops.GpuMode = "auto"


def stable_sample(user_ids: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` of ``user_ids``: those of the smallest stable hash (the same user is in or
    out whatever else is in the list), in input order."""
    ids = np.asarray(user_ids, np.int64)
    if len(ids) <= limit:
        return ids
    mixed = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mixed ^= mixed >> np.uint64(31)
    keep = np.sort(np.argsort(mixed, kind="stable")[:limit])
    return ids[keep]


def snapshot_index(pool: UserVectors, gpu: ops.GpuMode = "auto") -> UserIndex:
    """A user index of one snapshot's user-level representations, built as ``python -m pipelines
    index`` builds one (factory ``auto``, inner product), with no recall tuning (Flat is exact)."""
    return UserIndex.from_built(
        build_index(pool, BuildSpec(gpu=gpu, tune_queries=0), model_version="", log_level=logging.DEBUG)
    )


def _neighbour_keys(keys: ExampleKeys, rows: np.ndarray, found: np.ndarray, tick: int) -> SnapshotKeys:
    """One key per (row, neighbour column) with a neighbour: (neighbour, the row's ad) at ``tick``."""
    r, c = np.nonzero(found >= 0)
    src = rows[r]
    return SnapshotKeys(
        user_id=found[r, c],
        ad_id=keys.ad_id[src],
        tick_ms=np.full(len(src), tick, np.int64),
        surface=keys.surface[src],
        advertiser_id=keys.advertiser_id[src],
        category=keys.category[src],
    )


@dataclass(frozen=True)
class NeighbourAnswer:
    """Per example: ``embedding (N, R)`` the blend (NaN rows where none), ``used (N,)`` neighbours
    blended, ``age_s (N,)`` the oldest used one's age at the impression (NaN where none)."""

    embedding: np.ndarray
    used: np.ndarray
    age_s: np.ndarray


def _blend_tick(
    keys: ExampleKeys,
    rows: np.ndarray,
    query: np.ndarray,
    tick: int,
    source: NeighbourSource,
    policy: ResolverConfig,
    out: NeighbourAnswer,
) -> None:
    """Resolve ``rows`` (examples reading tick ``tick``) through snapshot ``tick``'s index and pairs."""
    pool = source.pool(tick)
    if len(pool) == 0:
        return
    if (pool.computed_at_ms != tick).any():
        raise ValueError(f"the pool of snapshot {tick} holds representations computed at other times")
    index = snapshot_index(pool, source.gpu)
    near = index.nearest(query[rows], policy.k, own=index.positions_of(keys.user_id[rows]))
    found = np.where(
        source.covered(near.user_ids, np.broadcast_to(keys.ad_id[rows][:, None], near.user_ids.shape)),
        near.user_ids,
        -1,
    )
    wanted = _neighbour_keys(keys, rows, found, tick)
    values = source.pairs(wanted) if len(wanted) else np.zeros((0, query.shape[1]), np.float32)
    stack = np.zeros((*found.shape, query.shape[1]), np.float32)  # (rows, K, R)
    stack[found >= 0] = values
    age_s = (keys.time_ms[rows] - tick) / 1000.0
    for j, row in enumerate(rows):
        usable = (found[j] >= 0) & (age_s[j] <= policy.fallback_max_age_s)
        blend = blend_neighbors(
            stack[j][:, None, :],
            usable[:, None],
            near.similarity[j],
            np.full((len(usable), 1), age_s[j]),
            np.full((len(usable), 1), np.nan, np.float32),
        )
        out.embedding[row], out.used[row], out.age_s[row] = blend.embedding[0], blend.used[0], blend.age_s[0]


def similar_users(
    keys: ExampleKeys,
    tick_ms: np.ndarray,
    query: np.ndarray,
    need: np.ndarray,
    source: NeighbourSource,
    policy: ResolverConfig,
) -> NeighbourAnswer:
    """The neighbours' blend for the examples where ``need (N,)`` (their query vector ``query (N, R)``
    exists), each from the snapshot at its ``tick_ms (N,)`` (which must be before its time)."""
    n, dim = query.shape
    out = NeighbourAnswer(np.full((n, dim), np.nan, np.float32), np.zeros(n, np.int64), np.full(n, np.nan))
    need = np.asarray(need, bool)
    if (np.asarray(tick_ms)[need] >= keys.time_ms[need]).any():
        raise ValueError("an example reads a snapshot ticked at or after its impression; pass ticks strictly before")
    for tick in np.unique(tick_ms[need]):
        _blend_tick(keys, np.flatnonzero(need & (tick_ms == tick)), query, int(tick), source, policy, out)
    return out


def similar_paths(policy: ResolverConfig, used: np.ndarray) -> np.ndarray:
    """The path of examples with neither a usable pair nor a usable user-level representation, given
    how many neighbours each blended: the serving policy's own choice (:func:`resolve_paths`)."""
    none = np.zeros(len(used), bool)
    nan = np.full(len(used), np.nan)
    return resolve_paths(policy, pair_found=none, pair_age_s=nan, user_found=none, user_age_s=nan, neighbors_used=used)


def needs_neighbours(policy: ResolverConfig, path: np.ndarray) -> np.ndarray:
    """``(N,) bool``: the examples the similar-users step may answer (nothing better was usable)."""
    return (np.asarray(path) == FallbackPath.NONE) & policy.allows(FallbackPath.SIMILAR_USERS)
