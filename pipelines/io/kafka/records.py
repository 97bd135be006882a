"""Kafka record batches (the log's v2 format) → offsets and payloads, one fetch response at a time.

kafka-python's consumer makes a Python object of every record;
:func:`parse_records` reads a whole fetch response with a few numpy passes:

1. batch headers are read one by one (a response holds a few batches of
   thousands of records each); control batches are skipped, compressed ones
   inflated with kafka-python's codecs, legacy (v0/v1) ones handed to
   kafka-python's own reader;
2. record boundaries: each record starts with its length (a zigzag varint), so
   finding them is a walk. The walk is *guessed* in one numpy pass, from where
   a JSON value closes (``}``) right before a zero header count, and the guess
   is then *verified*: decoding every guessed record's length must lead exactly
   from one guessed start to the next and end where the batch ends, which is
   the walk itself. A batch the guess does not fit (headers, other payloads) is
   walked in Python, record by record: slower, same answer;
3. the fields before each value (attributes, timestamp and offset deltas, key)
   are decoded for all records at once;
4. the payloads stay where they are: one copy of the response from its first
   to its last value, with the byte after each value (the record's header
   count) set to ``\\n`` and every other byte between two values (record and
   batch headers, keys) set to a space, is a :class:`Payloads` that Arrow's
   JSON reader takes as it is.

Every v2 batch's CRC-32C (over its bytes from the attributes to its end) is
checked before any of its records is used, whole batch at once by the ``crc32c``
package's C code (hardware instructions where the CPU has them); a mismatch
raises :class:`CorruptBatchError` naming the batch's offset. A batch whose
structure does not add up raises :class:`RecordsError`. Legacy (v0/v1) message
sets go to kafka-python's reader, which checks their CRC-32.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np
from crc32c import crc32c

from pipelines.errors import PipelinesError
from pipelines.io.payloads import Payloads

__all__ = ["CorruptBatchError", "Records", "RecordsError", "parse_records"]

#: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
#: baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
#: baseOffset and batchLength (the length of what follows them), in every format.
_ENTRY = struct.Struct(">qi")
_LOG_OVERHEAD = _ENTRY.size
_MAGIC_AT = 16
#: The CRC field, and where the bytes it covers begin (the attributes).
_CRC_AT, _CRC_FROM = 17, 21
_CONTROL = 0x20
_CODEC = 0x07
_CLOSE, _ZERO = ord("}"), 0
#: Smaller batches are walked in Python (cheap for few records), not guessed (a numpy pass and a dozen calls).
_GUESS_FROM = 16


class RecordsError(PipelinesError):
    """Records this reader cannot read: lengths that do not add up (a broken response or log), or a
    compression codec whose Python package is missing."""


class CorruptBatchError(RecordsError):
    """A record batch whose CRC-32C does not match its bytes (corrupted on disk or on the wire)."""


@dataclass(frozen=True)
class Records:
    """The records of a response at offsets ``[start, stop)``: ``offsets`` ``(n,)`` int64, their payloads
    (a null value is an empty payload), and ``next_offset``, where the next fetch starts (past the
    last complete batch, control batches included)."""

    offsets: np.ndarray
    payloads: Payloads
    next_offset: int


@dataclass(frozen=True)
class _Segment:
    """Values in one buffer: value ``i`` is ``buffer[starts[i] : starts[i] + lengths[i]]``."""

    buffer: bytes
    offsets: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    def keep(self, start: int, stop: int) -> _Segment:
        mask = (self.offsets >= start) & (self.offsets < stop)
        if mask.all():
            return self
        return _Segment(self.buffer, self.offsets[mask], self.starts[mask], self.lengths[mask])


def parse_records(buffer: bytes, start: int, stop: int, *, check_crc: bool = True) -> Records:
    """The records of a fetch response's ``records`` bytes whose offsets lie in ``[start, stop)``.

    A trailing incomplete batch (the broker cuts responses at the byte limit) is
    left for the next fetch; ``next_offset`` is never below ``start``. ``check_crc=False``
    only exists so that ``bench/kafka.py`` can state the check's cost.
    """
    segments, next_offset = _segments(buffer, start, check_crc)
    kept = [s for s in (seg.keep(start, stop) for seg in segments) if len(s.offsets)]
    offsets = np.concatenate([s.offsets for s in kept]) if kept else np.zeros(0, np.int64)
    return Records(offsets, Payloads.concat([_payloads(s) for s in kept]), next_offset)


def check_batch_crc(buffer: bytes, pos: int, end: int) -> None:
    """Raise :class:`CorruptBatchError` unless the v2 batch ``buffer[pos:end]`` matches its CRC-32C."""
    (stored,) = struct.unpack_from(">I", buffer, pos + _CRC_AT)
    computed = crc32c(memoryview(buffer)[pos + _CRC_FROM : end])
    if computed != stored:
        (base,) = struct.unpack_from(">q", buffer, pos)
        raise CorruptBatchError(
            f"the record batch at offset {base} fails its CRC-32C check (stored {stored:#010x}, computed "
            f"{computed:#010x}): it was corrupted on disk or on the wire; its records were not used"
        )


def _segments(buffer: bytes, start: int, check_crc: bool = True) -> tuple[list[_Segment], int]:
    """Values of every complete batch in offset order (plain batches of ``buffer`` as one segment), and
    the offset after the last complete batch."""
    raw = np.frombuffer(buffer, dtype=np.uint8)
    closers: np.ndarray | None = None  # found once per buffer, when a batch big enough to guess needs them
    pieces: list[_Bounds | _Segment] = []
    pos, next_offset = 0, start
    while pos + _MAGIC_AT < len(buffer):
        base, length = _ENTRY.unpack_from(buffer, pos)
        end = pos + _LOG_OVERHEAD + length
        if end > len(buffer):
            break
        if buffer[pos + _MAGIC_AT] < 2:  # a legacy message; its offset is its last inner record's
            pieces.append(_legacy(buffer[pos:end]))
            next_offset = max(next_offset, base + 1)
            pos = end
            continue
        if end - pos < _HEADER.size:
            raise RecordsError(f"the batch at offset {base} is shorter than its header")
        if check_crc:
            check_batch_crc(buffer, pos, end)
        *_, attributes, last_delta, _, _, _, _, _, count = _HEADER.unpack_from(buffer, pos)
        if not attributes & _CONTROL and count > 0:
            if attributes & _CODEC:
                inflated = _inflate(attributes & _CODEC, buffer[pos + _HEADER.size : end])
                flat = np.frombuffer(inflated, np.uint8)
                guess = _closers(flat) if count >= _GUESS_FROM else None
                pieces.append(_bounds(inflated, flat, guess, 0, len(inflated), base, count))
            else:
                if count >= _GUESS_FROM and closers is None:
                    closers = _closers(raw)
                pieces.append(_bounds(buffer, raw, closers, pos + _HEADER.size, end, base, count))
        next_offset = max(next_offset, base + last_delta + 1)
        pos = end
    return [_fields(p) if isinstance(p, _Bounds) else p for p in _merged(pieces)], next_offset


def _closers(raw: np.ndarray) -> np.ndarray:
    """Where a ``}`` is followed by a zero byte: a JSON value's end before a record's zero header count."""
    braces = np.flatnonzero(raw[:-1] == _CLOSE)
    return braces[raw[braces + 1] == _ZERO]


class _Bounds(NamedTuple):  # a NamedTuple: one per batch, and cheaper to make than a frozen dataclass
    """The records of batches in ``raw`` (a view of ``buffer``): record ``i``'s body (after its length)
    starts at ``bodies[i]`` and holds ``sizes[i]`` bytes; batch ``j`` holds ``counts[j]`` records from
    base offset ``bases[j]``. Walked batches give lists, guessed ones arrays."""

    buffer: bytes
    raw: np.ndarray
    bodies: list[np.ndarray | list[int]]
    sizes: list[np.ndarray | list[int]]
    bases: list[int]
    counts: list[int]


def _bounds(
    buffer: bytes, raw: np.ndarray, closers: np.ndarray | None, begin: int, end: int, base: int, count: int
) -> _Bounds:
    """The ``count`` records laid in ``buffer[begin:end]``: guessed when ``closers`` are given, else walked."""
    found = _guess(raw, closers, begin, end, count) if closers is not None else None
    bodies, sizes = found or _walk(buffer, begin, end, count)
    return _Bounds(buffer, raw, [bodies], [sizes], [base], [count])


def _merged(pieces: list[_Bounds | _Segment]) -> list[_Bounds | _Segment]:
    """Runs of records in the same buffer (a response's plain batches) joined, so their fields are
    decoded and their values copied once; legacy segments stay as they are."""
    merged: list[_Bounds | _Segment] = []
    for _, group in itertools.groupby(pieces, key=lambda p: (type(p), id(p.buffer))):
        run = list(group)
        if len(run) == 1 or not isinstance(run[0], _Bounds):
            merged += run
            continue
        bounds = cast(list[_Bounds], run)  # the group key holds the type
        merged.append(
            _Bounds(
                bounds[0].buffer,
                bounds[0].raw,
                [x for b in bounds for x in b.bodies],
                [x for b in bounds for x in b.sizes],
                [x for b in bounds for x in b.bases],
                [x for b in bounds for x in b.counts],
            )
        )
    return merged


def _flat(parts: list[np.ndarray | list[int]]) -> np.ndarray:
    if all(isinstance(part, list) for part in parts):
        return np.fromiter(itertools.chain.from_iterable(parts), np.int64)
    return np.concatenate([np.asarray(part, np.int64) for part in parts])


def _fields(bounds: _Bounds) -> _Segment:
    """Offsets and where the values are, from the fields before each value (all records at once)."""
    raw, bodies, sizes = bounds.raw, _flat(bounds.bodies), _flat(bounds.sizes)
    at = bodies + 1  # the attributes byte
    at += _varints(raw, at, 10)[1]  # timestampDelta
    offset_delta, n = _varints(raw, at, 5)
    at += n
    key_length, n = _varints(raw, at, 5)
    at += n + np.maximum(key_length, 0)
    value_length, n = _varints(raw, at, 5)
    at += n
    value_length = np.maximum(value_length, 0)  # null (-1) → an empty payload
    # The byte after each value (the header count) becomes its separator, so it must lie in its record.
    if ((at + value_length) >= bodies + sizes).any():
        raise RecordsError("a record's value runs past its end")
    return _Segment(bounds.buffer, np.repeat(bounds.bases, bounds.counts) + offset_delta, at, value_length)


def _guess(
    raw: np.ndarray, closers: np.ndarray, begin: int, end: int, count: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(bodies, sizes) of the records if each ends with ``}`` + a zero header count, else None."""
    ends = closers[np.searchsorted(closers, begin) : np.searchsorted(closers, end - 1)] + 2
    if len(ends) != count or ends[-1] != end:
        return None
    starts = np.concatenate([[begin], ends[:-1]])
    sizes, n = _varints(raw, starts, 5)
    bodies = starts + n
    if not np.array_equal(bodies + sizes, ends):
        return None
    return bodies, sizes


def _walk(buffer: bytes, begin: int, end: int, count: int) -> tuple[list[int], list[int]]:
    """(bodies, sizes) of the records by reading each one's length in turn."""
    bodies, sizes = [0] * count, [0] * count
    pos = begin
    for i in range(count):
        value = shift = 0
        while True:
            if pos >= end:
                raise RecordsError(f"record {i} of {count} runs past its batch")
            byte = buffer[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        size = (value >> 1) ^ -(value & 1)
        if size < 0:
            raise RecordsError(f"record {i} of {count} has a negative length")
        bodies[i], sizes[i] = pos, size
        pos += size
    if pos != end:
        raise RecordsError(f"{count} records fill {pos - begin} bytes of a {end - begin}-byte batch")
    return bodies, sizes


def _varints(raw: np.ndarray, at: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, sizes) of the zigzag varints starting at ``at`` (at most ``width`` bytes each).

    Byte ``k`` is read only for the varints still going after ``k`` bytes (most are one or two long).
    """
    last = len(raw) - 1
    byte = raw[np.minimum(at, last)]
    value = (byte & 0x7F).astype(np.int64)
    size = np.ones(len(at), np.int64)
    going = np.flatnonzero(byte >= 0x80)
    for k in range(1, width + 1):
        if not len(going):
            break
        if k == width:
            raise RecordsError(f"a varint is longer than {width} bytes")
        byte = raw[np.minimum(at[going] + k, last)]
        value[going] |= (byte & 0x7F).astype(np.int64) << (7 * k)
        size[going] += 1
        going = going[byte >= 0x80]
    if (at + size > len(raw)).any():
        raise RecordsError("a varint runs past its record")
    bits = value.view(np.uint64)
    return ((bits >> np.uint64(1)) ^ (np.uint64(0) - (bits & np.uint64(1)))).view(np.int64), size


def _payloads(segment: _Segment) -> Payloads:
    """The segment's values as Payloads, in one copy: separators after them, blanks between them."""
    if not len(segment.starts):
        return Payloads.from_list([])
    first = int(segment.starts[0])
    starts = segment.starts - first
    seps = starts + segment.lengths
    region = bytearray(memoryview(segment.buffer)[first : first + int(seps[-1]) + 1])
    view = np.frombuffer(region, np.uint8)
    gap_starts, gap_lengths = seps[:-1] + 1, starts[1:] - seps[:-1] - 1
    if (gap_lengths < 0).any():
        raise RecordsError("record values overlap")
    total = int(gap_lengths.sum())
    if total:
        before = np.cumsum(gap_lengths) - gap_lengths
        view[np.repeat(gap_starts - before, gap_lengths) + np.arange(total)] = ord(" ")
    view[seps] = ord("\n")
    return Payloads(bytes(region), starts, segment.lengths)


#: Compression codec id → (kafka-python's name for it, what it needs installed).
_CODECS = {
    1: ("gzip", "a Python built with zlib"),
    2: ("snappy", "pip install python-snappy"),
    3: ("lz4", "pip install lz4"),
    4: ("zstd", "pip install zstandard"),
}


def _inflate(codec: int, data: bytes) -> bytes:
    """A compressed batch's records, with the codec kafka-python uses for it."""
    from kafka import codec as codecs

    if codec not in _CODECS:
        raise RecordsError(f"unknown compression codec {codec}")
    name, package = _CODECS[codec]
    if not getattr(codecs, f"has_{name}")():
        raise RecordsError(f"the topic holds {name}-compressed batches, which need: {package}")
    return bytes(getattr(codecs, f"{name}_decode")(data))


def _legacy(batch: bytes) -> _Segment:
    """A v0/v1 message set, read by kafka-python's own record reader (one Python object per record)."""
    from kafka.record import MemoryRecords

    offsets: list[int] = []
    values: list[bytes] = []
    records = MemoryRecords(batch)
    while (legacy := records.next_batch()) is not None:
        for record in legacy:
            offsets.append(record.offset)
            values.append(bytes(record.value) if record.value is not None else b"")
    joined = Payloads.from_list(values)
    return _Segment(joined.data, np.asarray(offsets, np.int64), joined.starts, joined.lengths)
