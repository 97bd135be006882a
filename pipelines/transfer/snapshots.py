"""Representation snapshots computed by the GEM model, and the as-of features built from them.

:func:`compute_snapshots` runs the model's inference path on the entries a
:class:`~pipelines.transfer.asof.SnapshotKeys` plan asks for: each (user, ad, tick) is a
one-ad candidate request at the tick, cut by the precompute stage's own batch builder
(events strictly before the tick), so a snapshot is what the precompute stage would have
written at that moment. :func:`asof_features` joins examples to them
(:func:`~pipelines.transfer.asof.asof_join`) and resolves what serving would hand the
downstream model (:func:`~pipelines.transfer.asof.resolve_paths`); :func:`with_similar_users`
takes the chain's similar-users step (:mod:`pipelines.transfer.similar`) for what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.model.reps import PairQueries, pair_reps
from pipelines.similarity.policy import PATHS, FallbackPath, ResolverConfig
from pipelines.similarity.vectors import UserVectors
from pipelines.transfer.asof import (
    NO_AD,
    SnapshotKeys,
    asof_join,
    covered_pairs,
    plan_snapshots,
    resolve_paths,
    snapshot_tick,
)
from pipelines.transfer.similar import (
    ExampleKeys,
    NeighbourSource,
    needs_neighbours,
    similar_paths,
    similar_users,
    stable_sample,
)

__all__ = [
    "AsOfSetting",
    "RepFeatures",
    "Snapshots",
    "asof_features",
    "base_features",
    "compute_snapshots",
    "example_keys",
    "examples_asof",
    "model_neighbours",
    "settings_asof",
    "with_similar_users",
]


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
    pair representation, the user representation on the same-user path, the neighbours' blend on
    the similar-users path, zeros for none),
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

    @classmethod
    def concat(cls, parts: list[RepFeatures]) -> RepFeatures:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__))


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
    candidate sets with probability ``coverage``; the fallback ``policy``; the similar-users index of
    a snapshot holds at most ``index_users`` users (:mod:`pipelines.transfer.similar`)."""

    name: str
    cadence_ms: int
    lag_ms: int
    coverage: float
    policy: ResolverConfig
    index_users: int = 1000

    @property
    def snapshot_plan(self) -> tuple[int, int, float]:
        """Settings with the same plan read the same snapshots (computed once)."""
        return self.cadence_ms, self.lag_ms, self.coverage


def _ints(examples: pa.Table, name: str) -> np.ndarray:
    column = pc.fill_null(examples.column(name), -1)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return np.asarray(column.to_numpy(zero_copy_only=False), np.int64)


def example_keys(examples: pa.Table) -> ExampleKeys:
    """The keys of TRAINING_EXAMPLE rows."""
    return ExampleKeys(
        *(_ints(examples, c) for c in ("user_id", "item_id", "event_time", "surface", "advertiser_id", "item_category"))
    )


def base_features(
    model: GemModel, index: HistoryIndex, keys: ExampleKeys, settings: list[AsOfSetting], seed: int
) -> dict[str, RepFeatures]:
    """Per setting, the as-of features before the similar-users step; snapshots are computed once per plan."""
    out: dict[str, RepFeatures] = {}
    computed: dict[tuple[int, int, float], Snapshots] = {}
    for setting in settings:
        if setting.snapshot_plan not in computed:
            covered = covered_pairs(keys.user_id, keys.ad_id, setting.coverage, seed)
            plan = plan_snapshots(
                keys.user_id,
                keys.ad_id,
                keys.time_ms,
                keys.surface,
                keys.advertiser_id,
                keys.category,
                cadence_ms=setting.cadence_ms,
                lag_ms=setting.lag_ms,
                covered=covered,
            )
            computed[setting.snapshot_plan] = compute_snapshots(model, index, plan)
        snapshots = computed[setting.snapshot_plan]
        out[setting.name] = asof_features(
            keys.user_id, keys.ad_id, keys.time_ms, snapshots, setting.policy, lag_ms=setting.lag_ms
        )
    return out


