"""Representation snapshots computed by the GEM model, and the as-of features built from them.

:func:`compute_snapshots` runs the model's inference path on the entries a
:class:`~pipelines.transfer.asof.SnapshotKeys` plan asks for: each (user, ad, tick) is a
one-ad candidate request at the tick, cut by the precompute stage's own batch builder
(events strictly before the tick), so a snapshot is what the precompute stage would have
written at that moment. :func:`asof_features` joins examples to them
(:func:`~pipelines.transfer.asof.asof_join`) and resolves what serving would hand the
downstream model (:func:`~pipelines.transfer.asof.resolve_paths`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.similarity.model_reps import PairQueries, pair_reps
from pipelines.similarity.policy import PATHS, FallbackPath, ResolverConfig
from pipelines.transfer.asof import NO_AD, SnapshotKeys, asof_join, covered_pairs, plan_snapshots, resolve_paths

__all__ = ["AsOfSetting", "RepFeatures", "Snapshots", "asof_features", "compute_snapshots", "examples_asof"]


@dataclass(frozen=True)
class Snapshots:
    """``S`` computed representations: ``user_id, ad_id, computed_at_ms (S,) int64`` (ad -1 =
    user-level) and ``embedding (S, R) float32`` (the user representation for user-level rows, the
    pair representation for pair rows)."""

    user_id: np.ndarray
    ad_id: np.ndarray
    computed_at_ms: np.ndarray
    embedding: np.ndarray

    def __len__(self) -> int:
        return len(self.user_id)


def compute_snapshots(model: GemModel, index: HistoryIndex, keys: SnapshotKeys) -> Snapshots:
    """Run the model on every entry of ``keys``; user-level rows give the user representation,
    pair rows the pair representation (float16-rounded, as the store keeps them)."""
    user_rows = np.flatnonzero(keys.ad_id == NO_AD)
    pair_rows = np.flatnonzero(keys.ad_id != NO_AD)
    dim = model.config.representation_dim
    embedding = np.zeros((len(keys), dim), np.float32)
    for rows, user_level in ((user_rows, True), (pair_rows, False)):
        if not len(rows):
            continue
        k = keys.take(rows)
        q = PairQueries(k.user_id, k.ad_id, k.advertiser_id, k.category, k.surface)
        got = pair_reps(model, index, q, k.tick_ms, user_level=user_level)
        embedding[rows] = got.user if user_level else got.pair
    embedding = embedding.astype(np.float16).astype(np.float32)
    return Snapshots(keys.user_id.copy(), keys.ad_id.copy(), keys.tick_ms.copy(), embedding)


@dataclass(frozen=True)
class RepFeatures:
    """What serving hands the downstream model for N examples: ``user (N, R)`` the as-of user-level
    representation (zeros where none), ``pair (N, R)`` the resolved pair slot (the exact or an older
    pair representation, or the user representation on the same-user path, zeros for none),
    ``path (N,) int8`` (:class:`FallbackPath`), ``user_age_s, pair_age_s (N,)`` (NaN where none)."""

    user: np.ndarray
    pair: np.ndarray
    path: np.ndarray
    user_age_s: np.ndarray
    pair_age_s: np.ndarray

    def path_counts(self) -> dict[str, int]:
        found = np.bincount(self.path.astype(np.int64), minlength=len(PATHS))
        return {name: int(found[i]) for i, name in enumerate(PATHS)}

    def take(self, rows: np.ndarray) -> RepFeatures:
        return RepFeatures(
            self.user[rows], self.pair[rows], self.path[rows], self.user_age_s[rows], self.pair_age_s[rows]
        )


def asof_features(
    user_id: np.ndarray,
    ad_id: np.ndarray,
    times_ms: np.ndarray,
    snapshots: Snapshots,
    policy: ResolverConfig,
    *,
    lag_ms: int = 0,
) -> RepFeatures:
    """Join each example ``(N,)`` to the newest user-level and pair snapshots computed strictly
    before ``t - lag_ms`` and resolve the pair slot through the fallback policy."""
    n = len(user_id)
    user_join = asof_join(
        user_id,
        np.full(n, NO_AD, np.int64),
        times_ms,
        snapshots.user_id,
        snapshots.ad_id,
        snapshots.computed_at_ms,
        lag_ms=lag_ms,
    )
    pair_join = asof_join(
        user_id, ad_id, times_ms, snapshots.user_id, snapshots.ad_id, snapshots.computed_at_ms, lag_ms=lag_ms
    )
    user_age = np.where(user_join.found, user_join.age_ms / 1000.0, np.nan)
    pair_age = np.where(pair_join.found, pair_join.age_ms / 1000.0, np.nan)
    path = resolve_paths(
        policy, pair_found=pair_join.found, pair_age_s=pair_age, user_found=user_join.found, user_age_s=user_age
    )
    dim = snapshots.embedding.shape[1]
    user = np.zeros((n, dim), np.float32)
    user[user_join.found] = snapshots.embedding[user_join.row[user_join.found]]
    pair = np.zeros((n, dim), np.float32)
    own = (path == FallbackPath.EXACT) | (path == FallbackPath.SAME_USER_PAIR)
    pair[own] = snapshots.embedding[pair_join.row[own]]
    level = path == FallbackPath.SAME_USER
    pair[level] = user[level]
    slot_age = np.where(own, pair_age, np.where(level, user_age, np.nan))
    return RepFeatures(user, pair, path, np.where(user_join.found, user_age, np.nan), slot_age)


@dataclass(frozen=True)
class AsOfSetting:
    """How one set of as-of features is made: snapshots every ``cadence_ms`` of event time, read by an
    example at ``t`` only if computed strictly before ``t - lag_ms``; pairs covered by the funnel's
    candidate sets with probability ``coverage``; the fallback ``policy``."""

    name: str
    cadence_ms: int
    lag_ms: int
    coverage: float
    policy: ResolverConfig


def _ints(examples: pa.Table, name: str) -> np.ndarray:
    column = pc.fill_null(examples.column(name), -1)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), np.int64)


def examples_asof(
    model: GemModel, index: HistoryIndex, examples: pa.Table, setting: AsOfSetting, seed: int = 0
) -> RepFeatures:
    """As-of representation features of ``examples`` (TRAINING_EXAMPLE rows): plan the snapshots they
    may read, compute them with ``model`` over ``index``'s histories, join and resolve."""
    user, ad, t = _ints(examples, "user_id"), _ints(examples, "item_id"), _ints(examples, "event_time")
    covered = covered_pairs(user, ad, setting.coverage, seed)
    keys = plan_snapshots(
        user,
        ad,
        t,
        _ints(examples, "surface"),
        _ints(examples, "advertiser_id"),
        _ints(examples, "item_category"),
        cadence_ms=setting.cadence_ms,
        lag_ms=setting.lag_ms,
        covered=covered,
    )
    snapshots = compute_snapshots(model, index, keys)
    return asof_features(user, ad, t, snapshots, setting.policy, lag_ms=setting.lag_ms)
