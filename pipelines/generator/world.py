"""The static part of a world: users with latent interests, advertisers, ads and organic items.

Users belong to interest segments (the ground truth later stages are judged
against): a segment is a sparse distribution over item categories, and a user's
interest vector is mostly their segment's plus a personal part. Activity follows a
power law (lognormal body, Pareto tail), so a few users are very active.
Optionally (``WorldConfig.niche_affinity``) each user also has a niche category they
like but are rarely shown (see ``engagement``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.generator.config import WorldConfig
from pipelines.schemas.enums import EVENT_TYPE_CODE

#: Global popularity of the surfaces (order of ``pipelines.schemas.enums.SURFACES``).
SURFACE_SHARE = np.array([0.22, 0.12, 0.06, 0.04, 0.16, 0.12, 0.07, 0.05, 0.06, 0.03, 0.04, 0.03])
DEVICE_SHARE = np.array([0.45, 0.45, 0.10])  # ios, android, web
#: Local hour-of-day weights of session starts (quiet nights, evening peak).
DIURNAL = np.array([2, 1, 1, 1, 1, 2, 4, 6, 7, 6, 6, 6, 7, 6, 6, 6, 7, 8, 9, 10, 10, 9, 7, 4], dtype=np.float64)
OBJECTIVES = np.array(
    [EVENT_TYPE_CODE["conversion"], EVENT_TYPE_CODE["app_install"], EVENT_TYPE_CODE["offsite_conversion"]],
    dtype=np.int8,
)

# Activity: expected events per user per day. Lognormal body below the 99th
# percentile, Pareto tail (exponent ~0.95) above it, capped for the wildest bots.
_BODY_MEDIAN = 2.0
_BODY_SIGMA = 0.8
_TAIL_SHARE = 0.01
_TAIL_ALPHA = 0.9
_MAX_PER_DAY = 4_300.0

ORGANIC_ID_BASE = 1_000_000_000
AD_ID_BASE = 2_000_000_000
ADVERTISER_ID_BASE = 5_000


@dataclass(frozen=True)
class Users:
    """Per-user arrays, all of length U (index = position, id = ``user_id``)."""

    user_id: np.ndarray  # (U,) int64
    segment: np.ndarray  # (U,) int32
    interest: np.ndarray  # (U, C) float32, rows sum to 1
    surface_probs: np.ndarray  # (U, S) float64, rows sum to 1
    preferred_surface: np.ndarray  # (U,) int8
    device: np.ndarray  # (U,) int8, the user's main device
    activity: np.ndarray  # (U,) float64, expected events per day
    tz_hours: np.ndarray  # (U,) int64, local time = UTC + tz_hours
    niche: np.ndarray  # (U,) int32, the user's niche category, -1 without niche interests


@dataclass(frozen=True)
class Items:
    """Ads first, then organic items; arrays of length I."""

    item_id: np.ndarray  # (I,) int64
    is_ad: np.ndarray  # (I,) bool
    advertiser_id: np.ndarray  # (I,) int64, -1 for organic
    objective: np.ndarray  # (I,) int8 conversion event type of the ad's advertiser, -1 for organic
    category: np.ndarray  # (I,) int32
    popularity: np.ndarray  # (I,) float64, sums to 1 within ads and within organic
    quality: np.ndarray  # (I,) float32, a logit offset on engagement

    @property
    def num_ads(self) -> int:
        return int(self.is_ad.sum())


@dataclass(frozen=True)
class World:
    config: WorldConfig
    users: Users
    items: Items
    category_share: np.ndarray  # (C,) float64, global category popularity


def build_world(config: WorldConfig, rng: np.random.Generator) -> World:
    """Draw users, advertisers and items for ``config``."""
    category_share = rng.dirichlet(np.full(config.categories, 2.0))
    users = _build_users(config, category_share, rng)
    items = _build_items(config, category_share, rng)
    return World(config, users, items, category_share)


def _build_users(config: WorldConfig, category_share: np.ndarray, rng: np.random.Generator) -> Users:
    n, c, s = config.users, config.categories, config.segments
    # Segment centres: sparse distributions over categories, tilted to popular ones.
    centres = rng.dirichlet(np.full(c, 0.12), size=s) * 0.85 + category_share * 0.15
    segment_size = rng.dirichlet(np.full(s, 3.0))
    segment = rng.choice(s, size=n, p=segment_size).astype(np.int32)
    personal = rng.dirichlet(np.full(c, 0.3), size=n)
    interest = (0.75 * centres[segment] + 0.25 * personal).astype(np.float32)
    interest /= interest.sum(axis=1, keepdims=True)

    segment_surfaces = rng.dirichlet(SURFACE_SHARE * 30.0, size=s)
    preferred = choice_rows(segment_surfaces[segment], rng).astype(np.int8)
    surface_probs = 0.5 * segment_surfaces[segment]
    surface_probs[np.arange(n), preferred] += 0.5
    return Users(
        user_id=np.arange(1, n + 1, dtype=np.int64),
        segment=segment,
        interest=interest,
        surface_probs=surface_probs,
        preferred_surface=preferred,
        device=rng.choice(len(DEVICE_SHARE), size=n, p=DEVICE_SHARE).astype(np.int8),
        activity=_activity_per_day(n, rng),
        tz_hours=rng.choice(np.array([-8, -5, 0, 1, 3, 5, 8, 9]), size=n),
        # their least interesting category (no random draw: the default world stays byte for byte)
        niche=(interest.argmin(axis=1) if config.niche_affinity else np.full(n, -1)).astype(np.int32),
    )


def _activity_per_day(n: int, rng: np.random.Generator) -> np.ndarray:
    """Expected events per day: lognormal body, Pareto tail for the top 1% of users.

    The tail uses stratified quantiles, so the few power users (and the total)
    are stable across seeds instead of hinging on one lucky draw.
    """
    z = np.minimum(rng.standard_normal(n), 2.326)  # body clipped at its 99th percentile
    activity = _BODY_MEDIAN * np.exp(_BODY_SIGMA * z)
    tail_n = max(1, round(n * _TAIL_SHARE))
    tail_users = rng.choice(n, size=tail_n, replace=False)
    threshold = _BODY_MEDIAN * np.exp(_BODY_SIGMA * 2.326)
    rank = rng.permutation(tail_n)
    upper = (rank + rng.random(tail_n)) / tail_n  # stratified quantile within the tail
    tail = threshold * np.power(1.0 - upper, -1.0 / _TAIL_ALPHA)
    activity[tail_users] = np.minimum(tail, _MAX_PER_DAY)
    return activity


def choice_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of ``probs`` (N, K) -> (N,) int64."""
    cumulative = probs.cumsum(axis=1)
    draws = rng.random(len(probs)) * cumulative[:, -1]
    return np.minimum((cumulative < draws[:, None]).sum(axis=1), probs.shape[1] - 1)


