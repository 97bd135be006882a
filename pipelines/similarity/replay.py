"""The path mix of a realistic request stream: replay candidate requests in time order.

Candidate sets (CANDIDATES layout, e.g. the generator's) are what ranking narrowed to
and what triggers pair precompute. The replay keeps a store the way the precompute
stage would: every request's (user, ad) pairs are written at its request time, so a
later request finds them (fresh within ``max_age_s``, older ones as fallbacks), and
user-level representations are written once at the start of the measured period.
Requests before ``measure_from_ms`` only fill the store; the later ones are resolved
by the real :class:`Resolver` (clock = request time) and counted by path. Only which
keys exist and their ages decide a path, so pair rows may carry placeholder vectors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.similarity.policy import PATHS
from pipelines.similarity.resolver import Resolver
from pipelines.similarity.store_fill import StoreWriter
from pipelines.store import ManualClock

__all__ = ["ReplayResult", "replay_requests"]


@dataclass
class ReplayResult:
    """Requests and candidates resolved, answers per path, per-request latency (ms)."""

    requests: int = 0
    candidates: int = 0
    mix: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    latency_ms: list[float] = field(default_factory=list)

    def shares(self) -> dict[str, float]:
        return {k: v / max(self.candidates, 1) for k, v in self.mix.items()}

    def line(self) -> str:
        return ", ".join(f"{k} {v:.1%}" for k, v in self.shares().items())


def _requests(candidates: pa.Table) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    table = candidates.sort_by([("request_time", "ascending"), ("request_id", "ascending")])
    users = np.asarray(table.column("user_id").to_numpy(), np.int64)
    times = np.asarray(table.column("request_time").cast(pa.int64()).to_numpy(), np.int64)
    counts = np.asarray(pc.list_value_length(table.column("ad_ids")).to_numpy(zero_copy_only=False), np.int64)
    flat = np.asarray(pc.list_flatten(table.column("ad_ids")).to_numpy(), np.int64)
    return users, times, np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else []


def replay_requests(
    candidates: pa.Table,
    resolvers: dict[str, Resolver],
    writer: StoreWriter,
    clock: ManualClock,
    pair_vectors: Callable[[int, np.ndarray], np.ndarray],
    *,
    measure_from_ms: int,
) -> dict[str, ReplayResult]:
    """Replay ``candidates``; every resolver (e.g. different policies over the same store) answers each
    measured request before its pairs are written. ``pair_vectors(user, ads) -> (A, D)`` gives the
    vectors written for a request's pairs."""
    users, times, ads = _requests(candidates)
    results = {name: ReplayResult() for name in resolvers}
    for user, at_ms, request_ads in zip(users.tolist(), times.tolist(), ads, strict=True):
        clock.now_s = at_ms / 1000.0
        writer.now_s = clock.now_s
        if at_ms >= measure_from_ms and len(request_ads):
            for name, resolver in resolvers.items():
                started = time.perf_counter()
                got = resolver.resolve(user, request_ads)
                result = results[name]
                result.latency_ms.append((time.perf_counter() - started) * 1000)
                result.requests += 1
                result.candidates += len(request_ads)
                for path, count in got.counts().items():
                    result.mix[path] += count
        if len(request_ads):
            writer.pairs(
                np.full(len(request_ads), user),
                request_ads,
                pair_vectors(user, request_ads),
                np.zeros(len(request_ads)),
                0.0,
            )
    return results
