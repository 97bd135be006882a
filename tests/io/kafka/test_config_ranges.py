"""Pure parts of the Kafka package: connection settings, positions, ranges, encoders, pacing."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.cli.produce import Pacer
from pipelines.errors import ConfigError
from pipelines.features.parse import parse_json_lines
from pipelines.io.kafka.config import KafkaConnection, add_connection_arguments, connection_from_args
from pipelines.io.kafka.encode import dead_letters_to_json, events_to_wire
from pipelines.io.kafka.ranges import PartitionRange, Position, resolve_ranges, split_ranges
from tests.features.factories import T0, line


def test_connection_maps_to_both_clients(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    conn = KafkaConnection(
        bootstrap_servers=("b1:9093", "b2:9093"),
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="s3cr3t-pw",
        ssl_cafile=str(ca),
    )
    kp = conn.kafka_python()
    assert kp["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert (kp["security_protocol"], kp["sasl_mechanism"], kp["sasl_plain_username"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "u",
    )
    assert kp["ssl_cafile"] == str(ca)
    rd = conn.librdkafka()
    assert rd["bootstrap.servers"] == "b1:9093,b2:9093" and rd["security.protocol"] == "sasl_ssl"
    assert rd["sasl.password"] == "s3cr3t-pw" and rd["ssl.ca.location"] == str(ca)
    assert "s3cr3t-pw" not in repr(conn)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"bootstrap_servers": ("nohost",)}, "--bootstrap-servers"),
        ({"bootstrap_servers": ()}, "--bootstrap-servers"),
        ({"security_protocol": "TLS"}, "--security-protocol"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u"}, "--sasl-mechanism"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"}, "--sasl-mechanism"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}, "--sasl-username"),
        ({"ssl_cafile": "/nowhere.pem"}, "--ssl-cafile"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nowhere.pem"}, "--ssl-cafile"),
    ],
)
def test_connection_mistakes_name_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ConfigError) as error:
        KafkaConnection(**kwargs)
    assert error.value.flag == flag
    assert "Fix:" in str(error.value)


def test_connection_from_flags_reads_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEM_KAFKA_SASL_PASSWORD", "from-env")
    parser = argparse.ArgumentParser()
    add_connection_arguments(parser)
    args = parser.parse_args(
        [
            "--bootstrap-servers",
            "a:1, b:2",
            "--security-protocol",
            "SASL_PLAINTEXT",
            "--sasl-mechanism",
            "PLAIN",
            "--sasl-username",
            "gem",
        ]
    )
    conn = connection_from_args(args)
    assert conn.bootstrap_servers == ("a:1", "b:2")
    assert conn.sasl_password == "from-env"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Position("offset", 0)),
        ("1234", Position("offset", 1234)),
        ("earliest", Position("earliest")),
        ("LATEST", Position("latest")),
        ("2026-01-01T00:00:00Z", Position("time", T0)),
        ("2026-01-01T01:00:00+01:00", Position("time", T0)),
        ("2026-01-01", Position("time", T0)),
    ],
)
def test_position_parse(text: str, expected: Position) -> None:
    assert Position.parse(text, "--from") == expected


@pytest.mark.parametrize("text", ["-1", "yesterday", "2026-01-01T00:00:00", "1.5"])
def test_position_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--to"):
        Position.parse(text, "--to")


class FakeLookup:
    """Partition p holds offsets [10*p, 100+p); message o has timestamp 1000 + o."""

    def partitions(self, topic: str) -> Sequence[int]:
        return [0, 1, 2] if topic == "t" else []

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, tuple[int, int]]:
        return {p: (10 * p, 100 + p) for p in partitions}

    def offsets_at(self, topic: str, partitions: Sequence[int], time_ms: int) -> Mapping[int, int | None]:
        return {p: (max(time_ms - 1000, 10 * p) if time_ms - 1000 < 100 + p else None) for p in partitions}


def test_resolve_ranges_by_offset_time_and_ends() -> None:
    lookup = FakeLookup()
    whole = resolve_ranges(lookup, "t", Position("earliest"), Position("latest"))
    assert whole == [PartitionRange("t", 0, 0, 100), PartitionRange("t", 1, 10, 101), PartitionRange("t", 2, 20, 102)]
    by_offset = resolve_ranges(lookup, "t", Position("offset", 15), Position("offset", 50), [1, 2])
    assert by_offset == [PartitionRange("t", 1, 15, 50), PartitionRange("t", 2, 20, 50)]
    by_time = resolve_ranges(lookup, "t", Position("time", 1050), Position("time", 5000))
    assert [(r.start, r.stop) for r in by_time] == [(50, 100), (50, 101), (50, 102)]
    inverted = resolve_ranges(lookup, "t", Position("offset", 60), Position("offset", 30))
    assert all(r.size == 0 for r in inverted)


def test_resolve_ranges_errors() -> None:
    with pytest.raises(ConfigError, match="--topic"):
        resolve_ranges(FakeLookup(), "missing", Position("earliest"), Position("latest"))
    with pytest.raises(ConfigError, match="--partitions"):
        resolve_ranges(FakeLookup(), "t", Position("earliest"), Position("latest"), [7])


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=5), st.integers(1, 20))
def test_split_ranges_cover_each_offset_once(bounds: list[tuple[int, int]], most: int) -> None:
    ranges = [PartitionRange("t", p, min(a, b), max(a, b)) for p, (a, b) in enumerate(bounds)]
    pieces = split_ranges(ranges, most)
    assert all(0 < piece.size <= most for piece in pieces)
    covered = sorted((p.partition, o) for p in pieces for o in range(p.start, p.stop))
    assert covered == sorted((r.partition, o) for r in ranges for o in range(r.start, r.stop))


def test_events_round_trip_through_the_wire_encoder() -> None:
    payloads = [
        line(
            event_id=f"e{i}",
            device=[None, "ios", "web"][i % 3],
            value=[None, 2.5, 0.1][i % 3],
            is_ad=bool(i % 2),
            advertiser_id=7 if i % 2 else None,
        )
        for i in range(30)
    ]
    events = parse_json_lines(payloads, ["x"] * 30).events
    again = parse_json_lines(events_to_wire(events), ["y"] * 30)
    assert again.dead_letters.num_rows == 0
    assert again.events.equals(events)


def test_dead_letters_encode_payload_as_base64() -> None:
    import base64
    import json

    dead = parse_json_lines([b"\xff{oops"], ["kafka:t/0/9"]).dead_letters
    [(key, value)] = dead_letters_to_json(dead)
    obj = json.loads(value)
    assert key is None and obj["source"] == "kafka:t/0/9" and obj["reason"] == "invalid_utf8"
    assert base64.b64decode(obj["payload_base64"]) == b"\xff{oops"


def test_pacer_holds_the_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = Pacer(100.0, clock=lambda: now[0], sleep=sleep)
    pacer.wait(50)
    assert slept == [0.5]
    now[0] += 1.0
    pacer.wait(100)  # already behind: no sleep
    assert slept == [0.5]
    Pacer(0.0, clock=lambda: now[0], sleep=sleep).wait(10**6)
    assert slept == [0.5]
