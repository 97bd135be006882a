"""The sizing page generator (bench/capacity_model.py): a pure function of the measured costs."""

from __future__ import annotations

import json
import math

import pytest

from bench.capacity_model import MEASURED, PAGE, breaks_first, main, render, size


def _fig(value: float) -> dict[str, object]:
    return {"value": value, "unit": "u", "how": "fixture"}


FIXTURE: dict[str, object] = {
    "date": "2026-01-01",
    "machine": "fixture",
    "load_average_start": [1.0, 1.0, 1.0],
    "sizes": "fixture",
    "features_events_per_core": _fig(100_000),
    "replay_events_per_core": _fig(50_000),
    "stream_events_per_core": _fig(1_000),
    "precompute_pairs_per_core": _fig(10_000),
    "solaris_pairs_per_core": _fig(10_000),
    "history_bytes_per_user": {"256": _fig(2_000), "4096": _fig(30_000), "65536": _fig(400_000)},
    "parquet_bytes_per_event": _fig(20),
    "store_bytes_per_record": {"float16": _fig(184), "int8": _fig(120), "redis_float16": _fig(250)},
    "index_bytes_per_user": {"IVF1024,Flat": _fig(270), "IVF1024,PQ32,RFlat": _fig(42)},
    "index_queries_per_core": {"IVF1024,Flat": _fig(2_000), "IVF1024,PQ32,RFlat": _fig(1_000)},
    "resolver_requests_per_core": _fig(500),
}


def test_cells_are_the_stated_formulas_over_the_inputs() -> None:
    cells = size(FIXTURE, 100_000_000)
    events_day = 100_000_000 * 50
    assert cells["features cores"].value == pytest.approx(events_day / (100_000 * 4 * 3600))
    assert cells["stream cores"].value == pytest.approx(events_day / 86_400 * 3 / 1_000)
    assert cells["Kafka partitions"].value == math.ceil(cells["stream cores"].value)
    assert cells["store memory"].value == pytest.approx(100_000_000 * 201 * 250 * 2 / 1e9)  # Redis figure preferred
    assert cells["index memory"].value == pytest.approx(100_000_000 * 42 / 1e9)  # compressed above 4M users
    assert size(FIXTURE, 1_000_000)["index memory"].value == pytest.approx(1_000_000 * 270 / 1e9)
    assert cells["history state disk"].value == pytest.approx(100_000_000 * 30_000 / 1e9)


def test_page_names_the_stage_that_breaks_first_and_the_largest_row() -> None:
    page = render(FIXTURE)
    order = breaks_first(FIXTURE)
    assert [u for _, u, _ in order] == sorted(u for _, u, _ in order)
    assert f"**{order[0][0]}** is the first stage to outgrow one host" in page
    assert "| 10M | 100M | 3.6B |" in page and "All of it is extrapolated" in page
    assert "| stream cores | " in page and "fixture" in page


def test_committed_page_matches_committed_measurements() -> None:
    assert json.loads(MEASURED.read_text())["date"]
    assert PAGE.read_text() == render(json.loads(MEASURED.read_text()))
    assert main(["--check"]) == 0
