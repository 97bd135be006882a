"""The streamed build (sorted runs on disk, merged slices, examples read back in order) gives the
outputs of the build in memory, whatever the parts and however small the slices."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.features import spill
from pipelines.features.histories import build_histories, stream_histories
from tests.features.factories import event, events_table

_specs = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 8), st.integers(0, 11), st.integers(0, 50)), min_size=0, max_size=40
)


def _rows(spec: list[tuple[int, int, int, int]], prefix: str) -> list[dict]:
    return [event(f"{prefix}{i}", u, t * 1000, event_type=et, item_id=i % 3) for i, (u, t, et, i) in enumerate(spec)]


def _parts(table: pa.Table, size: int) -> list[pa.Table]:
    return [table.slice(start, size) for start in range(0, table.num_rows, size)]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_specs, _specs, st.integers(1, 6), st.integers(1, 7), st.integers(1, 9), st.data())
def test_a_streamed_build_gives_the_outputs_of_the_build_in_memory(old, new, max_history, part, rows, data) -> None:
    first = build_histories(events_table(_rows(old, "o")), max_history=max_history)
    new_rows = _rows(new, "n")
    # the same ids again (a redelivery, or the id reused by another user), and ids of the snapshot
    again = data.draw(st.lists(st.sampled_from(new_rows), max_size=6)) if new_rows else []
    again = [{**r, "user_id": r["user_id"] + (k % 2)} for k, r in enumerate(again)]
    events = events_table(new_rows + again + _rows(old[:3], "o"))
    whole = build_histories(events, first.histories, max_history=max_history)
    streamed = stream_histories(_parts(events, part), first.histories, max_history=max_history, rows=rows)
    examples = [row for table in streamed.examples for row in table.to_pylist()]
    assert streamed.histories.to_pylist() == whole.histories.to_pylist()
    assert examples == whole.examples.to_pylist()
    assert streamed.num_examples == whole.examples.num_rows
    counts = (streamed.duplicates, streamed.duplicates_previous, streamed.evicted, streamed.events)
    assert counts == (whole.duplicates, whole.duplicates_previous, whole.evicted, events.num_rows)


def _scratch_folders() -> set[Path]:
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("gem-features-*"))


def test_the_scratch_folder_goes_once_the_examples_are_read_or_dropped() -> None:
    events = events_table([event(f"e{i}", i % 3, i * 10) for i in range(50)])
    before = _scratch_folders()
    streamed = stream_histories(_parts(events, 7), rows=10)
    assert len(_scratch_folders() - before) == 1  # more than one run: they went to disk
    assert sum(t.num_rows for t in streamed.examples) == 50
    assert _scratch_folders() == before
    dropped = stream_histories(_parts(events, 7), rows=10)
    assert len(_scratch_folders() - before) == 1
    del dropped
    assert _scratch_folders() == before


def test_repeated_hashes_are_found_across_parts_on_disk() -> None:
    scratch = spill.Scratch()
    try:
        found = spill.RepeatedHashes(scratch, rows=4)
        for part in ([1, 2, 3, 2**63 + 5], [4, 5, 3], [2**63 + 5, 9, 9]):
            found.add(pa.array(part, pa.uint64()).to_numpy())
        assert sorted(found.repeated().tolist()) == [3, 9, 2**63 + 5]
    finally:
        scratch.close()
