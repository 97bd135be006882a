"""Ordering for the deadline: sets earliest deadline first, each set's ads by rank tier (best first),
every tier in the store before the next is computed, and a set past its deadline cut between tiers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.schemas.layouts import CANDIDATES
from pipelines.store import open_store
from pipelines.streaming.pair_work import CandidateWork, rank_tiers
from pipelines.streaming.pairs import write_pairs
from tests.streaming.test_pair_work import _reps


def _requests(ads: list[list[int]]) -> pa.Table:
    n = len(ads)
    table = pa.table(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "user_id": list(range(n)),
            "surface": [0] * n,
            "request_time": [1_000] * n,
            "ad_ids": ads,
        }
    )
    return table.cast(CANDIDATES.schema)


def test_rank_tiers_take_every_requests_best_ads_first_and_double_in_width() -> None:
    tiers = rank_tiers(_requests([list(range(10)), [100, 101, 102], [200]]), first=2, min_pairs=0)
    assert [rows.tolist() for rows, _ in tiers] == [[0, 1, 2], [0, 1], [0], [0]]
    assert [t["ad_ids"].to_pylist() for _, t in tiers] == [
        [[0, 1], [100, 101], [200]],
        [[2, 3], [102]],
        [[4, 5, 6, 7]],
        [[8, 9]],
    ]
    assert all(t.schema == CANDIDATES.schema for _, t in tiers)
    assert rank_tiers(_requests([])) == []
    few = _requests([[1, 2, 3], [4]])
    (rows, whole), *more = rank_tiers(few, first=2, min_pairs=4)  # 4 ads in all: one pass
    assert not more and rows.tolist() == [0, 1] and whole == few
    with pytest.raises(ValueError, match="first"):
        rank_tiers(_requests([[1]]), first=0)


class _Recording:
    """A stand-in for the model's Refresher that records each call's pairs and moves the clock on."""

    encoding_cache = None

    def __init__(self, clock: list[float], step_s: float) -> None:
        self.calls: list[list[tuple[int, list[int]]]] = []
        self._clock, self._step = clock, step_s

    def pairs(self, histories: pa.Table, requests: pa.Table, *, computed_at_ms: int) -> pa.Table:
        rows = list(zip(requests["user_id"].to_pylist(), requests["ad_ids"].to_pylist(), strict=True))
        self.calls.append(rows)
        self._clock[0] += self._step
        return _reps([(u, a) for u, ads in rows for a in ads], watermark_ms=0, computed_at_ms=computed_at_ms)


def _work(user: int, ads: range, needed_by_ms: int) -> CandidateWork:
    return CandidateWork(0, user, f"r{user}", user, 0, 1_000, needed_by_ms, np.asarray(ads, np.int64), 0.0)


def test_sets_go_earliest_deadline_first_by_tier_and_a_set_past_its_deadline_is_cut(tmp_path: Path) -> None:
    clock = [100.0]  # seconds; each tier's compute takes 1 s
    refresher = _Recording(clock, step_s=1.0)
    late_soon = _work(1, range(1000, 1600), needed_by_ms=100_500)  # in time for tier 0 only
    later = _work(2, range(2000, 2600), needed_by_ms=200_000)  # 1,200 pairs in all: more than one pass
    no_history = pa.table({"user_id": pa.array([], pa.int64()), "last_event_time": pa.array([], pa.int64())})
    with open_store(f"lmdb://{tmp_path}/store") as store:
        counts = write_pairs(
            refresher, store, "m", no_history, [later, late_soon], 3600.0, grace_ms=0, clock=lambda: clock[0]
        )
        found = store.read_arrays(
            np.repeat([1, 2], 600), np.r_[np.arange(1000, 1600), np.arange(2000, 2600)], np.ones(1200, bool)
        )
    first, *rest = refresher.calls
    assert [(u, len(ads)) for u, ads in first] == [(1, 64), (2, 64)]  # earliest deadline first
    assert first[0][1] == list(range(1000, 1064))  # the set's best-ranked ads
    assert [[(u, len(ads)) for u, ads in call] for call in rest] == [[(2, 64)], [(2, 128)], [(2, 256)], [(2, 88)]]
    assert (counts.computed, counts.late, counts.fresh, counts.repeated) == (664, 536, 0, 0)
    assert int(found.found[:600].sum()) == 64 and found.found[600:].all()  # user 1: tier 0 only; user 2: all


def test_without_a_grace_every_tier_is_computed_and_a_small_batch_goes_in_one_pass(tmp_path: Path) -> None:
    clock = [1e9]  # far past every deadline
    refresher = _Recording(clock, step_s=1.0)
    no_history = pa.table({"user_id": pa.array([], pa.int64()), "last_event_time": pa.array([], pa.int64())})
    with open_store(f"lmdb://{tmp_path}/store") as store:
        counts = write_pairs(refresher, store, "m", no_history, [_work(1, range(2000), 0)], 3600.0)
        assert (counts.computed, counts.late) == (2000, 0) and len(refresher.calls) == 6
        small = write_pairs(refresher, store, "m", no_history, [_work(2, range(200), 0)], 3600.0)
    assert (small.computed, small.late) == (200, 0) and len(refresher.calls) == 7
