"""Candidate sets like those a retrieval stage hands to ranking (CANDIDATES layout).

Per request (user, surface, time during the period) a list of distinct ads,
drawn without replacement with weights affinity^a * popularity^b (Gumbel top-k:
the noise is the Gumbel perturbation), ordered best first. Active users make more
requests; sizes are lognormal between tens and a few hundred.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipelines.durations import DAY_MS
from pipelines.generator.events import event_ids
from pipelines.generator.world import World, choice_rows
from pipelines.schemas.layouts import CANDIDATES

MIN_ADS = 10
MAX_ADS = 400
_SIZE_MEDIAN = 60.0
_SIZE_SIGMA = 0.75
_AFFINITY_WEIGHT = 1.2
_POPULARITY_WEIGHT = 0.6
_CHUNK_CELLS = 2_000_000  # requests x ads scored at once
_REQUEST_SALT = 0x72657175657374  # "request"


def generate_candidates(world: World, requests: int, rng: np.random.Generator) -> pa.Table:
    """``requests`` candidate sets (CANDIDATES layout), sorted by request_time."""
    if requests < 0:
        raise ValueError(f"requests must be non-negative, got {requests}")
    users, config = world.users, world.config
    weight = np.sqrt(users.activity)
    user = np.sort(rng.choice(config.users, size=requests, p=weight / weight.sum()))
    surface = choice_rows(users.surface_probs[user], rng).astype(np.int8)
    time = config.start_ms + rng.integers(1, config.days * DAY_MS, size=requests)
    n_ads = world.items.num_ads
    sizes = np.clip(np.rint(rng.lognormal(np.log(_SIZE_MEDIAN), _SIZE_SIGMA, requests)), MIN_ADS, MAX_ADS)
    sizes = np.minimum(sizes, n_ads).astype(np.int64)
    ads = _retrieve(world, user, sizes, rng)
    order = np.argsort(time, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(sizes)])[order]
    flat = ads[np.repeat(starts, sizes[order]) + _ranks(sizes[order])]
    columns = {
        "request_id": event_ids(config.seed, requests, _REQUEST_SALT),
        "user_id": pa.array(users.user_id[user[order]]),
        "surface": pa.array(surface[order]),
        "request_time": pa.array(time[order]).cast(pa.timestamp("ms", tz="UTC")),
        "ad_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
    }
    return pa.table(columns).cast(CANDIDATES.with_metadata())


def _ranks(sizes: np.ndarray) -> np.ndarray:
    """0, 1, ..., size-1 for each size, concatenated."""
    total = int(sizes.sum())
    return np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def score_ads(world: World, user: np.ndarray, ad: np.ndarray) -> np.ndarray:
    """``(len(user), len(ad))`` float32: log of the retrieval weight affinity^a * popularity^b of each
    ad (item index) for each user (user index)."""
    items = world.items
    log_prior = (_POPULARITY_WEIGHT * np.log(items.popularity[ad])).astype(np.float32)
    log_interest = _AFFINITY_WEIGHT * np.log(np.maximum(world.users.interest[user], 1e-6))  # (r, C) float32
    return log_interest[:, items.category[ad]] + log_prior


def _retrieve(world: World, user: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Ad ids for every request, concatenated in request order, best first within each."""
    items = world.items
    ad = np.flatnonzero(items.is_ad)
    chunk = max(1, _CHUNK_CELLS // len(ad))
    out: list[np.ndarray] = []
    for lo in range(0, len(user), chunk):
        rows, k = user[lo : lo + chunk], sizes[lo : lo + chunk]
        # log w - log E with E ~ Exp(1) is log w + Gumbel noise: top-k = weighted draw without replacement
        exponential = rng.standard_exponential(size=(len(rows), len(ad)), dtype=np.float32)
        noise = np.log(np.maximum(exponential, np.float32(1e-30)))
        score = score_ads(world, rows, ad) - noise
        top = int(k.max())
        best = np.argpartition(-score, top - 1, axis=1)[:, :top]
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(score, best, axis=1), axis=1), axis=1)
        keep = np.arange(top)[None, :] < k[:, None]
        out.append(items.item_id[ad[best[keep]]])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
