"""Events in the JSON wire format, one object per line (``.jsonl`` or ``.jsonl.gz``).

Lines are encoded column-wise by Polars (enum codes mapped to their lower-case
names, ``event_time`` as integer milliseconds, nulls as ``null``) into one Arrow
string array whose data buffer already is the file's bytes; malformed lines are
spliced in between slices of that buffer, so writing is a few large writes.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from io import BufferedIOBase
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT

_WRITE_CHUNK = 8 << 20
_ENUMS = {"surface": SURFACES, "event_type": EVENT_TYPES, "device": DEVICES}
GZIP_LEVEL = 3  # fast; level 6 takes about twice as long for ~10% smaller files


def encode_lines(events: pa.Table) -> pa.LargeStringArray:
    """One JSON object per event, each ending in a newline (EVENT field order)."""
    import polars as pl

    frame = pl.from_arrow(events.select(EVENT.schema.names))
    assert isinstance(frame, pl.DataFrame)
    exprs = []
    for name in EVENT.schema.names:
        column = pl.col(name)
        if name in _ENUMS:
            mapping = dict(enumerate(_ENUMS[name]))
            column = column.replace_strict(mapping, return_dtype=pl.String)
        elif name == "event_time":
            column = column.dt.epoch("ms")
        exprs.append(column.alias(name))
    line = pl.struct(exprs).struct.json_encode() + "\n"
    encoded = frame.select(line.alias("line")).to_series().to_arrow()
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    if encoded.type != pa.large_string():
        encoded = encoded.cast(pa.large_string())
    assert isinstance(encoded, pa.LargeStringArray)
    return encoded


def write_jsonl(
    path: Path,
    lines: pa.LargeStringArray,
    bad: Sequence[bytes],
    positions: np.ndarray,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Write ``lines`` with ``bad[k]`` inserted before good line ``positions[k]`` (sorted).

    Gzip output (``.gz``) has a zero mtime and no file name in its header, so the
    same input gives the same bytes. Returns the number of lines written.
    """
    if len(bad) != len(positions) or np.any(np.diff(positions) < 0):
        raise ValueError("need one sorted insert position per bad line")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
    data = memoryview(lines.buffers()[2])
    report = on_bytes or (lambda _n: None)
    with open(path, "wb") as raw:
        sink: BufferedIOBase = raw
        if path.name.endswith(".gz"):
            sink = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL)
        try:
            done = 0
            for line, at in zip(bad, positions, strict=True):
                _write_slice(sink, data, int(offsets[done]), int(offsets[at]), report)
                sink.write(line + b"\n")
                report(len(line) + 1)
                done = int(at)
            _write_slice(sink, data, int(offsets[done]), int(offsets[-1]), report)
        finally:
            if sink is not raw:
                sink.close()
    return len(lines) + len(bad)


def _write_slice(sink: BufferedIOBase, data: memoryview, lo: int, hi: int, report: Callable[[int], None]) -> None:
    for start in range(lo, hi, _WRITE_CHUNK):
        end = min(hi, start + _WRITE_CHUNK)
        sink.write(data[start:end])
        report(end - start)
