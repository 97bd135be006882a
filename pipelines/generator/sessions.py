"""When users browse: sessions (hours apart) made of impressions (seconds apart).

Each user opens a Poisson number of sessions over the period, at local hours
drawn from a diurnal curve; a session stays on one surface and one device and
holds a geometric number of impressions a few seconds apart. Sessions of one user
never overlap: a session that would start before the previous one ended (plus a
short pause) is pushed back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.durations import DAY_MS, HOUR_MS
from pipelines.generator.world import DEVICE_SHARE, DIURNAL, World, choice_rows

#: Share of a user's events that are impressions (the rest are engagement).
IMPRESSION_SHARE = 0.80
_GAP_MEDIAN_MS = 6_000.0  # between impressions of a session
_GAP_SIGMA = 0.9
_MIN_PAUSE_MS = 120_000  # between the end of a session and the next one
_OTHER_DEVICE = 0.08  # share of sessions on a device that is not the user's main one
_UNKNOWN_DEVICE = 0.01  # share of impressions whose device was not reported


@dataclass(frozen=True)
class Impressions:
    """One row per impression, in no particular order; arrays of length N."""

    user: np.ndarray  # (N,) int64 user index
    time_ms: np.ndarray  # (N,) int64
    surface: np.ndarray  # (N,) int8
    device: np.ndarray  # (N,) int8, -1 = not reported

    def __len__(self) -> int:
        return len(self.user)


def simulate_impressions(world: World, rng: np.random.Generator) -> Impressions:
    """Sessions and their impressions for every user of ``world``."""
    users, config = world.users, world.config
    mean_len = np.clip(2.0 + 2.5 * np.sqrt(users.activity), 3.0, 200.0)
    expected = users.activity * config.days * IMPRESSION_SHARE
    n_sessions = rng.poisson(expected / mean_len)
    session_user = np.repeat(np.arange(config.users), n_sessions)
    start = _session_starts(world, session_user, rng)
    order = np.lexsort((start, session_user))
    session_user, start = session_user[order], start[order]
    length = rng.geometric(1.0 / mean_len[session_user])
    offset = _offsets_within(length, rng)
    duration = offset[np.cumsum(length) - 1]
    start = _without_overlap(session_user, start, duration)
    surface = choice_rows(users.surface_probs[session_user], rng).astype(np.int8)
    device = _session_devices(users.device[session_user], rng)
    time_ms = np.repeat(start, length) + offset
    keep = time_ms < config.end_ms
    imp_device = np.repeat(device, length)
    imp_device[rng.random(len(imp_device)) < _UNKNOWN_DEVICE] = -1
    return Impressions(
        user=np.repeat(session_user, length)[keep],
        time_ms=time_ms[keep],
        surface=np.repeat(surface, length)[keep],
        device=imp_device[keep],
    )


def _session_starts(world: World, session_user: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Start times (ms): a uniform day, a diurnal local hour, a uniform second."""
    config, n = world.config, len(session_user)
    day = rng.integers(0, config.days, size=n)
    local_hour = rng.choice(24, size=n, p=DIURNAL / DIURNAL.sum())
    utc_hour = (local_hour - world.users.tz_hours[session_user]) % 24
    within_hour = rng.integers(0, HOUR_MS, size=n)
    return config.start_ms + day * DAY_MS + utc_hour * HOUR_MS + within_hour


def _offsets_within(length: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Milliseconds from the session start to each impression (first one: 0)."""
    total = int(length.sum())
    gaps = rng.lognormal(np.log(_GAP_MEDIAN_MS), _GAP_SIGMA, size=total).astype(np.int64) + 500
    first = np.cumsum(length) - length
    gaps[first] = 0
    cumulative = np.cumsum(gaps)
    return cumulative - np.repeat(cumulative[first], length)


def _without_overlap(group: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Push starts back so a group's sessions never overlap (sorted by group, start).

    a_k = max(s_k, a_{k-1} + d_{k-1} + pause) unrolls to a_k = P_k + max_{j<=k}(s_j - P_j),
    with P the exclusive running sum of d + pause inside the group: a grouped running max.
    """
    step = duration + _MIN_PAUSE_MS
    exclusive = np.cumsum(step) - step
    is_first = np.ones(len(group), dtype=bool)
    is_first[1:] = group[1:] != group[:-1]
    group_rank = np.cumsum(is_first) - 1
    first_index = np.flatnonzero(is_first)
    prefix = exclusive - exclusive[first_index][group_rank]
    slack = start - prefix
    if len(slack) == 0:
        return start
    span = int(slack.max() - slack.min()) + 1
    lifted = slack - slack.min() + group_rank * span  # groups cannot leak into each other
    running = np.maximum.accumulate(lifted) - group_rank * span + slack.min()
    return prefix + running


def _session_devices(main: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The user's main device, or now and then another one."""
    other = rng.choice(len(DEVICE_SHARE), size=len(main), p=DEVICE_SHARE).astype(np.int8)
    return np.where(rng.random(len(main)) < _OTHER_DEVICE, other, main).astype(np.int8)
