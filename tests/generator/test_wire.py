"""JSONL encoding and the malformed lines: good lines are valid events, bad ones are not."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.generator import GeneratedEvents, corrupt, jsonl
from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT
from tests.generator.wirecheck import wire_problem


def _lines(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    assert raw.endswith(b"\n")
    return raw[:-1].split(b"\n")


def test_lines_are_wire_events_equal_to_the_table(small: GeneratedEvents, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    jsonl.write_jsonl(path, jsonl.encode_lines(small.events), [], np.zeros(0, dtype=np.int64))
    lines = _lines(path)
    assert len(lines) == small.events.num_rows
    expected = corrupt.wire_records(small.events)
    for raw, want in zip(lines, expected, strict=True):
        assert wire_problem(raw) is None, raw
        got = json.loads(raw)
        assert list(got) == EVENT.schema.names
        value = got.pop("value")
        want_value = want.pop("value")
        assert got == want
        assert (value is None and want_value is None) or np.float32(value) == np.float32(want_value)


def test_enums_are_lower_case_names_and_time_is_integer_ms(small: GeneratedEvents) -> None:
    lines = jsonl.encode_lines(small.events.slice(0, 300)).to_pylist()
    objects = [json.loads(line) for line in lines]
    assert {o["surface"] for o in objects} <= set(SURFACES)
    assert {o["event_type"] for o in objects} <= set(EVENT_TYPES)
    assert {o["device"] for o in objects} <= {*DEVICES, None}
    assert all(type(o["event_time"]) is int for o in objects)
    assert all(o["advertiser_id"] is None for o in objects if not o["is_ad"])


def test_bad_lines_are_inserted_where_asked(small: GeneratedEvents, tmp_path: Path) -> None:
    events = small.events.slice(0, 50)
    bad = [b"not json", b"[1]", b'{"x":1}']
    path = tmp_path / "mixed.jsonl.gz"
    written = jsonl.write_jsonl(path, jsonl.encode_lines(events), bad, np.array([0, 10, 50]))
    lines = _lines(path)
    assert written == len(lines) == 53
    assert [lines[0], lines[11], lines[52]] == bad
    good = [line for i, line in enumerate(lines) if i not in (0, 11, 52)]
    assert [json.loads(line)["event_id"] for line in good] == events["event_id"].to_pylist()


def test_every_kind_of_bad_line_is_malformed(small: GeneratedEvents) -> None:
    bad = corrupt.bad_lines(small.events, 2_000, np.random.default_rng(5))
    kinds = Counter(kind for kind, _ in bad)
    assert set(kinds) == {*corrupt.KINDS, corrupt.OVERSIZED}
    assert kinds[corrupt.OVERSIZED] == 2  # rare: one per 2,000, plus one
    for kind, raw in bad:
        assert b"\n" not in raw, kind
        assert wire_problem(raw) is not None, (kind, raw[:300])
    assert all(len(raw) > corrupt.MAX_LINE_BYTES for kind, raw in bad if kind == corrupt.OVERSIZED)


def test_bad_lines_are_deterministic(small: GeneratedEvents) -> None:
    first = corrupt.bad_lines(small.events, 300, np.random.default_rng(9))
    assert first == corrupt.bad_lines(small.events, 300, np.random.default_rng(9))
    assert first != corrupt.bad_lines(small.events, 300, np.random.default_rng(10))


@pytest.mark.parametrize("count", [0, 1, 49])
def test_few_bad_lines_have_no_oversized_one(small: GeneratedEvents, count: int) -> None:
    bad = corrupt.bad_lines(small.events, count, np.random.default_rng(1))
    assert len(bad) == count
    assert all(kind != corrupt.OVERSIZED for kind, _ in bad)


def test_insert_positions_must_be_sorted(small: GeneratedEvents, tmp_path: Path) -> None:
    lines = jsonl.encode_lines(small.events.slice(0, 5))
    with pytest.raises(ValueError):
        jsonl.write_jsonl(tmp_path / "x.jsonl", lines, [b"a", b"b"], np.array([3, 1]))
    assert isinstance(lines, pa.LargeStringArray)
