"""What users do with what they see: item choice, reactions and delayed conversions.

An impression shows an ad (at a surface-dependent rate) or an organic item, from
a category drawn from the user's interests (or, now and then, from what is
popular), and within that category by item popularity. Every reaction's
probability is a logistic function of the user-item affinity
(``interest[user, category] * categories``, 1 = indifferent) and the item's
quality, so clicks and likes rise with affinity and hides fall. Ad clicks
convert rarely, minutes to days later, on the same item.

In a world with niche interests (``WorldConfig.niche_affinity``), a further
``niche_exposure`` of impressions show the user's niche category, whose affinity
is ``niche_affinity`` whatever their interest vector says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.generator.sessions import Impressions
from pipelines.generator.world import Items, World
from pipelines.schemas.enums import EVENT_TYPE_CODE

#: Share of impressions that are ads, per surface (order of pipelines.schemas.enums.SURFACES).
AD_RATE = np.array([0.20, 0.15, 0.15, 0.25, 0.20, 0.15, 0.15, 0.15, 0.10, 1.00, 0.10, 0.10])
#: Rate of video views per impression of an organic item, per surface (ads: half).
VIDEO_RATE = np.array([0.10, 0.45, 0.30, 0.01, 0.10, 0.45, 0.30, 0.20, 0.02, 0.15, 0.03, 0.30])
EXPLORE = 0.2  # share of impressions whose category ignores the user's interests
#: Log affinity at which the base rates below hold (a typical impression).
LOG_AFFINITY_REF = 1.5
AUDIENCE_NETWORK = 9  # no dwell time is reported there


@dataclass(frozen=True)
class Reaction:
    """A reaction to an impression: base rates (organic, ad), slope on log affinity, delay."""

    event_type: str
    organic: float
    ad: float
    slope: float
    delay_median_ms: float


REACTIONS: tuple[Reaction, ...] = (
    Reaction("click", 0.030, 0.020, 0.9, 3_000),
    Reaction("like", 0.040, 0.004, 0.8, 5_000),
    Reaction("comment", 0.006, 0.0008, 0.7, 20_000),
    Reaction("share", 0.005, 0.0008, 0.7, 10_000),
    Reaction("save", 0.006, 0.002, 0.6, 6_000),
    Reaction("follow", 0.003, 0.0, 0.9, 8_000),
    Reaction("hide", 0.002, 0.005, -0.5, 3_000),
)
CONVERSION_RATE = 0.15  # per ad click, at the reference affinity
CONVERSION_SLOPE = 0.6
_CONVERSION_DELAY_MEDIAN_MS = 3_600_000.0
_CONVERSION_DELAY_SIGMA = 1.8
_CONVERSION_DELAY_RANGE = (120_000, 14 * 86_400_000)


@dataclass(frozen=True)
class EventColumns:
    """Events as columns that point at their impression; arrays of length E."""

    source: np.ndarray  # (E,) int64 impression index
    event_type: np.ndarray  # (E,) int8
    time_ms: np.ndarray  # (E,) int64
    value: np.ndarray  # (E,) float32, NaN = null


@dataclass(frozen=True)
class Engagement:
    item: np.ndarray  # (N,) int64 item index of each impression
    log_affinity: np.ndarray  # (N,) float64
    events: EventColumns  # impressions and every reaction and conversion


def simulate_engagement(world: World, imp: Impressions, rng: np.random.Generator) -> Engagement:
    """Items for the impressions, then every event they lead to."""
    item = choose_items(world, imp, rng)
    affinity = user_affinity(world, imp.user, world.items.category[item])
    log_affinity = np.log(np.maximum(affinity, 1e-6))
    parts = [_impressions(imp, log_affinity, rng)]
    for reaction in REACTIONS:
        parts.append(_reaction(reaction, world.items, item, imp, log_affinity, rng))
    parts.append(_video_views(world.items, item, imp, log_affinity, rng))
    parts.append(_conversions(world.items, item, parts[1], log_affinity, rng))
    events = EventColumns(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))
    return Engagement(item=item, log_affinity=log_affinity, events=events)


_FIELDS = ("source", "event_type", "time_ms", "value")


def user_affinity(world: World, user: np.ndarray, category: np.ndarray) -> np.ndarray:
    """``(N,)`` float64 affinity of ``user[i]`` to ``category[i]`` (1 = indifferent)."""
    affinity = world.users.interest[user, category].astype(np.float64) * world.config.categories
    if world.config.niche_affinity:
        affinity[world.users.niche[user] == category] = world.config.niche_affinity
    return affinity


def choose_items(world: World, imp: Impressions, rng: np.random.Generator) -> np.ndarray:
    """An item index per impression: ad or organic, category, then popularity."""
    n, c = len(imp), world.config.categories
    is_ad = rng.random(n) < AD_RATE[imp.surface]
    own = sample_rows(world.users.interest, imp.user, rng)
    popular = rng.choice(c, size=n, p=world.category_share)
    category = np.where(rng.random(n) < EXPLORE, popular, own)
    if world.config.niche_affinity:  # no extra draw otherwise: the default world stays byte for byte
        category = np.where(rng.random(n) < world.config.niche_exposure, world.users.niche[imp.user], category)
    items = world.items
    groups = items.is_ad.astype(np.int64) * c + items.category
    return sample_in_groups(items.popularity, groups, is_ad.astype(np.int64) * c + category, rng)


def sample_rows(probs: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A categorical draw from ``probs[rows[i]]`` for each i; probs (R, K) -> (len(rows),)."""
    cumulative = np.cumsum(probs, axis=1, dtype=np.float64)
    cumulative /= cumulative[:, -1:]
    flat = (cumulative + np.arange(len(probs))[:, None]).ravel()
    index = np.searchsorted(flat, rows + rng.random(len(rows)), side="right")
    return np.clip(index - rows * probs.shape[1], 0, probs.shape[1] - 1)


