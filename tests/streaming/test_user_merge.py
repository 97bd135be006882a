"""The keyed graph's one-user merge equals the batch build (pure logic, no services)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.features.histories import build_histories
from pipelines.schemas.layouts import HISTORY
from pipelines.streaming.user_merge import merge_user
from tests.features.factories import event, events_table

_specs = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 11), st.integers(0, 11), st.integers(0, 9)),
    min_size=0,
    max_size=30,
)


def _rows(spec: list[tuple[int, int, int, int]], prefix: str, user: int = 7) -> list[dict]:
    """Events of ``user``; ids drawn from a small pool, so repeats (duplicates) are common."""
    return [event(f"{prefix}{ident}", user, t * 1000, event_type=et, surface=s) for t, et, s, ident in spec]


def _first_copies(rows: list[dict]) -> list[dict]:
    seen: set[str] = set()
    return [r for r in rows if not (r["event_id"] in seen or seen.add(r["event_id"]))]  # type: ignore[func-returns-value]


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_specs, _specs, st.integers(1, 12), st.booleans())
def test_merge_user_equals_the_batch_build(old, new, max_history, shared_ids) -> None:
    """Two flushes of one user: the second merged into the first's row, by both paths; ids in the
    second repeat ids of the first when ``shared_ids`` (a redelivery) and repeat within it always."""
    old_rows = _first_copies(_rows(old, "x"))  # distinct times per id: a redelivery is a true copy
    by_id = {r["event_id"]: r for r in old_rows}
    new_rows = [by_id.get(r["event_id"], r) for r in _rows(new, "x" if shared_ids else "n")]
    first = merge_user(events_table(old_rows), None, max_history=max_history) if old_rows else None
    reference_first = build_histories(events_table(old_rows), max_history=max_history).histories if old_rows else None
    if first is not None and reference_first is not None:
        assert first.to_pylist() == reference_first.to_pylist()
    if not new_rows and first is None:
        return
    got = merge_user(events_table(new_rows), first, max_history=max_history)
    want = build_histories(events_table(new_rows), reference_first, max_history=max_history).histories
    assert got.schema == HISTORY.schema
    assert got.to_pylist() == want.to_pylist()


def test_a_flush_of_only_held_events_returns_the_previous_row() -> None:
    rows = [event(f"e{i}", 3, i * 1000) for i in range(5)]
    first = merge_user(events_table(rows), None, max_history=3)
    held = rows[3:5]  # e2..e4 are held; e0, e1 were evicted into the summary
    assert merge_user(events_table(held), first, max_history=3).to_pylist() == first.to_pylist()


def test_max_history_must_be_positive() -> None:
    with pytest.raises(ValueError):
        merge_user(events_table([event("e", 1, 0)]), None, max_history=0)


def test_the_row_keeps_the_newest_and_counts_the_rest() -> None:
    rows = [event(f"e{i}", 3, i * 1000, surface=i % 2) for i in range(6)]
    row = merge_user(events_table(rows), None, max_history=4).to_pylist()[0]
    assert [e["event_id"] for e in row["events"]] == ["e2", "e3", "e4", "e5"]
    assert row["summary"]["evicted_count"] == 2 and row["summary"]["surface_counts"][:2] == [1, 1]
    assert row["num_events_total"] == 6
    assert pa.table({"n": [row["num_events_total"]]}).num_rows == 1
