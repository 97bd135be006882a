from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.features.histories import build_histories
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE
from tests.features.factories import T0, event, events_table


def _ids(history_row: dict) -> list[str]:
    return [e["event_id"] for e in history_row["events"]]


def test_events_are_ordered_by_time_then_id_and_truncated() -> None:
    rows = [event("b", 1, 10), event("a", 1, 10), event("c", 1, 5), event("d", 1, 20), event("z", 2, 1)]
    build = build_histories(events_table(rows), max_history=3)
    assert build.histories.schema == HISTORY.with_metadata()
    first, second = build.histories.to_pylist()
    assert _ids(first) == ["a", "b", "d"]
    assert first["num_events_total"] == 4
    assert first["summary"]["evicted_count"] == 1
    assert first["summary"]["first_event_time"] == first["summary"]["last_event_time"]
    assert _ids(second) == ["z"] and second["summary"]["evicted_count"] == 0
    assert build.evicted == 1


def test_summary_counts_evicted_surfaces_and_types() -> None:
    rows = [event(f"e{i}", 1, i, event_type=i % 3, surface=i % 2) for i in range(10)]
    summary = build_histories(events_table(rows), max_history=4).histories.to_pylist()[0]["summary"]
    assert summary["evicted_count"] == 6
    assert summary["surface_counts"] == [3, 3] + [0] * (len(SURFACES) - 2)
    assert summary["event_type_counts"] == [2, 2, 2] + [0] * (len(EVENT_TYPES) - 3)


def test_duplicates_within_input_and_against_previous_are_dropped() -> None:
    first = build_histories(events_table([event("a", 1, 0), event("a", 1, 0), event("b", 1, 1)]))
    assert first.duplicates == 1
    second = build_histories(events_table([event("b", 1, 1), event("c", 1, 2)]), first.histories)
    assert second.duplicates_previous == 1
    assert _ids(second.histories.to_pylist()[0]) == ["a", "b", "c"]
    assert second.histories.to_pylist()[0]["num_events_total"] == 3


def test_untouched_users_pass_through_with_the_new_watermark() -> None:
    first = build_histories(events_table([event("a", 1, 0), event("b", 2, 0)]))
    second = build_histories(events_table([event("c", 1, 100)]), first.histories)
    by_user = {r["user_id"]: r for r in second.histories.to_pylist()}
    assert _ids(by_user[2]) == ["b"]
    assert by_user[2]["watermark"] == by_user[1]["watermark"]
    assert int(by_user[2]["watermark"].timestamp() * 1000) == T0 + 100


def test_long_history_of_65536_is_kept_whole() -> None:
    n = 70_000
    table = pa.table(
        {
            "event_id": [f"e{i:06d}" for i in range(n)],
            "user_id": [9] * n,
            "item_id": list(range(n)),
            "is_ad": [False] * n,
            "advertiser_id": pa.nulls(n, pa.int64()),
            "item_category": [1] * n,
            "surface": [0] * n,
            "event_type": [0] * n,
            "event_time": [T0 + i for i in range(n)],
            "value": pa.nulls(n, pa.float32()),
            "device": pa.nulls(n, pa.int8()),
        }
    )
    row = build_histories(table, max_history=65_536).histories.to_pylist()[0]
    assert len(row["events"]) == 65_536
    assert row["events"][0]["event_id"] == f"e{n - 65_536:06d}"
    assert row["summary"]["evicted_count"] == n - 65_536


# --- incremental == full rebuild ---------------------------------------------------------

_event_rows = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 11), st.integers(0, 11)),
    min_size=0,
    max_size=40,
)


def _rows(spec: list[tuple[int, int, int, int]], prefix: str) -> list[dict]:
    return [event(f"{prefix}{i}", u, t * 1000, event_type=et, surface=s) for i, (u, t, et, s) in enumerate(spec)]


def _canonical(table: pa.Table) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "watermark"} for row in table.to_pylist()]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_event_rows, _event_rows, st.integers(1, 12), st.data())
def test_incremental_build_equals_full_rebuild(old, new, max_history, data) -> None:
    old_rows, new_rows = _rows(old, "o"), _rows(new, "n")
    redelivered = data.draw(st.lists(st.sampled_from(old_rows), max_size=5)) if old_rows else []
    first = build_histories(events_table(old_rows), max_history=max_history)
    retained = {e["event_id"] for r in first.histories.to_pylist() for e in r["events"]}
    redelivered = [r for r in redelivered if r["event_id"] in retained]  # see histories.py docstring
    incremental = build_histories(events_table(new_rows + redelivered), first.histories, max_history=max_history)
    full = build_histories(events_table(old_rows + new_rows), max_history=max_history)
    assert _canonical(incremental.histories) == _canonical(full.histories)
    assert incremental.duplicates_previous == len({r["event_id"] for r in redelivered})


# --- training examples -------------------------------------------------------------------


def test_labels_use_windows_on_the_same_item() -> None:
    minute = 60_000
    rows = [
        event("imp1", 1, 0, event_type=0, item_id=5),
        event("clk1", 1, 10 * minute, event_type=1, item_id=5),
        event("imp2", 1, 0, event_type=0, item_id=6),
        event("clk2", 1, 31 * minute, event_type=1, item_id=6),
        event("imp3", 1, 0, event_type=0, item_id=8),
        event("clk3", 1, 1 * minute, event_type=1, item_id=9),
        event("cnv1", 1, 6 * 24 * 60 * minute, event_type=10, item_id=5),
    ]
    examples = build_histories(events_table(rows)).examples
    assert examples.schema == TRAINING_EXAMPLE.with_metadata()
    labels = {r["event_id"]: (r["clicked"], r["converted"]) for r in examples.to_pylist()}
    assert labels == {"imp1": (True, True), "imp2": (False, False), "imp3": (False, False)}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_event_rows, st.integers(1, 8))
def test_no_future_event_reaches_an_example(spec, max_history) -> None:
    build = build_histories(events_table(_rows(spec, "e")), max_history=max_history)
    histories = {r["user_id"]: r for r in build.histories.to_pylist()}
    for ex in build.examples.to_pylist():
        history = histories[ex["user_id"]]
        prefix = history["events"][: ex["history_end"]]
        assert all(e["event_time"] < ex["event_time"] for e in prefix)
        stored_before = sum(e["event_time"] < ex["event_time"] for e in history["events"])
        assert ex["history_end"] == stored_before
        all_before = sum(1 for u, t, _, _ in spec if u == ex["user_id"] and T0 + t * 1000 < _ms(ex["event_time"]))
        assert ex["history_length"] == all_before


def _ms(value) -> int:
    return int(value.timestamp() * 1000)


def test_max_history_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--max-history"):
        build_histories(events_table([]), max_history=0)