def sample_in_groups(
    weights: np.ndarray, groups: np.ndarray, wanted: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """For each ``wanted`` group, an element of that group drawn by weight (indices into weights).

    Every wanted group must hold at least one element of positive weight.
    """
    order = np.lexsort((np.arange(len(groups)), groups))
    sorted_groups = groups[order]
    within = np.cumsum(weights[order])
    starts = np.searchsorted(sorted_groups, sorted_groups, side="left")
    base = np.concatenate([[0.0], within])[starts]
    totals = np.zeros(int(groups.max()) + 1)
    np.maximum.at(totals, sorted_groups, within - base)
    flat = sorted_groups + (within - base) / totals[sorted_groups]
    position = np.searchsorted(flat, wanted + rng.random(len(wanted)), side="right")
    return order[np.minimum(position, len(order) - 1)]


def _probability(base: np.ndarray, slope: float, centred: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Logistic in log affinity: equals ``base`` at the reference affinity and average quality."""
    safe = np.clip(base, 1e-9, 1 - 1e-9)
    logit = np.log(safe / (1 - safe)) + slope * centred + quality
    return np.where(base > 0, 1.0 / (1.0 + np.exp(-logit)), 0.0)


def _delays(median_ms: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.lognormal(np.log(median_ms), sigma, size=n).astype(np.int64) + 200


def _impressions(imp: Impressions, log_affinity: np.ndarray, rng: np.random.Generator) -> EventColumns:
    """The impressions themselves; value = dwell seconds, longer for affine items."""
    dwell = rng.lognormal(np.log(2.0) + 0.2 * (log_affinity - LOG_AFFINITY_REF), 0.8)
    value = np.round(dwell, 2).astype(np.float32)
    value[imp.surface == AUDIENCE_NETWORK] = np.nan
    n = len(imp)
    kind = np.full(n, EVENT_TYPE_CODE["impression"], dtype=np.int8)
    return EventColumns(np.arange(n), kind, imp.time_ms, value)


def _reaction(
    reaction: Reaction,
    items: Items,
    item: np.ndarray,
    imp: Impressions,
    log_affinity: np.ndarray,
    rng: np.random.Generator,
) -> EventColumns:
    is_ad = items.is_ad[item]
    base = np.where(is_ad, reaction.ad, reaction.organic)
    sign = -1.0 if reaction.slope < 0 else 1.0  # poor items are hidden more
    quality = sign * items.quality[item]
    p = _probability(base, reaction.slope, log_affinity - LOG_AFFINITY_REF, quality)
    source = np.flatnonzero(rng.random(len(item)) < p)
    time = imp.time_ms[source] + _delays(reaction.delay_median_ms, 0.8, len(source), rng)
    kind = np.full(len(source), EVENT_TYPE_CODE[reaction.event_type], dtype=np.int8)
    return EventColumns(source, kind, time, np.full(len(source), np.nan, dtype=np.float32))


def _video_views(
    items: Items, item: np.ndarray, imp: Impressions, log_affinity: np.ndarray, rng: np.random.Generator
) -> EventColumns:
    """Video views on video-heavy surfaces; value = seconds watched."""
    base = VIDEO_RATE[imp.surface] * np.where(items.is_ad[item], 0.5, 1.0)
    centred = log_affinity - LOG_AFFINITY_REF
    p = _probability(base, 0.4, centred, items.quality[item])
    source = np.flatnonzero(rng.random(len(item)) < p)
    watched = rng.lognormal(np.log(8.0) + 0.3 * centred[source], 1.0)
    time = imp.time_ms[source] + _delays(1_500, 0.5, len(source), rng)
    kind = np.full(len(source), EVENT_TYPE_CODE["video_view"], dtype=np.int8)
    return EventColumns(source, kind, time, np.round(watched, 1).astype(np.float32))


def _conversions(
    items: Items, item: np.ndarray, clicks: EventColumns, log_affinity: np.ndarray, rng: np.random.Generator
) -> EventColumns:
    """Rare conversions after ad clicks, minutes to days later, of the advertiser's objective."""
    ad_clicks = np.flatnonzero(items.is_ad[item[clicks.source]])
    source = clicks.source[ad_clicks]
    centred = log_affinity[source] - LOG_AFFINITY_REF
    p = _probability(np.full(len(source), CONVERSION_RATE), CONVERSION_SLOPE, centred, items.quality[item[source]])
    chosen = rng.random(len(source)) < p
    source, click_time = source[chosen], clicks.time_ms[ad_clicks][chosen]
    delay = _delays(_CONVERSION_DELAY_MEDIAN_MS, _CONVERSION_DELAY_SIGMA, len(source), rng)
    time = click_time + np.clip(delay, *_CONVERSION_DELAY_RANGE)
    kind = items.objective[item[source]]
    amount = np.round(rng.lognormal(np.log(35.0), 0.9, size=len(source)), 2).astype(np.float32)
    value = np.where(kind == EVENT_TYPE_CODE["app_install"], np.float32(np.nan), amount)
    return EventColumns(source, kind.astype(np.int8), time, value.astype(np.float32))
