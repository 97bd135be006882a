"""Decode a batch of JSON wire-format payloads into Arrow, a whole batch at a time.

:func:`decode_events` gives exactly what
:func:`pipelines.features.parse.parse_json_lines` gives for the same payloads
(same events in the same order, same dead letters in the same order), but
parses the batch with Arrow's C++ JSON reader and checks the rules with Arrow
compute kernels, so the common case does no per-field Python work. Anything the
fast path cannot prove valid goes to ``parse_json_lines``, which stays the
single definition of the rules:

1. vectorised pre-checks mark a payload *suspect* when Arrow's reader could
   disagree with Python's ``json`` on it: a size outside ``[2, MAX_LINE_BYTES]``;
   not ``{`` first and ``}`` last; a second ``{`` (so one line is one object);
   a NUL, CR or LF byte inside; a ``NaN``/``Infinity`` token; invalid UTF-8
   anywhere (Arrow checks only the fields it keeps); more ``[`` than
   ``_MAX_OPENERS`` (Python's ``json`` fails on deep nesting, Arrow does not);
   more ``:`` than the wire format has fields (an extra key, which might repeat);
   an ISO-string ``event_time`` (canonical times are integers);
2. the other payloads are streamed through Arrow (4 MiB blocks; 64 KiB ones
   after the first rejection); a payload that Arrow rejects (its error names the
   row) is marked and reading resumes after it, so a bad message costs one block
   of re-parsing, not the batch;
3. rows that fail a vectorised rule, and every suspect or rejected payload, go
   to ``parse_json_lines`` in payload order, which gives reasons and details.

Duplicate keys cannot pass the fast path: Arrow's reader rejects a repeated
schema field ("specified twice") and, with ``unexpected_field_behavior="error"``,
any key outside the wire format, so an object it accepts has each key once.

Cost: a clean batch is one pass of Arrow's reader plus a dozen kernelsxx
and at most one 64 KiB block re-read. ``tests/features/test_decode.py`` checks the
equivalence with hypothesis.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipelines.features.parse import (
    FLOAT32_MAX,
    INT32_MAX,
    MAX_EVENT_ID_CHARS,
    MAX_LINE_BYTES,
    MAX_TIME_MS,
    ParseResult,
    Reject,
    parse_json_lines,
)
from pipelines.io.deadletters import dead_letter_table
from pipelines.io.payloads import Payloads
from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT

__all__ = ["Decoded", "SourceNamer", "decode_events", "decode_indexed"]

log = logging.getLogger(__name__)

#: ``source_of(indices)`` names where the payloads at ``indices`` came from (for dead letters).
SourceNamer = Callable[[np.ndarray], list[str]]

#: A range this small whose Arrow error names no row is handed to parse_json_lines whole.
_BISECT_MIN = 64
#: A payload with more ``[`` bytes than this may nest deeper than Python's ``json`` allows.
_MAX_OPENERS = 64
#: Arrow reader blocks: big ones parse fastest; after the first rejected payload of a
#: batch, small ones, so that each further rejection costs little re-reading.
_BIG_BLOCK_BYTES = 1 << 22
_BLOCK_BYTES = 1 << 16

_ERROR_ROW = re.compile(r"in row (\d+)\s*$")
#: Byte strings that make a payload suspect (Python's json reads them as numbers).
_TOKENS = (b"NaN", b"Infinity")
#: ISO-string times fail Arrow's integer column. Finding them first only saves an
#: Arrow error (and a block re-read) per such event; other spellings still go right.
_ISO_TIME_TOKENS = (b'"event_time":"', b'"event_time": "')

_WIRE_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("item_id", pa.int64()),
        ("is_ad", pa.bool_()),
        ("advertiser_id", pa.int64()),
        ("item_category", pa.int64()),
        ("surface", pa.string()),
        ("event_type", pa.string()),
        ("event_time", pa.int64()),
        ("value", pa.float64()),
        ("device", pa.string()),
    ]
)
#: "error": a key outside the wire format (which could repeat unseen) goes to parse_json_lines.
_PARSE_OPTIONS = pj.ParseOptions(explicit_schema=_WIRE_SCHEMA, unexpected_field_behavior="error")
#: A canonical payload has one ``:`` per wire field; more means an extra key (or a ``:`` in a string).
_MAX_COLONS = len(_WIRE_SCHEMA)
_ENUM_VALUES = {
    "surface": pa.array(SURFACES, pa.string()),
    "event_type": pa.array(EVENT_TYPES, pa.string()),
    "device": pa.array(DEVICES, pa.string()),
}


def decode_events(
    payloads: Payloads, source_of: SourceNamer, stage: str = "parse", max_time_ms: int = MAX_TIME_MS
) -> ParseResult:
    """Events (EVENT layout) and dead letters (DEAD_LETTER layout) of a payload batch.

    Equal to ``parse_json_lines(payloads, source_of(all indices), stage, max_time_ms)``;
    ``source_of`` is called only with the indices of the dead letters.
    """
    return decode_indexed(payloads, source_of, stage, max_time_ms).result


@dataclass(frozen=True)
class Decoded:
    """A decoded batch plus which payload each row came from: ``event_rows`` ``(E,)``, ``dead_rows`` ``(D,)``."""

    result: ParseResult
    event_rows: np.ndarray
    dead_rows: np.ndarray


def decode_indexed(
    payloads: Payloads, source_of: SourceNamer, stage: str = "parse", max_time_ms: int = MAX_TIME_MS
) -> Decoded:
    """:func:`decode_events` that also says which payload became which event or dead letter."""
    n = len(payloads)
    none = np.zeros(0, dtype=np.int64)
    if n == 0:
        return Decoded(ParseResult(EVENT.schema.empty_table(), dead_letter_table(stage, [])), none, none)
    try:
        clean = np.flatnonzero(~_suspects(payloads))
        table, read_rows, _ = _read_arrow(payloads.select(clean))
        fast_rows = clean[read_rows]
        ok = _valid_mask(table, min(max_time_ms, MAX_TIME_MS))
        events = _to_event_layout(table if ok.false_count == 0 else table.filter(ok))
    except (pa.ArrowException, Reject, ValueError) as exc:  # the fast path's blind spot: do it the slow way
        log.warning("fast decoder gave up on a batch of %d (%s: %s); decoding row by row", n, type(exc).__name__, exc)
        return _with_slow_rows(payloads, EVENT.schema.empty_table(), np.zeros(n, bool), source_of, stage, max_time_ms)
    if events.num_rows == n:
        return Decoded(ParseResult(events, dead_letter_table(stage, [])), fast_rows, none)
    is_fast = np.zeros(n, dtype=bool)
    is_fast[fast_rows[ok.to_numpy(zero_copy_only=False)]] = True
    return _with_slow_rows(payloads, events, is_fast, source_of, stage, max_time_ms)


def _with_slow_rows(
    payloads: Payloads, fast: pa.Table, is_fast: np.ndarray, source_of: SourceNamer, stage: str, max_time_ms: int
) -> Decoded:
    """``fast`` plus parse_json_lines over every other payload, merged in payload order."""
    slow_rows = np.flatnonzero(~is_fast)
    # Positions as sources tell which slow payloads became dead letters; the real
    # source names are put in afterwards (a source appears nowhere else).
    positions = [str(i) for i in range(len(slow_rows))]
    slow = parse_json_lines(payloads.take(slow_rows), positions, stage, max_time_ms)
    dead = slow.dead_letters
    dead_pos = np.asarray([int(s) for s in dead.column("source").to_pylist()], dtype=np.int64)
    sources = source_of(slow_rows[dead_pos]) if len(dead_pos) else []
    where = dead.schema.get_field_index("source")
    dead = dead.set_column(where, dead.schema.field(where), pa.array(sources, pa.string()))
    events, event_rows = fast, np.flatnonzero(is_fast)
    if slow.events.num_rows:
        accepted = np.setdiff1d(np.arange(len(slow_rows)), dead_pos)
        rows = np.concatenate([event_rows, slow_rows[accepted]])
        order = np.argsort(rows, kind="stable")
        events, event_rows = pa.concat_tables([fast, slow.events]).take(pa.array(order)), rows[order]
    return Decoded(ParseResult(events, dead), event_rows, slow_rows[dead_pos])


def _owners(payloads: Payloads, positions: np.ndarray) -> np.ndarray:
    """Index of the payload (or its separator) holding each byte position."""
    return np.searchsorted(payloads.starts, positions, side="right") - 1


def _suspects(payloads: Payloads) -> np.ndarray:
    """``(n,)`` bool: True where Arrow's reader might not agree with parse_json_lines.

    Each rule first asks the whole buffer whether the byte is there at all (``in``
    on one byte is a ``memchr``, ~20x cheaper than a numpy pass); bytes that every
    batch holds (``\\n``, ``{``) are counted with one numpy pass (3x cheaper than
    ``bytes.count`` here); only a batch with more of them than payloads pays for
    locating them.
    """
    data, starts, lengths = payloads.data, payloads.starts, payloads.lengths
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = starts + lengths  # the separators
    sus = (lengths < 2) | (lengths > MAX_LINE_BYTES)
    opens = raw[starts] == ord("{")
    sus |= ~opens
    sus |= raw[np.maximum(ends - 1, 0)] != ord("}")
    newlines = raw == ord("\n")
    if np.count_nonzero(newlines) != len(payloads):
        sus[_owners(payloads, np.setdiff1d(np.flatnonzero(newlines), ends))] = True
    for byte in (b"\x00", b"\r"):
        if byte in data:
            sus[_owners(payloads, np.flatnonzero(raw == ord(byte)))] = True
    marks = [_token_starts(raw, token) for token in _TOKENS if token[:1] in data and token in data]
    if _iso_times_likely(payloads):
        marks += [np.asarray(_find_all(data, token), dtype=np.int64) for token in _ISO_TIME_TOKENS]
    for found in marks:
        sus[_owners(payloads, found)] = True
    if not data.isascii():
        for i in np.unique(_owners(payloads, np.flatnonzero(raw >= 0x80))):
            sus[i] |= not _is_utf8(payloads.get(int(i)))
    # Equal counts mean each payload that opens with "{" holds no other "{".
    # At most _MAX_COLONS ":" in all payloads together means none has more.
    n = len(payloads)
    counted = ((b"{", 1, int(opens.sum())), (b"[", _MAX_OPENERS, _MAX_OPENERS), (b":", _MAX_COLONS, _MAX_COLONS * n))
    for byte, most, usual in counted:
        if byte not in data:
            continue
        found = raw == ord(byte)
        if np.count_nonzero(found) > usual:
            sus |= np.bincount(_owners(payloads, np.flatnonzero(found)), minlength=len(payloads)) > most
    return sus


def _token_starts(raw: np.ndarray, token: bytes) -> np.ndarray:
    """Where ``token`` begins in ``raw``: candidates by its (rare) first byte, narrowed byte by byte."""
    found = np.flatnonzero(raw[: max(len(raw) - len(token) + 1, 0)] == token[0])
    for k in range(1, len(token)):
        if not len(found):
            break
        found = found[raw[found + k] == token[k]]
    return found


def _iso_times_likely(payloads: Payloads) -> bool:
    """Producers keep one style: look for ISO-string times when the first or last payload has one."""
    ends = (payloads.get(0), payloads.get(len(payloads) - 1))
    return any(token in payload for token in _ISO_TIME_TOKENS for payload in ends)


def _find_all(data: bytes, token: bytes) -> list[int]:
    found, at = [], data.find(token)
    while at >= 0:
        found.append(at)
        at = data.find(token, at + 1)
    return found


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_arrow(payloads: Payloads) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """(table, rows, rejected): Arrow's rows for the payloads at ``rows``; those it rejected.

    Ranges are read left to right in 64 KiB blocks; when Arrow names the row it
    rejects, that payload is set aside and reading goes on after it; when it
    names none, the range is halved down to ``_BISECT_MIN`` payloads.
    """
    buffer = pa.py_buffer(payloads.data)
    n = len(payloads)
    batches: list[pa.RecordBatch] = []
    rows: list[np.ndarray] = []
    rejected: list[int] = []
    pending = [(0, n)]  # a stack: the leftmost range on top
    block = _BIG_BLOCK_BYTES
    while pending:
        lo, hi = pending.pop()
        if lo >= hi:
            continue
        got, error = _stream(buffer, payloads, lo, hi, batches, block)
        rows.append(np.arange(lo, lo + got, dtype=np.int64))
        if error is None:
            continue
        block = _BLOCK_BYTES
        start = lo + got  # the first payload of the failing block
        match = _ERROR_ROW.search(str(error))
        if match and start + int(match.group(1)) < hi:
            bad = start + int(match.group(1))
            rejected.append(bad)
            pending += [(bad + 1, hi), (start, bad)]
        elif hi - start <= _BISECT_MIN:
            rejected.extend(range(start, hi))
        else:
            mid = (start + hi) // 2
            pending += [(mid, hi), (start, mid)]
    table = pa.Table.from_batches(batches, schema=_WIRE_SCHEMA)
    read = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    if len(read) != table.num_rows:  # cannot happen: each checked payload is one object
        raise AssertionError(f"Arrow gave {table.num_rows} rows for {len(read)} payloads")
    return table, read, np.asarray(sorted(rejected), dtype=np.int64)


def _stream(
    buffer: pa.Buffer, payloads: Payloads, lo: int, hi: int, batches: list[pa.RecordBatch], block: int
) -> tuple[int, pa.ArrowInvalid | None]:
    """Read payloads ``lo:hi`` into ``batches``; (rows read, the error that stopped it or None)."""
    begin = int(payloads.starts[lo])
    end = int(payloads.starts[hi - 1] + payloads.lengths[hi - 1]) + 1
    block = max(block, 2 * int(payloads.spans[lo:hi].max()) + 2)
    got = 0
    try:
        reader = pj.open_json(
            pa.BufferReader(buffer.slice(begin, end - begin)),
            # One thread: readers run one per core (Beam workers), so Arrow's own reader threads
            # would only compete with the other readers for the same cores.
            read_options=pj.ReadOptions(use_threads=False, block_size=block),
            parse_options=_PARSE_OPTIONS,
        )
        for batch in reader:
            batches.append(batch)
            got += batch.num_rows
    except pa.ArrowInvalid as exc:
        return got, exc
    return got, None


def _valid_mask(t: pa.Table, max_time_ms: int) -> pa.Array:
    """True where the row passes every rule of the wire format (no nulls in the mask)."""
    checks = [
        pc.is_valid(t["event_id"]),
        pc.greater(pc.utf8_length(t["event_id"]), 0),
        pc.less_equal(pc.utf8_length(t["event_id"]), MAX_EVENT_ID_CHARS),
        pc.is_valid(t["is_ad"]),
        pc.is_in(t["surface"], value_set=_ENUM_VALUES["surface"]),
        pc.is_in(t["event_type"], value_set=_ENUM_VALUES["event_type"]),
        pc.or_kleene(pc.is_null(t["device"]), pc.is_in(t["device"], value_set=_ENUM_VALUES["device"])),
        pc.and_(pc.greater_equal(t["event_time"], 0), pc.less_equal(t["event_time"], max_time_ms)),
        pc.less_equal(t["item_category"], INT32_MAX),
        pc.or_kleene(
            pc.is_null(t["value"]),
            pc.and_(pc.is_finite(t["value"]), pc.less_equal(pc.abs(t["value"]), FLOAT32_MAX)),
        ),
        # is_ad == (advertiser_id is set): ads need one, organic content must not have one.
        pc.equal(t["is_ad"], pc.is_valid(t["advertiser_id"])),
    ]
    for name in ("user_id", "item_id", "item_category"):
        checks.append(pc.greater_equal(t[name], 0))
    checks.append(pc.or_kleene(pc.is_null(t["advertiser_id"]), pc.greater_equal(t["advertiser_id"], 0)))
    mask = checks[0]
    for check in checks[1:]:
        mask = pc.and_kleene(mask, check)
    # A null anywhere (a missing or null field) makes the row go to the row-wise parser.
    mask = pc.fill_null(mask, False)
    return mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask


def _codes(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    return pc.index_in(column, value_set=_ENUM_VALUES[name]).cast(pa.int8())


def _to_event_layout(t: pa.Table) -> pa.Table:
    arrays = {
        "event_id": t["event_id"],
        "user_id": t["user_id"],
        "item_id": t["item_id"],
        "is_ad": t["is_ad"],
        "advertiser_id": t["advertiser_id"],
        "item_category": t["item_category"].cast(pa.int32()),
        "surface": _codes(t["surface"], "surface"),
        "event_type": _codes(t["event_type"], "event_type"),
        "event_time": t["event_time"].cast(pa.timestamp("ms", tz="UTC")),
        "value": pc.cast(t["value"], pa.float32(), safe=False),
        "device": _codes(t["device"], "device"),
    }
    return pa.Table.from_arrays([arrays[f.name] for f in EVENT.schema], schema=EVENT.schema)
