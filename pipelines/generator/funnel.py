"""The ranking funnel: ad requests narrowed stage by stage (CANDIDATE_SET rows) and their late stage.

Each request is anchored on an impression of the world (so requests come when and
where users browse: their rate follows users' activity and the diurnal curve, on the
surface of the session). Retrieval draws ~1,000 distinct ads with weights
affinity^a * popularity^b (the Gumbel top-k of :func:`pipelines.generator.candidates.retrieve`);
each later stage re-scores the survivors with the same true score and less noise and
keeps its best: early ranking ~200, late ranking ~50, the auction a few. Stages follow
each other after lognormal gaps (tens to hundreds of milliseconds); the auction ends
at the anchoring impression. Every stage's row carries ``needed_by``, the time of the
request's late stage: a pair representation computed after it is too late.

A funnel table holds every stage of every request, so it is its own ground truth
(which ads reached which stage, and when); :func:`late_requests` gives the late stage
in the CANDIDATES layout (``request_time`` = when late ranking reads the pairs), which
``precompute``, ``lookup`` and the Solaris bench take as the requests to serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.generator.candidates import score_ads
from pipelines.generator.events import event_ids
from pipelines.generator.world import World
from pipelines.schemas.enums import FUNNEL_STAGE_CODE, FUNNEL_STAGES, IMPRESSION
from pipelines.schemas.layouts import CANDIDATE_SET, CANDIDATES

__all__ = ["FunnelConfig", "generate_funnel", "late_requests", "stage_rows"]

_REQUEST_SALT = 0x66756E6E656C  # "funnel"
_CHUNK_CELLS = 4_000_000  # requests x ads scored at once


@dataclass(frozen=True)
class FunnelConfig:
    """Stage sizes (widest first, as :data:`pipelines.schemas.enums.FUNNEL_STAGES`), the Gumbel noise of each
    stage's score (retrieval's is 1; later stages see the true score better), and the lognormal gap
    (median ms, sigma) before each stage after the first."""

    sizes: tuple[int, ...] = (1000, 200, 50, 4)
    noise: tuple[float, ...] = (1.0, 0.6, 0.35, 0.2)
    gap_median_ms: tuple[float, ...] = (40.0, 150.0, 60.0)
    gap_sigma: float = 0.6

    def __post_init__(self) -> None:
        n = len(FUNNEL_STAGES)
        if len(self.sizes) != n or len(self.noise) != n or len(self.gap_median_ms) != n - 1:
            raise ValueError(f"need {n} sizes and noises and {n - 1} gaps, one per stage {FUNNEL_STAGES}")
        if any(b > a for a, b in zip(self.sizes, self.sizes[1:], strict=False)) or self.sizes[-1] < 1:
            raise ValueError(f"stage sizes must be >= 1 and narrow stage by stage, got {self.sizes}")
        if min(self.gap_median_ms) <= 0 or self.gap_sigma < 0 or min(self.noise) < 0:
            raise ValueError("gaps must be positive, sigma and noise non-negative")


def generate_funnel(
    world: World, events: pa.Table, requests: int, rng: np.random.Generator, config: FunnelConfig | None = None
) -> pa.Table:
    """``requests`` ad requests anchored on impressions of ``events`` (EVENT layout): CANDIDATE_SET
    rows, one per (request, stage), sorted by ``stage_time`` (then request, then stage)."""
    config = config or FunnelConfig()
    if requests < 0:
        raise ValueError(f"requests must be non-negative, got {requests}")
    impressions = np.flatnonzero(events.column("event_type").to_numpy() == IMPRESSION)
    requests = min(requests, len(impressions))
    anchor = np.sort(rng.choice(impressions, size=requests, replace=False))
    user_ids = events.column("user_id").to_numpy()[anchor]
    user = np.searchsorted(world.users.user_id, user_ids)
    surface = events.column("surface").to_numpy()[anchor].astype(np.int8)
    end_ms = events.column("event_time").cast(pa.int64()).to_numpy()[anchor]
    times = _stage_times(end_ms, config, rng)
    sizes = np.minimum(np.asarray(config.sizes), world.items.num_ads)
    stages = _narrow(world, user, sizes, config.noise, rng)
    return _table(world, user_ids, surface, times, stages)


def _stage_times(end_ms: np.ndarray, config: FunnelConfig, rng: np.random.Generator) -> np.ndarray:
    """``(R, stages)`` ms: lognormal gaps between stages, the last stage at ``end_ms``."""
    gaps = np.stack(
        [rng.lognormal(np.log(m), config.gap_sigma, size=len(end_ms)) for m in config.gap_median_ms], axis=1
    )
    gaps = np.maximum(np.rint(gaps), 1).astype(np.int64)
    before_end = np.concatenate([np.cumsum(gaps[:, ::-1], axis=1)[:, ::-1], np.zeros((len(end_ms), 1), np.int64)], 1)
    return end_ms[:, None] - before_end


def _narrow(
    world: World, user: np.ndarray, sizes: np.ndarray, noise: tuple[float, ...], rng: np.random.Generator
) -> list[np.ndarray]:
    """Per stage, ``(R, size)`` ad ids best first: each stage the best of the previous one's by the
    true score plus that stage's Gumbel noise."""
    ad = np.flatnonzero(world.items.is_ad)
    out: list[list[np.ndarray]] = [[] for _ in sizes]
    chunk = max(1, _CHUNK_CELLS // len(ad))
    for lo in range(0, len(user), chunk):
        true = score_ads(world, user[lo : lo + chunk], ad)  # (r, A)
        survivors = np.broadcast_to(np.arange(len(ad)), true.shape)
        for stage, (size, scale) in enumerate(zip(sizes.tolist(), noise, strict=True)):
            gumbel = -np.log(np.maximum(rng.standard_exponential(size=survivors.shape, dtype=np.float32), 1e-30))
            score = np.take_along_axis(true, survivors, axis=1) + np.float32(scale) * gumbel
            best = np.argsort(-score, axis=1, kind="stable")[:, :size]
            survivors = np.take_along_axis(survivors, best, axis=1)
            out[stage].append(world.items.item_id[ad[survivors]])
    empty = np.zeros((0, 0), np.int64)
    return [np.concatenate(parts) if parts else empty for parts in out]


def _table(
    world: World, user_ids: np.ndarray, surface: np.ndarray, times: np.ndarray, stages: list[np.ndarray]
) -> pa.Table:
    r, n = len(user_ids), len(stages)
    request_id = np.asarray(event_ids(world.config.seed, r, _REQUEST_SALT).to_pylist(), dtype=object)
    needed = times[:, FUNNEL_STAGE_CODE["late"]]
    parts = []
    for stage, ads in enumerate(stages):
        size = ads.shape[1] if ads.size else 0
        offsets = np.arange(0, r * size + 1, size if size else 1, dtype=np.int32)[: r + 1]
        parts.append(
            pa.table(
                {
                    "request_id": pa.array(request_id, pa.string()),
                    "user_id": pa.array(user_ids),
                    "surface": pa.array(surface),
                    "stage": pa.array(np.full(r, stage, np.int8)),
                    "stage_time": pa.array(times[:, stage]).cast(pa.timestamp("ms", tz="UTC")),
                    "needed_by": pa.array(needed).cast(pa.timestamp("ms", tz="UTC")),
                    "ad_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ads.ravel(), pa.int64())),
                }
            )
        )
    table = pa.concat_tables(parts)
    order = np.lexsort((np.repeat(np.arange(n), r), np.tile(np.arange(r), n), table["stage_time"].cast(pa.int64())))
    return table.take(pa.array(order)).cast(CANDIDATE_SET.with_metadata())


def stage_rows(funnel: pa.Table, stage: str) -> pa.Table:
    """The rows of one stage (a name of :data:`pipelines.schemas.enums.FUNNEL_STAGES`)."""
    if stage not in FUNNEL_STAGE_CODE:
        raise ValueError(f"unknown stage {stage!r}; choose from {FUNNEL_STAGES}")
    return funnel.filter(pc.equal(funnel.column("stage"), FUNNEL_STAGE_CODE[stage]))


def late_requests(funnel: pa.Table) -> pa.Table:
    """The late stage of every request as CANDIDATES rows (request_time = its stage time), in time order."""
    late = stage_rows(funnel, "late")
    table = pa.table(
        {
            "request_id": late.column("request_id"),
            "user_id": late.column("user_id"),
            "surface": late.column("surface"),
            "request_time": late.column("stage_time"),
            "ad_ids": late.column("ad_ids"),
        }
    )
    return table.cast(CANDIDATES.with_metadata())
