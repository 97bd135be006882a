"""Point-in-time representation features: snapshot plans, the as-of join, the fallback resolution.

Representations are computed as *snapshots*: at each tick of a cadence of event time
(every 6 hours by default), from the histories as they stood strictly before the tick,
with ``computed_at`` = the tick. An example (a labelled impression at time ``t``) may
read only a representation computed **strictly before** ``t`` (minus an optional lag,
to study staleness): the feature store's "historical features" guarantee, for
representations. :func:`asof_join` gives each example the newest such snapshot of its
key and its age; :func:`resolve_paths` then applies the project's fallback policy
(:mod:`pipelines.similarity.policy`) per row, as the serving resolver would (its similar-users
step, which needs a snapshot's user index, is :mod:`pipelines.transfer.similar`).

Everything here is numpy over plain arrays, so the same code runs in a test, in a
notebook and inside the Beam pipeline (:mod:`pipelines.transfer.pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.similarity.policy import ResolverConfig, pick_paths

__all__ = [
    "AsOf",
    "SnapshotKeys",
    "asof_join",
    "covered_pairs",
    "plan_snapshots",
    "resolve_paths",
    "snapshot_tick",
]

NO_AD = -1


def snapshot_tick(times_ms: np.ndarray, cadence_ms: int, lag_ms: int = 0) -> np.ndarray:
    """The newest cadence tick strictly before ``times_ms - lag_ms`` (ticks are multiples of the
    cadence since the epoch): the snapshot an example at ``t`` may read. ``(N,) int64``."""
    if cadence_ms <= 0:
        raise ValueError(f"cadence_ms must be positive, got {cadence_ms}")
    as_of = np.asarray(times_ms, np.int64) - int(lag_ms)
    return ((as_of - 1) // cadence_ms) * cadence_ms


def covered_pairs(user_id: np.ndarray, ad_id: np.ndarray, coverage: float, seed: int = 0) -> np.ndarray:
    """``(N,) bool``: whether the ranking funnel's candidate sets held the (user, ad) pair, so that the
    precompute stage computed its pair representation. A stable hash of the pair against
    ``coverage`` (the same pair is covered at every snapshot or at none)."""
    if not 0.0 <= coverage <= 1.0:
        raise ValueError(f"coverage must be in [0, 1], got {coverage}")
    mixed = (np.asarray(user_id, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        np.asarray(ad_id, np.int64).astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F) + np.uint64(seed)
    )
    mixed ^= mixed >> np.uint64(29)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(32)
    return (mixed % np.uint64(1 << 20)).astype(np.float64) / float(1 << 20) < coverage


@dataclass(frozen=True)
class SnapshotKeys:
    """What to compute: row i is the representation of ``(user_id[i], ad_id[i])`` (ad -1 = user-level)
    as of ``tick_ms[i]`` (from events strictly before it); ``surface[i]`` is the request surface a pair
    is computed for (-1 for user-level rows). Unique by (user, ad, tick)."""

    user_id: np.ndarray
    ad_id: np.ndarray
    tick_ms: np.ndarray
    surface: np.ndarray
    advertiser_id: np.ndarray
    category: np.ndarray

    def __len__(self) -> int:
        return len(self.user_id)

    def take(self, rows: np.ndarray) -> SnapshotKeys:
        return SnapshotKeys(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


def _unique_rows(*cols: np.ndarray) -> np.ndarray:
    """Index of the first row of each distinct tuple of ``cols``, in first-seen order."""
    if not len(cols[0]):
        return np.zeros(0, np.int64)
    stacked = np.stack([np.asarray(c, np.int64) for c in cols], axis=1)
    _, first = np.unique(stacked, axis=0, return_index=True)
    return np.sort(first)


def plan_snapshots(
    user_id: np.ndarray,
    ad_id: np.ndarray,
    times_ms: np.ndarray,
    surface: np.ndarray,
    advertiser_id: np.ndarray,
    category: np.ndarray,
    *,
    cadence_ms: int,
    lag_ms: int = 0,
    covered: np.ndarray | None = None,
) -> SnapshotKeys:
    """The snapshot entries that examples ``(N,)`` can read: for each example, its user's
    user-level representation and (where ``covered``) its (user, ad) pair representation, at the
    newest tick strictly before ``t - lag``. Computing only these gives the as-of join the same
    answer as computing every key at every tick (older ticks of a key are never the newest one
    an example may read), for a fraction of the work."""
    tick = snapshot_tick(times_ms, cadence_ms, lag_ms)
    n = len(tick)
    covered = np.ones(n, bool) if covered is None else np.asarray(covered, bool)
    none = np.full(n, NO_AD, np.int64)
    users = _unique_rows(user_id, tick)
    pairs = np.flatnonzero(covered)[_unique_rows(user_id[covered], ad_id[covered], tick[covered])]

    def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(a, np.int64)[users], np.asarray(b, np.int64)[pairs]])

    return SnapshotKeys(
        user_id=cat(user_id, user_id),
        ad_id=cat(none, ad_id),
        tick_ms=cat(tick, tick),
        surface=cat(none, surface),
        advertiser_id=cat(none, advertiser_id),
        category=cat(none, category),
    )


@dataclass(frozen=True)
class AsOf:
    """Per example: ``row (N,)`` the snapshot row joined (-1 = none before the example) and
    ``age_ms (N,)`` the example's time minus that snapshot's ``computed_at`` (-1 where none)."""

    row: np.ndarray
    age_ms: np.ndarray

    @property
    def found(self) -> np.ndarray:
        return self.row >= 0


def asof_join(
    example_user: np.ndarray,
    example_ad: np.ndarray,
    example_ms: np.ndarray,
    snap_user: np.ndarray,
    snap_ad: np.ndarray,
    snap_computed_ms: np.ndarray,
    *,
    lag_ms: int = 0,
) -> AsOf:
    """Each example's newest snapshot of the same (user, ad) key computed strictly before
    ``example_ms - lag_ms``; its age is measured from ``example_ms`` (the impression).

    Snapshots may come in any order and hold keys no example asks for. Ties (two snapshots of a
    key at the same time) resolve to the later row. ``O((N + S) log(N + S))``.
    """
    ex_u, ex_a = np.asarray(example_user, np.int64), np.asarray(example_ad, np.int64)
    ex_t = np.asarray(example_ms, np.int64) - int(lag_ms)
    sn_u, sn_a = np.asarray(snap_user, np.int64), np.asarray(snap_ad, np.int64)
    sn_t = np.asarray(snap_computed_ms, np.int64)
    n, s = len(ex_u), len(sn_u)
    if s == 0 or n == 0:
        return AsOf(np.full(n, -1, np.int64), np.full(n, -1, np.int64))
    keys = np.stack([np.concatenate([sn_u, ex_u]), np.concatenate([sn_a, ex_a])], axis=1)
    _, key_id = np.unique(keys, axis=0, return_inverse=True)
    key_id = key_id.reshape(-1)
    # snapshots sorted by (key, time, row): the newest strictly before t is the last one below (key, t)
    order = np.lexsort((np.arange(s), sn_t, key_id[:s]))
    sorted_key, sorted_t = key_id[:s][order], sn_t[order]
    ex_key = key_id[s:]
    # one int64 per (key, time) pair: the key's rank times the number of distinct times, plus the time's rank
    times, time_rank = np.unique(np.concatenate([sorted_t, ex_t]), return_inverse=True)
    width = len(times) + 1
    snap_code = sorted_key * width + time_rank[:s]
    ex_code = ex_key * width + time_rank.reshape(-1)[s:]
    pos = np.searchsorted(snap_code, ex_code, side="left") - 1  # last snapshot below (key, t)
    safe = np.maximum(pos, 0)
    ok = (pos >= 0) & (sorted_key[safe] == ex_key)
    row = np.where(ok, order[safe], -1)
    age = np.where(ok, np.asarray(example_ms, np.int64) - sn_t[np.maximum(row, 0)], -1)
    return AsOf(row.astype(np.int64), age.astype(np.int64))


def resolve_paths(
    config: ResolverConfig,
    *,
    pair_found: np.ndarray,
    pair_age_s: np.ndarray,
    user_found: np.ndarray,
    user_age_s: np.ndarray,
    neighbors_used: np.ndarray | None = None,
) -> np.ndarray:
    """``(N,) int8`` :class:`FallbackPath` of each example: the serving resolver's policy
    (:func:`pipelines.similarity.policy.pick_paths`) with one user per row. The exact pair when at
    most ``max_age_s`` old, else the same pair up to ``fallback_max_age_s``, else the same user's
    user-level representation up to ``fallback_max_age_s``, else the similar users' blend when
    ``neighbors_used (N,)`` reaches ``min_neighbors`` (none counted: 0,
    :mod:`pipelines.transfer.similar` takes that step), else none."""
    n = len(pair_found)
    return pick_paths(
        config,
        pair_found=np.asarray(pair_found, bool),
        pair_age=np.asarray(pair_age_s, np.float64),
        user_found=np.asarray(user_found, bool),
        user_age=np.asarray(user_age_s, np.float64),
        neighbors_used=np.zeros(n, np.int64) if neighbors_used is None else np.asarray(neighbors_used),
    )