def model_neighbours(model: GemModel, index: HistoryIndex, setting: AsOfSetting, seed: int = 0) -> NeighbourSource:
    """Snapshots as the GEM model computes them over ``index``'s histories (which must hold every
    user, not one shard's): a tick's pool is every user with an event before it (a stable sample of
    ``setting.index_users``), represented at the tick; pairs are computed once per distinct key."""
    has = np.diff(index.offsets) > 0
    first_ms = np.full(len(has), np.iinfo(np.int64).max, np.int64)
    first_ms[has] = index.event_time[index.offsets[:-1][has]]
    pools: dict[int, UserVectors] = {}

    def pool(tick: int) -> UserVectors:
        if tick not in pools:
            users = stable_sample(index.user_ids[first_ms < tick], setting.index_users)
            none = np.full(len(users), NO_AD, np.int64)
            keys = SnapshotKeys(users, none, np.full(len(users), tick, np.int64), none, none, none)
            snap = compute_snapshots(model, index, keys)
            pools[tick] = UserVectors(
                users, snap.embedding, snap.computed_at_ms, np.full(len(users), model.model_version, dtype=object)
            )
        return pools[tick]

    def pairs(keys: SnapshotKeys) -> np.ndarray:
        cols = np.stack([keys.user_id, keys.ad_id, keys.tick_ms, keys.surface], axis=1)
        _, first, inverse = np.unique(cols, axis=0, return_index=True, return_inverse=True)
        return compute_snapshots(model, index, keys.take(first)).embedding[inverse.reshape(-1)]

    def covered(users: np.ndarray, ads: np.ndarray) -> np.ndarray:
        return covered_pairs(users.reshape(-1), ads.reshape(-1), setting.coverage, seed).reshape(users.shape)

    return NeighbourSource(pool, pairs, covered)


def with_similar_users(
    keys: ExampleKeys, features: RepFeatures, setting: AsOfSetting, source: NeighbourSource
) -> RepFeatures:
    """The similar-users step (:mod:`pipelines.transfer.similar`) for the examples nothing better
    answered whose user has an as-of user-level representation (the query); the rest unchanged."""
    need = needs_neighbours(setting.policy, features.path) & np.isfinite(features.user_age_s)
    if not need.any():
        return features
    tick = snapshot_tick(keys.time_ms, setting.cadence_ms, setting.lag_ms)
    got = similar_users(keys, tick, features.user, need, source, setting.policy)
    path = features.path.copy()
    path[need] = similar_paths(setting.policy, got.used[need])
    took = path == FallbackPath.SIMILAR_USERS
    pair, pair_age = features.pair.copy(), features.pair_age_s.copy()
    pair[took], pair_age[took] = got.embedding[took], got.age_s[took]
    return RepFeatures(features.user, pair, path, features.user_age_s, pair_age)


def settings_asof(
    model: GemModel,
    index: HistoryIndex,
    examples: pa.Table,
    settings: list[AsOfSetting],
    seed: int = 0,
    *,
    neighbours_index: HistoryIndex | None = None,
) -> dict[str, RepFeatures]:
    """As-of representation features of ``examples`` (TRAINING_EXAMPLE rows) for every setting: plan
    the snapshots they may read, compute them with ``model`` over ``index``'s histories, join, resolve,
    and take the similar-users step over ``neighbours_index`` (every user's histories; default ``index``)."""
    keys = example_keys(examples)
    base = base_features(model, index, keys, settings, seed)
    everyone = neighbours_index if neighbours_index is not None else index
    return {
        s.name: with_similar_users(keys, base[s.name], s, model_neighbours(model, everyone, s, seed)) for s in settings
    }


def examples_asof(
    model: GemModel, index: HistoryIndex, examples: pa.Table, setting: AsOfSetting, seed: int = 0
) -> RepFeatures:
    """:func:`settings_asof` for one setting, ``index`` holding every user's histories."""
    return settings_asof(model, index, examples, [setting], seed)[setting.name]
