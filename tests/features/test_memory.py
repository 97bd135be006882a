"""Building one heavy user's history: the same outputs as before the memory work, and a memory bound.

The digests below were taken from ``build_histories`` before it was changed to hold fewer
copies of the events (same inputs, same seed); any change to the outputs changes them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.features.histories import build_histories
from pipelines.schemas.layouts import EVENT
from tests.features.skewed import T0, build_peak, write_one_user

HEAVY_USER = 42
EXPECTED = [
    (198, 0, 13833, "de9d8e4473d631c3", "fa085b97e9e98947"),
    (99, 15, 8347, "0efdc7cf8ee70163", "31212927632aeb9a"),
]


def _skewed(n: int, start: int, users: int, duplicates: int, seed: int) -> pa.Table:
    """``n`` events, 70% of one user, ``duplicates`` repeated event ids, times out of order."""
    rng = np.random.default_rng(seed)
    user = np.where(rng.random(n) < 0.7, HEAVY_USER, rng.integers(0, users, n))
    ids = [f"e{k}" for k in range(start, start + n)]
    for j in rng.integers(0, n, duplicates):
        ids[j] = ids[(j * 7) % n]
    is_ad = rng.integers(0, 2, n).astype(bool)
    columns = {
        "event_id": ids,
        "user_id": user,
        "item_id": rng.integers(0, 5, n),
        "is_ad": is_ad,
        "advertiser_id": pa.array(np.ones(n, dtype=np.int64), mask=~is_ad),
        "item_category": rng.integers(0, 5, n).astype(np.int32),
        "surface": rng.integers(0, 3, n).astype(np.int8),
        "event_type": rng.choice(np.array([0, 0, 0, 1, 2, 9, 10, 11], dtype=np.int8), n),
        "event_time": pa.array(T0 + rng.integers(0, 10**8, n), pa.timestamp("ms", tz="UTC")),
        "value": pa.nulls(n, pa.float32()),
        "device": rng.integers(0, 3, n).astype(np.int8),
    }
    return pa.table(columns, schema=EVENT.schema)


def _digest(table: pa.Table) -> str:
    return hashlib.sha256(json.dumps(table.to_pylist(), default=str).encode()).hexdigest()[:16]


def test_a_skewed_build_and_its_incremental_follow_up_give_the_outputs_of_before() -> None:
    first = build_histories(_skewed(20_000, 0, 300, 200, seed=1), max_history=64)
    second = build_histories(_skewed(12_000, 15_000, 400, 100, seed=2), first.histories, max_history=64)
    seen = [
        (b.duplicates, b.duplicates_previous, b.evicted, _digest(b.histories), _digest(b.examples))
        for b in (first, second)
    ]
    assert seen == EXPECTED


#: Peak RSS above the input a build may use, per byte of input (its Arrow size). Building
#: one user held ~9.5x before the memory work and ~5.4x after it (2M events, 2 threads).
OVERHEAD_PER_INPUT_BYTE = 7.5


def _check_bound(tmp_path: Path, n: int) -> None:
    seen = build_peak(write_one_user(tmp_path / "one-user.parquet", n))
    assert (seen["events"], seen["evicted"]) == (n, n - 4096)
    overhead = (seen["peak_kb"] - seen["read_kb"]) * 1024
    assert overhead <= OVERHEAD_PER_INPUT_BYTE * seen["input_bytes"], seen


@pytest.mark.integration
def test_two_million_events_of_one_user_build_within_the_memory_bound(tmp_path: Path) -> None:
    _check_bound(tmp_path, 2_000_000)


@pytest.mark.integration
def test_ten_million_events_of_one_user_build_within_the_memory_bound(tmp_path: Path) -> None:
    _check_bound(tmp_path, 10_000_000)
