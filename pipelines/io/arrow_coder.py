"""A Beam coder for Arrow tables: the IPC stream format, big tables' buffers LZ4-compressed.

Registered for ``pa.Table`` so typed PCollections of tables (and KV pairs of
them) cross shuffles without pickling. Compression keeps the bytes the runner
copies small, but LZ4 has a fixed cost per table whatever its size (a frame per
buffer), many times the whole uncompressed encoding of a streaming job's typical
table (tens of rows); so only tables of ``COMPRESS_FROM_BYTES`` or more are
compressed. Readers need not know: each IPC message says whether it is.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

__all__ = ["COMPRESS_FROM_BYTES", "ArrowTableCoder", "register"]

#: Tables at least this big (``pa.Table.nbytes``) have their buffers LZ4-compressed.
COMPRESS_FROM_BYTES = 1 << 20
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="lz4")
_PLAIN = pa.ipc.IpcWriteOptions()


class ArrowTableCoder(beam.coders.Coder):
    """Encodes a ``pa.Table`` as one Arrow IPC stream; ``compress_from_bytes=None`` never compresses
    (for bytes that stay on this machine)."""

    def __init__(self, compress_from_bytes: int | None = COMPRESS_FROM_BYTES) -> None:
        self._compress_from = compress_from_bytes

    def encode(self, value: pa.Table) -> bytes:
        big = self._compress_from is not None and value.nbytes >= self._compress_from
        options = _COMPRESSED if big else _PLAIN
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, value.schema, options=options) as writer:
            writer.write_table(value)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.Table:
        return pa.ipc.open_stream(pa.py_buffer(encoded)).read_all()

    def estimate_size(self, value: pa.Table) -> int:
        # Beam samples element sizes for metrics; encoding a table just to measure it doubles the cost.
        return int(value.nbytes)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return pa.Table


def register() -> None:
    """Make Beam use :class:`ArrowTableCoder` for every PCollection typed ``pa.Table``."""
    beam.coders.registry.register_coder(pa.Table, ArrowTableCoder)


register()