def _build_items(config: WorldConfig, category_share: np.ndarray, rng: np.random.Generator) -> Items:
    n_ads, n_org, n_adv = config.num_ads, config.num_organic, config.num_advertisers
    c = config.categories
    # Each advertiser works in a few categories; the first C cover every category.
    adv_categories = rng.choice(c, size=(n_adv, 3), p=category_share)
    adv_categories[:c, 0] = rng.permutation(c)
    adv_objective = rng.choice(OBJECTIVES, size=n_adv, p=[0.4, 0.3, 0.3])
    # Every advertiser has at least one ad (in its main category); the rest follow a Zipf law.
    adv_weight = 1.0 / np.arange(1, n_adv + 1) ** 0.8
    extra = rng.choice(n_adv, size=n_ads - n_adv, p=adv_weight / adv_weight.sum())
    ad_adv = np.concatenate([np.arange(n_adv), extra])
    which = np.where(np.arange(n_ads) < n_adv, 0, rng.choice(3, size=n_ads, p=[0.6, 0.25, 0.15]))
    ad_category = adv_categories[ad_adv, which]
    # Organic items: the first C cover every category, the rest follow category popularity.
    org_category = np.concatenate([np.arange(min(c, n_org)), rng.choice(c, size=max(0, n_org - c), p=category_share)])
    popularity = rng.lognormal(0.0, 1.3, size=n_ads + n_org)
    popularity[:n_ads] /= popularity[:n_ads].sum()
    popularity[n_ads:] /= popularity[n_ads:].sum()
    return Items(
        item_id=np.concatenate([AD_ID_BASE + np.arange(n_ads), ORGANIC_ID_BASE + np.arange(n_org)]).astype(np.int64),
        is_ad=np.arange(n_ads + n_org) < n_ads,
        advertiser_id=np.concatenate([ADVERTISER_ID_BASE + ad_adv, np.full(n_org, -1)]).astype(np.int64),
        objective=np.concatenate([adv_objective[ad_adv], np.full(n_org, -1)]).astype(np.int8),
        category=np.concatenate([ad_category, org_category]).astype(np.int32),
        popularity=popularity,
        quality=rng.normal(0.0, 0.35, size=n_ads + n_org).astype(np.float32),
    )
