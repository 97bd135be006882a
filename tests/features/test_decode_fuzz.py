"""No payload can crash the decoders: fuzzing over arbitrary bytes and JSON-ish text.

The property, for both decoders (the batch decoder and ``parse_json_lines``): no
exception escapes, every payload is exactly one event or one dead letter, and the
two agree payload for payload.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.features import reasons
from pipelines.features.decode import decode_events
from pipelines.features.parse import MAX_TIME_MS, parse_json_lines
from pipelines.io.payloads import Payloads
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from tests.features.factories import T0, line, wire

_FIELDS = list(wire())
_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sources(indices: np.ndarray) -> list[str]:
    return [f"f:{int(i)}" for i in indices]


def _both(payloads: list[bytes], max_time_ms: int = MAX_TIME_MS) -> None:
    """Both decoders survive, balance, and agree."""
    expected = parse_json_lines(payloads, _sources(np.arange(len(payloads))), max_time_ms=max_time_ms)
    got = decode_events(Payloads.from_list(payloads), _sources, max_time_ms=max_time_ms)
    assert expected.events.num_rows + expected.dead_letters.num_rows == len(payloads)
    assert got.events.to_pylist() == expected.events.to_pylist()
    assert got.dead_letters.to_pylist() == expected.dead_letters.to_pylist()
    assert set(got.dead_letters.column("reason").to_pylist()) <= set(reasons.ALL)


# Huge integers (Python's json refuses more than 4,300 digits), floats, escapes,
# control characters and lone surrogates, nested arrays and objects.
_NUMBERS = st.one_of(
    st.integers(),
    st.integers(0, 6000).map(lambda n: "9" * (n + 1)),
    st.sampled_from(["1e999", "-1e999", "1E400", "0.0000001", "-0", "1.5e-400", "NaN", "Infinity", "-Infinity"]),
    st.floats().map(repr),
)
_ESCAPES = st.sampled_from(["\\u0000", "\\ud800", "\\udc00", "\\n", '\\"', "\x01", "\\", "\\x"])
_STRINGS = st.lists(st.characters(codec="utf-8").filter(lambda c: c not in '"\\') | _ESCAPES, max_size=12).map(
    lambda parts: '"' + "".join(parts) + '"'
)
_SCALARS = st.one_of(st.sampled_from(["null", "true", "false"]), _NUMBERS.map(str), _STRINGS)


def _jsonish(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return _SCALARS
    inner = _jsonish(depth - 1)
    keys = st.sampled_from([*_FIELDS, "x", "user\\u005fid"]).map(lambda k: f'"{k}"')
    return st.one_of(
        _SCALARS,
        st.lists(inner, max_size=3).map(lambda v: "[" + ",".join(v) + "]"),
        st.lists(st.tuples(keys, inner), max_size=4).map(lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"),
    )


@st.composite
def _events_ish(draw: st.DrawFn) -> bytes:
    """A valid event with some fields replaced by JSON-ish text, repeated or nested deeply."""
    obj: dict[str, Any] = wire(event_id=draw(st.text(min_size=1, max_size=6)))
    parts = [(f'"{k}"', json.dumps(v)) for k, v in obj.items()]
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(parts) - 1))
        parts[at] = (parts[at][0], draw(_jsonish(2)))
    if draw(st.booleans()):  # a repeated key, known or not
        parts.append((draw(st.sampled_from([f'"{k}"' for k in _FIELDS] + ['"x"'])), draw(_SCALARS)))
    if draw(st.integers(0, 5)) == 0:
        depth = draw(st.integers(1, 5000))
        parts.append(('"deep"', "[" * depth + "]" * depth))
    text = "{" + ",".join(f"{k}:{v}" for k, v in parts) + "}"
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 4)) == 0:  # invalid UTF-8 or a control byte somewhere
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x1b", b"\r"])) + raw[at:]
    return raw


@_SETTINGS
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20))
def test_arbitrary_bytes_never_crash(payloads: list[bytes]) -> None:
    _both(payloads)


@_SETTINGS
@given(st.lists(_jsonish(3).map(lambda s: s.encode("utf-8", "surrogatepass")), min_size=1, max_size=10))
def test_arbitrary_json_ish_text_never_crashes(payloads: list[bytes]) -> None:
    _both(payloads)


@_SETTINGS
@given(st.lists(_events_ish(), min_size=1, max_size=10), st.integers(T0 - 1, MAX_TIME_MS))
def test_event_like_payloads_never_crash(payloads: list[bytes], max_time_ms: int) -> None:
    _both([*payloads, line()], max_time_ms)


def _reason(payload: bytes, max_time_ms: int = MAX_TIME_MS) -> str:
    _both([payload], max_time_ms)
    return parse_json_lines([payload], ["f:1"], max_time_ms=max_time_ms).dead_letters.column("reason")[0].as_py()


def test_an_integer_of_5000_digits_is_a_dead_letter_not_a_crash() -> None:
    payload = line().replace(b'"item_id": 7', b'"item_id": ' + b"9" * 5000)
    assert _reason(payload) == reasons.OUT_OF_RANGE
    assert _reason(line()[:-1] + b', "extra": ' + b"1" * 5000 + b"}") == reasons.OUT_OF_RANGE


def test_duplicate_keys_are_dead_letters_on_both_paths() -> None:
    assert _reason(b'{"user_id":1,' + line()[1:].replace(b'"user_id": 1', b'"user_id": 999')) == reasons.DUPLICATE_KEY
    # A repeated key Arrow would ignore, in a payload without the nullable fields:
    # the fast path must not take it as valid.
    obj = wire(is_ad=False, advertiser_id=None)
    del obj["value"], obj["device"]
    text = json.dumps(obj)[:-1] + ', "x": 1, "x": 2}'
    assert text.count(":") <= len(_FIELDS)
    assert _reason(text.encode()) == reasons.DUPLICATE_KEY
    assert _reason(line()[:-1] + b', "ctx": {"a": 1, "a": 2}}') == reasons.DUPLICATE_KEY


def test_events_later_than_the_limit_are_future_time() -> None:
    assert _reason(line(event_time=T0 + 1), max_time_ms=T0) == reasons.FUTURE_TIME
    assert _reason(line(event_time="9999-01-01T00:00:00Z"), max_time_ms=T0) == reasons.FUTURE_TIME
    batch = [line(event_id=f"e{i}", event_time=T0 + i) for i in range(10)]
    result = decode_events(Payloads.from_list(batch), _sources, max_time_ms=T0 + 4)
    assert result.events.num_rows == 5
    assert result.dead_letters.column("reason").to_pylist() == [reasons.FUTURE_TIME] * 5


def test_times_shifted_off_the_calendar_are_bad_timestamps() -> None:
    assert _reason(line(event_time="0001-01-01T00:00:00+01:00")) == reasons.BAD_TIMESTAMP
    assert _reason(line(event_time="9999-12-31T23:59:59-01:00")) == reasons.BAD_TIMESTAMP


def test_enum_spellings_are_still_fast() -> None:
    payloads = [line(surface=s, event_type=e) for s in SURFACES for e in EVENT_TYPES]
    assert decode_events(Payloads.from_list(payloads), _sources).events.num_rows == len(payloads)


def test_the_streaming_job_bounds_times_by_its_own_clock() -> None:
    from pipelines.streaming.config import StreamConfig

    config = StreamConfig(topic="t", output="o", group="g", max_future_s=60.0, clock=lambda: T0 / 1000)
    assert config.max_time_ms() == T0 + 60_000
    late = line(event_time=T0 + 60_001)
    result = decode_events(Payloads.from_list([line(), late]), _sources, max_time_ms=config.max_time_ms())
    assert result.dead_letters.column("reason").to_pylist() == [reasons.FUTURE_TIME]
