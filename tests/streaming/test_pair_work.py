"""The candidate sets' pure pieces: deadlines and which pairs to compute (skip-if-fresh, repeats, model versions)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.store import open_store
from pipelines.streaming.pair_work import CandidateWork, pair_keys, plan_pairs, split_by_deadline


def _work(offset: int, user: int, ads: list[int], needed_by_ms: int = 2**50) -> CandidateWork:
    return CandidateWork(0, offset, f"r{offset}", user, 0, 1_000, needed_by_ms, np.asarray(ads, np.int64), 0.0)


def test_split_by_deadline() -> None:
    work = [_work(0, 1, [1], needed_by_ms=1_000), _work(1, 1, [1], needed_by_ms=2_000)]
    live, late = split_by_deadline(work, now_ms=1_500)
    assert [w.offset for w in live] == [1] and [w.offset for w in late] == [0]
    assert len(split_by_deadline(work, now_ms=1_500, grace_ms=600)[0]) == 2


def _reps(keys: list[tuple[int, int]], watermark_ms: int, computed_at_ms: int) -> pa.Table:
    from pipelines.schemas.layouts import representation_schema

    n = len(keys)
    return pa.table(
        {
            "user_id": [u for u, _ in keys],
            "ad_id": [a for _, a in keys],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(n * 8), pa.float16()), 8),
            "embedding_scale": pa.nulls(n, pa.float32()),
            "p_click": np.full(n, 0.1, np.float32),
            "p_conversion": np.full(n, 0.01, np.float32),
            "model_version": ["m"] * n,
            "history_watermark": pa.array([watermark_ms] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "computed_at": pa.array([computed_at_ms] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        },
        schema=representation_schema(8),
    )


def test_plan_skips_fresh_pairs_and_repeats(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    with open_store(f"lmdb://{tmp_path}/store") as store:
        store.write_batch(_reps([(1, 10), (1, 11), (2, 10)], watermark_ms=5_000, computed_at_ms=now_ms))
        store.write_batch(_reps([(3, 10)], watermark_ms=5_000, computed_at_ms=now_ms - 7_200_000))  # too old
        work = [_work(0, 1, [10, 11, 12]), _work(1, 2, [10, 13]), _work(2, 1, [12, 14]), _work(3, 3, [10])]
        users, ads = pair_keys(work)
        stored = store.read_arrays(users, ads, np.ones(len(users), bool), max_age_s=3_600)
        # user 2 has a newer event than the stored pair saw: recompute; user 1's pairs are current
        plan = plan_pairs(work, stored, {1: 5_000, 2: 6_000}, "m")
    assert (plan.pairs_asked, plan.pairs_fresh, plan.pairs_repeated, plan.pairs_to_compute) == (8, 2, 1, 5)
    rows = plan.requests.to_pylist()
    assert [(r["user_id"], r["ad_ids"]) for r in rows] == [(1, [12]), (2, [10, 13]), (1, [14]), (3, [10])]
    assert rows[1]["request_time"].timestamp() * 1000 == 6_001  # after the user's last event
    assert rows[3]["request_time"].timestamp() * 1000 == 1_000  # no history: the stage time


def test_a_pair_of_another_model_version_is_never_fresh(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    with open_store(f"lmdb://{tmp_path}/store") as store:
        store.write_batch(_reps([(1, 10), (1, 11)], watermark_ms=5_000, computed_at_ms=now_ms))  # model "m"
        work = [_work(0, 1, [10, 11])]
        users, ads = pair_keys(work)
        stored = store.read_arrays(users, ads, np.ones(len(users), bool), max_age_s=3_600)
    assert plan_pairs(work, stored, {1: 5_000}, "m").pairs_fresh == 2
    swapped = plan_pairs(work, stored, {1: 5_000}, "m2")
    assert (swapped.pairs_fresh, swapped.pairs_to_compute) == (0, 2)
    assert swapped.requests["ad_ids"].to_pylist() == [[10, 11]]
