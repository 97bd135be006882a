"""Pure parts of the candidate sets' path: deadlines, rank tiers, and which pairs to compute.

No Kafka, model or store here: the stream graph's pairs step (:mod:`pipelines.streaming.pairs`)
feeds these with what it read, and tests call them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.schemas.layouts import CANDIDATES
from pipelines.store import ReadResult

__all__ = [
    "FIRST_TIER",
    "TIER_MIN_PAIRS",
    "CandidateWork",
    "Plan",
    "past_deadline",
    "plan_pairs",
    "rank_tiers",
    "split_by_deadline",
]

#: Ads of each set in the first rank tier; each later tier is as wide as all before it (64, 64, 128, 256, ...).
FIRST_TIER = 64
#: A batch with no more pairs to compute than this goes in one pass: each tier costs a forward's fixed
#: cost (several ms on a CPU), which pays only when the batch is long enough for a deadline to bite.
TIER_MIN_PAIRS = 1_024


@dataclass(frozen=True)
class CandidateWork:
    """One candidate set to precompute, and where it came from (to acknowledge it when done)."""

    partition: int
    offset: int
    request_id: str
    user_id: int
    surface: int
    stage_ms: int
    needed_by_ms: int
    ad_ids: np.ndarray  # (A,) int64
    received_s: float  # wall clock when the graph read it


def split_by_deadline(
    work: list[CandidateWork], now_ms: int, grace_ms: int = 0
) -> tuple[list[CandidateWork], list[CandidateWork]]:
    """(still in time, past their deadline): a set is late once ``now`` is past ``needed_by + grace``."""
    live = [w for w in work if w.needed_by_ms + grace_ms >= now_ms]
    late = [w for w in work if w.needed_by_ms + grace_ms < now_ms]
    return live, late


def past_deadline(sets: pa.Table, now_ms: int, grace_ms: int = 0) -> np.ndarray:
    """Which rows of ``sets`` (CANDIDATE_SET) are past ``needed_by + grace`` at ``now_ms``: the same
    rule as :func:`split_by_deadline`, on a table (before a set becomes :class:`CandidateWork`)."""
    needed = sets.column("needed_by").cast(pa.int64()).to_numpy()
    return np.asarray(needed + grace_ms < now_ms, bool)


@dataclass(frozen=True)
class Plan:
    """What to compute for a batch of candidate sets: ``requests`` (CANDIDATES rows holding only the
    pairs to compute, each request time moved to just after its user's last event so the whole
    history is read), how many pairs were asked for, found fresh in the store, or repeated in the batch."""

    requests: pa.Table
    #: ``(len(requests),) int64``: each request's set's ``needed_by`` (ms).
    needed_by_ms: np.ndarray
    pairs_asked: int
    pairs_fresh: int
    pairs_repeated: int

    @property
    def pairs_to_compute(self) -> int:
        return self.pairs_asked - self.pairs_fresh - self.pairs_repeated


def pair_keys(work: list[CandidateWork]) -> tuple[np.ndarray, np.ndarray]:
    """``(user_id, ad_id)`` (P,) int64 of every pair of ``work``, request by request."""
    if not work:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    users = np.concatenate([np.full(len(w.ad_ids), w.user_id, np.int64) for w in work])
    return users, np.concatenate([w.ad_ids for w in work]).astype(np.int64)


def plan_pairs(
    work: list[CandidateWork], stored: ReadResult, last_event_ms: dict[int, int], model_version: str
) -> Plan:
    """The pairs of ``work`` to compute (each set's ads in its order, the early stage's score order, best
    first): not those ``stored`` (a store read of :func:`pair_keys`, in
    that order) holds fresh, and each (user, ad) once per batch.

    Fresh means found, within the store's max age, computed by this ``model_version`` (a pair of
    another model is never served as this one's, nor counted as compute saved), and computed on the
    user's current history: watermark at or after ``last_event_ms[user]``, 0 for a user without history."""
    users, ads = pair_keys(work)
    last = np.fromiter((last_event_ms.get(int(u), 0) for u in users), np.int64, len(users))
    same_model = np.asarray(stored.model_version == model_version, dtype=bool)
    fresh = stored.found & ~stored.stale & same_model & (stored.history_watermark_ms >= last)
    keys = np.stack([users, ads], axis=1) if len(users) else np.zeros((0, 2), np.int64)
    first = np.zeros(len(users), bool)
    if len(users):
        _, index = np.unique(keys[~fresh], axis=0, return_index=True)
        first[np.flatnonzero(~fresh)[index]] = True
    wanted = ~fresh & first
    columns: dict[str, list] = {name: [] for name in CANDIDATES.schema.names}
    needed: list[int] = []
    start = 0
    for w in work:
        stop = start + len(w.ad_ids)
        ads_left = ads[start:stop][wanted[start:stop]]
        start = stop
        if not len(ads_left):
            continue
        needed.append(w.needed_by_ms)
        columns["request_id"].append(w.request_id)
        columns["user_id"].append(w.user_id)
        columns["surface"].append(w.surface)
        columns["request_time"].append(max(w.stage_ms, last_event_ms.get(w.user_id, 0) + 1))
        columns["ad_ids"].append(ads_left.tolist())
    requests = pa.table({name: pa.array(columns[name], CANDIDATES.schema.field(name).type) for name in columns})
    return Plan(
        requests=requests.cast(CANDIDATES.schema),
        needed_by_ms=np.asarray(needed, np.int64),
        pairs_asked=len(users),
        pairs_fresh=int(fresh.sum()),
        pairs_repeated=int((~fresh & ~first).sum()),
    )


def rank_tiers(
    requests: pa.Table, first: int = FIRST_TIER, min_pairs: int = TIER_MIN_PAIRS
) -> list[tuple[np.ndarray, pa.Table]]:
    """``requests`` (CANDIDATES rows, each one's ads best first) cut by rank: tier 0 holds ranks
    ``[0, first)`` of every request, each later tier ranks as many again as all before it
    (``[first, 2 first)``, ``[2 first, 4 first)``, ...). Each tier is ``(rows of requests it holds,
    those requests with only that tier's ads)``, rows in the requests' order; computed tier by tier,
    every set's likeliest survivors of the next stage finish before any set's unlikeliest. Requests
    of ``min_pairs`` ads or fewer in all are one tier."""
    if first < 1:
        raise ValueError(f"first must be >= 1, got {first}")
    ads = requests.column("ad_ids").combine_chunks() if requests.num_rows else pa.array([], pa.list_(pa.int64()))
    counts = ads.value_lengths().to_numpy(zero_copy_only=False) if len(ads) else np.zeros(0, np.int64)
    if 0 < counts.sum() <= min_pairs:
        return [(np.arange(len(counts)), requests)]
    tiers: list[tuple[np.ndarray, pa.Table]] = []
    start, stop = 0, first
    while len(counts) and start < counts.max():
        rows = np.flatnonzero(counts > start)
        sliced = pc.list_slice(ads.take(pa.array(rows)), start, stop)
        tier = requests.take(pa.array(rows))
        tier = tier.set_column(tier.schema.get_field_index("ad_ids"), "ad_ids", sliced).cast(requests.schema)
        tiers.append((rows, tier))
        start, stop = stop, 2 * stop
    return tiers
