"""Building one heavy user's history: the same outputs as before the memory work, and a memory bound.

The digests below were taken from ``build_histories`` before it was changed to hold fewer
copies of the events (same inputs, same seed); any change to the outputs changes them. The
streamed build gives them too when its runs and slices go through disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.features.histories import CHUNK_ROWS, build_histories, stream_histories
from pipelines.schemas.layouts import EVENT
from tests.features.skewed import T0, build_peak, command_peak, write_one_user

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


def _streamed(events: pa.Table, previous: pa.Table | None = None) -> tuple:
    """The streamed build over parts of 3,000 events, holding 2,000 at a time: every run on disk."""
    parts = [events.slice(start, 3_000) for start in range(0, events.num_rows, 3_000)]
    build = stream_histories(parts, previous, max_history=64, rows=2_000)
    return build, pa.concat_tables(list(build.examples))


def _in_memory(events: pa.Table, previous: pa.Table | None = None) -> tuple:
    build = build_histories(events, previous, max_history=64)
    return build, build.examples


@pytest.mark.parametrize("build", [_in_memory, _streamed])
def test_a_skewed_build_and_its_incremental_follow_up_give_the_outputs_of_before(build) -> None:
    first, first_examples = build(_skewed(20_000, 0, 300, 200, seed=1))
    second, second_examples = build(_skewed(12_000, 15_000, 400, 100, seed=2), first.histories)
    seen = [
        (b.duplicates, b.duplicates_previous, b.evicted, _digest(b.histories), _digest(examples))
        for b, examples in ((first, first_examples), (second, second_examples))
    ]
    assert seen == EXPECTED


#: Peak RSS a streamed build may add to the child's (imports, an open Parquet file), per event it
#: holds at a time (``CHUNK_ROWS``): about 350 B at 2M and 10M events of one user (2 threads).
#: The build before streaming grew with the user's events instead (2.7 GB at 10M).
BYTES_PER_HELD_EVENT = 512
#: Peak RSS at 10M events of one user over the peak at 2M: flat, not linear (the old build: 3.4).
PEAK_GROWTH = 1.3


@pytest.fixture(scope="module")
def one_user(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """A Parquet file of N events of one user, written once per N."""
    folder = tmp_path_factory.mktemp("one-user")
    return functools.cache(lambda n: write_one_user(folder / f"one-user-{n}.parquet", n))


@pytest.fixture(scope="module")
def peak_of(one_user: Callable[[int], Path]) -> Callable[[int], dict]:
    """Peak RSS and counts of building N events of one user, measured once per N."""

    @functools.cache
    def peak(n: int) -> dict:
        seen = build_peak(one_user(n))
        assert (seen["events"], seen["evicted"]) == (n, n - 4096)
        return seen

    return peak


def _check_bound(seen: dict) -> None:
    overhead = (seen["peak_kb"] - seen["read_kb"]) * 1024
    assert overhead <= BYTES_PER_HELD_EVENT * CHUNK_ROWS, seen


@pytest.mark.integration
def test_two_million_events_of_one_user_build_within_the_memory_bound(peak_of: Callable[[int], dict]) -> None:
    _check_bound(peak_of(2_000_000))


@pytest.mark.integration
def test_ten_million_events_of_one_user_build_within_the_memory_bound(peak_of: Callable[[int], dict]) -> None:
    _check_bound(peak_of(10_000_000))


@pytest.mark.integration
def test_five_times_the_events_of_one_user_take_about_the_same_peak_memory(peak_of: Callable[[int], dict]) -> None:
    small, large = peak_of(2_000_000), peak_of(10_000_000)
    assert large["peak_kb"] <= PEAK_GROWTH * small["peak_kb"], (small, large)


@pytest.mark.integration
def test_the_features_command_on_five_times_the_events_of_one_user_takes_about_the_same_peak_memory(
    one_user: Callable[[int], Path], tmp_path: Path
) -> None:
    """The whole command: the events cross the shuffle as files, so the local runner does not hold
    them either (before: 1.10 GB at 2M, 2.41 GB at 10M)."""
    peaks = {}
    for n in (2_000_000, 10_000_000):
        seen = command_peak(one_user(n), tmp_path / f"out-{n}")
        assert seen["code"] == 0
        summary = json.loads((tmp_path / f"out-{n}" / "summary.json").read_text())
        assert (summary["events_valid"], summary["evicted"]) == (n, n - 4096)
        peaks[n] = seen["peak_kb"]
    assert peaks[10_000_000] <= PEAK_GROWTH * peaks[2_000_000], peaks
