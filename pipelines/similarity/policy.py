"""The fallback policy as pure numpy: which path each candidate takes, and the neighbour blend.

For each (user, ad), in order (a path can be switched off in :class:`ResolverConfig`):

==================  ============================================================================
``exact``           the (user, ad) representation, at most ``max_age_s`` old
``same_user_pair``  the same (user, ad) record, older, but at most ``fallback_max_age_s`` old
``same_user``       the user-level representation, at most ``fallback_max_age_s`` old
``similar_users``   the k nearest users' (neighbour, ad) representations, each at most
                    ``fallback_max_age_s`` old, weighted by similarity (> 0); at least
                    ``min_neighbors`` of them
``none``            nothing usable
==================  ============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np

from pipelines.errors import ConfigError
from pipelines.settings import FALLBACK_MAX_AGE, MAX_AGE

__all__ = ["PATHS", "FallbackPath", "NeighborBlend", "ResolverConfig", "blend_neighbors", "pick_paths"]


class FallbackPath(IntEnum):
    """Where an answer came from (stored as int8 codes; names via :data:`PATHS`)."""

    EXACT = 0
    SAME_USER_PAIR = 1
    SAME_USER = 2
    SIMILAR_USERS = 3
    NONE = 4


PATHS: tuple[str, ...] = ("exact", "same_user_pair", "same_user", "similar_users", "none")
FALLBACKS: tuple[str, ...] = PATHS[1:4]


@dataclass(frozen=True)
class ResolverConfig:
    """Bounds and knobs of the resolver (seconds). ``paths``: the fallbacks allowed, in policy order.

    ``neighbor_reads``: ``always`` reads the neighbours' pairs in the request's one store round
    trip (k x A extra keys); ``auto`` leaves them out while the ``same_user`` path is on (the
    user-level representation then answers every ad it can) and reads them, for the ads still
    unanswered, in a second trip only when that representation turns out missing or too old.
    Both give the same answers.
    """

    max_age_s: float = MAX_AGE.seconds
    fallback_max_age_s: float = FALLBACK_MAX_AGE.seconds
    k: int = 10
    min_neighbors: int = 1
    paths: tuple[str, ...] = FALLBACKS
    neighbor_reads: Literal["always", "auto"] = "always"

    def __post_init__(self) -> None:
        if not self.max_age_s > 0:
            raise ConfigError("--max-age", f"got {self.max_age_s}", "pass a positive duration such as 1h")
        if self.fallback_max_age_s < self.max_age_s:
            raise ConfigError(
                "--fallback-max-age",
                f"{self.fallback_max_age_s} s is below --max-age {self.max_age_s} s",
                "pass a bound at least as long as --max-age",
            )
        if self.k < 1 or self.min_neighbors < 1 or self.min_neighbors > self.k:
            raise ConfigError(
                "--k", f"k={self.k}, min_neighbors={self.min_neighbors}", "pass k >= 1 and 1 <= --min-neighbors <= k"
            )
        if self.neighbor_reads not in ("always", "auto"):
            raise ConfigError("--neighbor-reads", f"got {self.neighbor_reads!r}", "pass always or auto")
        unknown = sorted(set(self.paths) - set(FALLBACKS))
        if unknown:
            raise ConfigError("--paths", f"unknown fallback path(s) {unknown}", f"use some of {list(FALLBACKS)}")

    def allows(self, path: FallbackPath) -> bool:
        return path == FallbackPath.EXACT or PATHS[path] in self.paths


@dataclass(frozen=True)
class NeighborBlend:
    """Per ad: ``embedding (A, D)`` the similarity-weighted mean (NaN rows where none usable),
    ``used (A,)`` neighbours used, ``similarity (A,)`` their weighted mean similarity,
    ``age_s (A,)`` the oldest used, ``p_click (A,)`` the weighted mean score."""

    embedding: np.ndarray
    used: np.ndarray
    similarity: np.ndarray
    age_s: np.ndarray
    p_click: np.ndarray


def blend_neighbors(
    embedding: np.ndarray, usable: np.ndarray, similarity: np.ndarray, age_s: np.ndarray, p_click: np.ndarray
) -> NeighborBlend:
    """Blend neighbours' pair representations per ad.

    ``embedding (K, A, D)``, ``usable (K, A)`` bool, ``similarity (K,)``, ``age_s (K, A)``,
    ``p_click (K, A)``. Neighbours with similarity <= 0 (or NaN) never count.
    """
    sim = np.nan_to_num(np.asarray(similarity, dtype=np.float32), nan=0.0)
    weight = np.where(usable & (sim[:, None] > 0), sim[:, None], 0.0).astype(np.float32)  # (K, A)
    total = weight.sum(axis=0)  # (A,)
    used = (weight > 0).sum(axis=0)
    safe = np.where(total > 0, total, 1.0)
    values = np.where(np.isnan(embedding), 0.0, embedding).astype(np.float32, copy=False)
    emb = np.matmul(weight.T[:, None, :], values.transpose(1, 0, 2))[:, 0, :] / safe[:, None]  # (A, D)
    emb[total <= 0] = np.nan
    mean_sim = np.where(total > 0, (weight * sim[:, None]).sum(axis=0) / safe, np.nan)
    ages = np.where(weight > 0, age_s, -np.inf).max(axis=0) if len(weight) else np.full(weight.shape[1], -np.inf)
    score = (weight * np.where(np.isnan(p_click), 0.0, p_click)).sum(axis=0) / safe
    return NeighborBlend(
        emb.astype(np.float32),
        used.astype(np.int16),
        mean_sim.astype(np.float32),
        np.where(total > 0, ages, np.nan),
        np.where(total > 0, score, np.nan).astype(np.float32),
    )


def pick_paths(
    config: ResolverConfig,
    *,
    pair_found: np.ndarray,
    pair_age: np.ndarray,
    user_found: bool | np.ndarray,
    user_age: float | np.ndarray,
    neighbors_used: np.ndarray,
) -> np.ndarray:
    """``(A,) int8`` path codes (:class:`FallbackPath`) from what the store returned (ages in seconds).

    ``user_found`` / ``user_age``: one request's user-level record (scalars), or one per row ``(A,)``
    when the rows are examples of many users (:func:`pipelines.transfer.asof.resolve_paths`)."""
    n = len(pair_found)
    path = np.full(n, FallbackPath.NONE, dtype=np.int8)
    with np.errstate(invalid="ignore"):  # NaN ages (nothing found) compare False
        user_ok = np.asarray(user_found, bool) & (np.asarray(user_age, np.float64) <= config.fallback_max_age_s)
    options = [
        (FallbackPath.SIMILAR_USERS, np.asarray(neighbors_used) >= config.min_neighbors),
        (FallbackPath.SAME_USER, np.broadcast_to(user_ok, (n,))),
        (FallbackPath.SAME_USER_PAIR, pair_found & (pair_age <= config.fallback_max_age_s)),
        (FallbackPath.EXACT, pair_found & (pair_age <= config.max_age_s)),
    ]
    for code, ok in options:  # lowest priority first; later (better) paths overwrite
        if config.allows(code):
            path[ok] = code
    return path
