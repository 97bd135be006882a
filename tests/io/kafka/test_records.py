"""parse_records reads record batches exactly as kafka-python's own reader does (batches built by its
builders: plain, gzip, with headers, null keys and values, control and legacy batches, cut short)."""

from __future__ import annotations

import struct
from unittest import mock

import numpy as np
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from pipelines.features.decode import decode_events
from pipelines.io.kafka import records as records_module
from pipelines.io.kafka.records import CorruptBatchError, RecordsError, parse_records
from pipelines.io.payloads import Payloads
from tests.features.factories import line

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
T_MS = 1_767_225_600_000
_CONTROL_BIT = 0x20


def _batch(base: int, records: list[Record], codec: int = 0, offset_step: int = 1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (key, value, headers) in enumerate(records):
        builder.append(i * offset_step, timestamp=T_MS + i, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)  # the broker sets the base offset (outside the CRC)
    return bytes(data)


def _resealed(batch: bytearray) -> bytes:
    """A batch edited in its CRC-covered bytes (from the attributes on), with its CRC-32C recomputed."""
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def _reference(buffer: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every data record, by kafka-python's reader; null values as b""."""
    got, records = [], MemoryRecords(buffer)
    while (batch := records.next_batch()) is not None:
        if getattr(batch, "is_control_batch", False):
            continue
        got += [(r.offset, bytes(r.value) if r.value is not None else b"") for r in batch]
    return got


def _parsed(buffer: bytes, start: int = 0, stop: int = 1 << 62) -> list[tuple[int, bytes]]:
    records = parse_records(buffer, start, stop)
    assert records.offsets.dtype == np.int64 and len(records.offsets) == len(records.payloads)
    return [(int(o), records.payloads.get(i)) for i, o in enumerate(records.offsets)]


_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.builds(lambda n: line(event_id=f"e{n}"), st.integers(0, 99)),
    st.binary(max_size=8).map(lambda b: b + b"}"),
)
_RECORDS = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=6)),
        _VALUES,
        st.one_of(st.just([]), st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=3)), max_size=2)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_RECORDS, st.sampled_from([0, 1]), st.sampled_from([1, 2])), min_size=1, max_size=4),
    st.sampled_from([1, 1000]),
    st.data(),
)
def test_equals_kafka_pythons_reader(
    batches: list[tuple[list[Record], int, int]], guess_from: int, data: st.DataObject
) -> None:
    """Both ways to find the records (guessed and verified from 1 record, always walked from 1,000)."""
    with mock.patch.object(records_module, "_GUESS_FROM", guess_from):
        _check_against_kafka_python(batches, data)


def _check_against_kafka_python(batches: list[tuple[list[Record], int, int]], data: st.DataObject) -> None:
    buffer, base = b"", 100
    for records, codec, step in batches:
        buffer += _batch(base, records, codec, step)
        base += (len(records) - 1) * step + 1
    expected = _reference(buffer)
    assert _parsed(buffer) == expected
    # A window of offsets, and a response cut anywhere: the complete batches before the cut.
    start, stop = sorted(data.draw(st.lists(st.integers(99, base + 1), min_size=2, max_size=2)))
    assert _parsed(buffer, start, stop) == [(o, v) for o, v in expected if start <= o < stop]
    cut = data.draw(st.integers(0, len(buffer)))
    assert _parsed(buffer[:cut]) == _reference(buffer[:cut])


def test_next_offset_passes_control_batches_and_stops_before_a_cut_batch() -> None:
    first = _batch(0, [(b"k", line(), [])] * 3)
    control = bytearray(_batch(3, [(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00", [])]))
    struct.pack_into(">h", control, 21, struct.unpack_from(">h", control, 21)[0] | _CONTROL_BIT)
    control = bytearray(_resealed(control))
    last = _batch(4, [(b"k", line(), [])] * 2)
    whole = first + bytes(control) + last
    assert parse_records(whole, 0, 100).next_offset == 6
    assert list(parse_records(whole, 0, 100).offsets) == [0, 1, 2, 4, 5]
    assert parse_records(first + bytes(control), 0, 100).next_offset == 4  # only the marker after the data
    cut = parse_records(whole[:-1], 0, 100)
    assert list(cut.offsets) == [0, 1, 2] and cut.next_offset == 4
    assert parse_records(b"", 7, 100).next_offset == 7


def test_legacy_message_sets_are_read_by_kafka_python() -> None:
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for offset in range(3):
        builder.append(offset + 40, timestamp=T_MS, key=None, value=line(event_id=f"v1-{offset}"))
    buffer = bytes(builder.build())
    assert _parsed(buffer) == _reference(buffer) == [(40 + i, line(event_id=f"v1-{i}")) for i in range(3)]
    assert parse_records(buffer, 0, 100).next_offset == 43


def test_payloads_decode_like_the_same_values_laid_end_to_end() -> None:
    values = [line(event_id=f"p{i}", user_id=i) for i in range(50)] + [b"not json", b"", line(event_id="")]
    buffer = _batch(0, [(str(i).encode(), v, []) for i, v in enumerate(values[:30])]) + _batch(
        30, [(None, v, [("h", b"x")]) for v in values[30:]]
    )
    records = parse_records(buffer, 0, 100)
    assert records.payloads.data.count(b"\n") == len(values)  # one separator per payload, blanks between

    def sources(indices: np.ndarray) -> list[str]:
        return [f"kafka:t/0/{int(i)}" for i in indices]

    got, expected = decode_events(records.payloads, sources), decode_events(Payloads.from_list(values), sources)
    assert got.events.to_pylist() == expected.events.to_pylist()
    assert got.dead_letters.to_pylist() == expected.dead_letters.to_pylist()
    assert len(got.dead_letters) == 3
    sliced = records.payloads.slice(10, 40)
    assert sliced.take(np.arange(30)) == values[10:40]
    assert records.payloads.select(np.asarray([0, 31, 52])).take(np.arange(3)) == [values[0], values[31], values[52]]


def test_a_record_longer_than_its_batch_is_corrupt() -> None:
    buffer = bytearray(_batch(0, [(b"k", b"abc", [])] * 2))
    buffer[61] = 0x7E  # the first record's length varint: 63 bytes, past the batch's end
    with pytest.raises(RecordsError):
        parse_records(bytes(buffer), 0, 10)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_flipped_bit_anywhere_under_the_crc_fails_the_batch(data: st.DataObject) -> None:
    good = _batch(10, [(b"k", line(event_id=f"c{i}"), []) for i in range(20)])
    bad = bytearray(_batch(30, [(b"k", line(event_id=f"d{i}"), []) for i in range(20)]))
    at = data.draw(st.integers(21, len(bad) - 1))
    bad[at] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptBatchError, match=r"batch at offset 30 fails its CRC-32C"):
        parse_records(good + bytes(bad), 0, 1 << 62)
    assert len(parse_records(good, 0, 1 << 62).offsets) == 20
