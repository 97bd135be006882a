from __future__ import annotations

import json

import pytest

from pipelines.features import reasons
from pipelines.features.parse import MAX_LINE_BYTES, parse_event_time, parse_json_lines
from pipelines.schemas.layouts import DEAD_LETTER, EVENT
from tests.features.factories import T0, line, wire


def _reason_of(payload: bytes) -> str:
    result = parse_json_lines([payload], ["f.jsonl:1"])
    assert result.events.num_rows == 0, f"accepted {payload[:80]!r}"
    return result.dead_letters.column("reason")[0].as_py()


def test_valid_line_becomes_an_event_with_codes() -> None:
    result = parse_json_lines([line()], ["f.jsonl:1"])
    assert result.dead_letters.num_rows == 0
    assert result.events.schema == EVENT.schema
    row = result.events.to_pylist()[0]
    assert (row["surface"], row["event_type"], row["device"]) == (0, 0, 0)
    assert int(row["event_time"].timestamp() * 1000) == T0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"event_id": "x", "user_id"', reasons.INVALID_JSON),
        (b"not json at all", reasons.INVALID_JSON),
        (b"[1, 2, 3]", reasons.NOT_AN_OBJECT),
        (b'"just a string"', reasons.NOT_AN_OBJECT),
        (json.dumps({k: v for k, v in wire().items() if k != "user_id"}).encode(), reasons.MISSING_FIELD),
        (line(user_id="12"), reasons.WRONG_TYPE),
        (line(user_id=True), reasons.WRONG_TYPE),
        (line(is_ad="yes"), reasons.WRONG_TYPE),
        (line(user_id=-1), reasons.OUT_OF_RANGE),
        (line(item_id=2**63), reasons.OUT_OF_RANGE),
        (line(item_category=2**31), reasons.OUT_OF_RANGE),
        (line(event_id=""), reasons.OUT_OF_RANGE),
        (line(surface="Facebook_Feed"), reasons.UNKNOWN_ENUM),
        (line(surface="tiktok"), reasons.UNKNOWN_ENUM),
        (line(event_type="CLICK"), reasons.UNKNOWN_ENUM),
        (line(device="symbian"), reasons.UNKNOWN_ENUM),
        (line(event_time=1.7e12), reasons.BAD_TIMESTAMP),
        (line(event_time="2026-01-01T00:00:00"), reasons.BAD_TIMESTAMP),
        (line(event_time=-5), reasons.BAD_TIMESTAMP),
        (line(event_time="yesterday"), reasons.BAD_TIMESTAMP),
        (line(event_time=None), reasons.BAD_TIMESTAMP),
        (line().replace(b'"value": 1.5', b'"value": NaN'), reasons.NON_FINITE),
        (line().replace(b'"value": 1.5', b'"value": Infinity'), reasons.NON_FINITE),
        (line().replace(b'"value": 1.5', b'"value": 1e400'), reasons.NON_FINITE),
        (line(value=1e39), reasons.OUT_OF_RANGE),
        (line().replace(b'"value": 1.5', b'"value": 1' + b"0" * 400), reasons.OUT_OF_RANGE),
        (line(value="3.5"), reasons.WRONG_TYPE),
        (line(advertiser_id=None), reasons.AD_WITHOUT_ADVERTISER),
        (line(is_ad=False), reasons.ORGANIC_WITH_ADVERTISER),
        (line()[:10] + b"\x00" + line()[10:], reasons.NUL_BYTE),
        (b'{"event_id": "\xff\xfe"}', reasons.INVALID_UTF8),
        (line(event_id="x")[:-1].replace(b'"x"', b'"a\\ud800b"') + b"}", reasons.INVALID_UTF8),
        (b'{"a": "' + b"x" * MAX_LINE_BYTES + b'"}', reasons.LINE_TOO_LONG),
    ],
)
def test_bad_payload_gets_its_reason(payload: bytes, reason: str) -> None:
    assert _reason_of(payload) == reason


def test_every_payload_lands_exactly_once_with_its_source() -> None:
    payloads = [line(event_id=f"e{i}") for i in range(5)] + [b"{", b"[]", line(user_id=-3)]
    sources = [f"f.jsonl:{i + 1}" for i in range(len(payloads))]
    result = parse_json_lines(payloads, sources)
    assert result.events.num_rows == 5
    assert result.dead_letters.schema == DEAD_LETTER.schema
    assert result.dead_letters.column("source").to_pylist() == ["f.jsonl:6", "f.jsonl:7", "f.jsonl:8"]
    assert result.dead_letters.column("payload").to_pylist() == payloads[5:]


def test_huge_payload_is_truncated_in_the_dead_letter() -> None:
    result = parse_json_lines([b"[" + b"1," * MAX_LINE_BYTES + b"1]"], ["f:1"])
    kept = result.dead_letters.column("payload")[0].as_py()
    assert len(kept) < MAX_LINE_BYTES
    assert "truncated" in result.dead_letters.column("detail")[0].as_py()


def test_iso_timestamps_with_zone_are_accepted() -> None:
    assert parse_event_time("2026-01-01T00:00:00Z") == T0
    assert parse_event_time("2026-01-01T01:00:00+01:00") == T0


def test_optional_fields_may_be_absent() -> None:
    obj = {k: v for k, v in wire().items() if k not in ("value", "device")}
    result = parse_json_lines([json.dumps(obj).encode()], ["f:1"])
    row = result.events.to_pylist()[0]
    assert row["value"] is None and row["device"] is None
