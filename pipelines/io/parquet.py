"""Parquet read/write that stamps and checks the layout version.

Paths go through Beam's ``FileSystems`` so the same code writes local paths and
``gs://`` URIs (Dataflow workers).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipelines.errors import LayoutError
from pipelines.schemas.layouts import Layout, layout_of


def conform(table: pa.Table, layout: Layout) -> pa.Table:
    """``table`` cast to the layout's schema (with its metadata), columns in layout order."""
    missing = [name for name in layout.schema.names if name not in table.column_names]
    if missing:
        raise LayoutError(f"{layout.name} table lacks columns {missing}")
    table = table.select(layout.schema.names)
    return table.cast(layout.with_metadata(layout.schema_for(table.schema)))


def write_table(table: pa.Table, path: str, layout: Layout, *, compression: str = "zstd") -> str:
    """Write ``table`` in ``layout`` to ``path`` (local or any Beam filesystem). Returns the path."""
    return write_tables([table], path, layout, compression=compression)


def write_tables(tables: Iterable[pa.Table], path: str, layout: Layout, *, compression: str = "zstd") -> str:
    """Write ``tables`` in ``layout``, one after the other, to one file at ``path``, each as it comes
    (never all in memory). With no tables the file holds the layout's empty table. Returns the path."""
    parent = path.rsplit("/", 1)[0] if "/" in path else "."
    if not FileSystems.exists(parent):
        FileSystems.mkdirs(parent)
    with FileSystems.create(path) as sink:
        writer: pq.ParquetWriter | None = None
        try:
            for table in tables:
                table = conform(table, layout)
                if writer is None:  # the first table's schema (a sized column keeps its size)
                    flat = [f.name for f in table.schema if not _is_vector(f.type)]
                    options = {"use_dictionary": flat, "write_statistics": flat}
                    writer = pq.ParquetWriter(sink, table.schema, compression=compression, **options)
                writer.write_table(table)
            if writer is None:
                pq.write_table(conform(layout.schema.empty_table(), layout), sink, compression=compression)
        finally:
            if writer is not None:
                writer.close()
    return path


def _is_vector(kind: pa.DataType) -> bool:
    """An embedding column (a fixed-size list of floats): its values rarely repeat, so a dictionary
    never pays (trying one is most of the cost of writing it), and per-element min/max say nothing."""
    return pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type)


def read_file(data: bytes | Any, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file from its bytes (or an open file object, read whole first).

    The bytes are copied into an Arrow-owned buffer before Arrow sees them. Arrow's pool threads
    release what a read used some time after the read returns; a buffer that wraps a Python
    object (``bytes``, a Python stream's reads) then takes the GIL from that thread, and at
    interpreter exit that aborts the process ("terminate called without an active exception",
    apache/arrow#33975, #34314, #50482; seen here at the end of `lookup`). An Arrow-owned buffer
    is released without Python.
    """
    raw = data if isinstance(data, bytes | bytearray | memoryview) else data.read()
    owned = pa.allocate_buffer(len(raw))
    memoryview(owned).cast("B")[:] = raw
    return pq.ParquetFile(pa.BufferReader(owned)).read(columns=columns)


def read_table(path: str, layout: Layout | None = None) -> pa.Table:
    """Read one Parquet file; when ``layout`` is given, check its name and version."""
    with FileSystems.open(path) as source:
        table = read_file(source)
    if layout is not None:
        check_layout(table.schema, layout, path)
    return table


def check_layout(schema: pa.Schema, layout: Layout, where: str) -> None:
    """Raise :class:`LayoutError` unless ``schema`` was written with ``layout``'s name and version."""
    found = layout_of(schema)
    if found is None:
        raise LayoutError(f"{where}: no layout metadata; expected {layout.name} v{layout.version}")
    if found != (layout.name, layout.version):
        raise LayoutError(f"{where}: layout {found[0]} v{found[1]}, expected {layout.name} v{layout.version}")


def rows_of_user(path: str, user: int, layout: Layout) -> pa.Table:
    """The rows of ``user`` in the local Parquet file ``path`` (with a ``user_id`` column), checked
    against ``layout``: only the row groups whose ``user_id`` statistics can hold it are read, so a
    file sorted by user costs one row group, not the file. Footers are kept (:data:`FOOTERS` files)."""
    footer = _footer(path, layout)
    groups = np.flatnonzero((footer.low <= user) & (user <= footer.high)).tolist()
    if not groups:
        return footer.schema.empty_table()
    table = pq.ParquetFile(path, metadata=footer.meta).read_row_groups(groups)
    return table.filter(pc.equal(table.column("user_id"), user))


#: Parquet footers :func:`rows_of_user` keeps, with their row groups' ``user_id`` ranges.
FOOTERS = 256


class _Footer(NamedTuple):
    meta: pq.FileMetaData
    schema: pa.Schema
    low: np.ndarray  # per row group, the least user_id it can hold
    high: np.ndarray


_FOOTERS: OrderedDict[tuple[str, int, int], _Footer] = OrderedDict()
_FOOTERS_LOCK = threading.Lock()


def _footer(path: str, layout: Layout) -> _Footer:
    """``path``'s footer, read once per (path, size, mtime): a rewritten file is read again."""
    stat = os.stat(path)
    key = (path, stat.st_size, stat.st_mtime_ns)
    with _FOOTERS_LOCK:
        found = _FOOTERS.get(key)
        if found is not None:
            _FOOTERS.move_to_end(key)
            return found
    meta = pq.read_metadata(path)
    schema = meta.schema.to_arrow_schema()
    check_layout(schema, layout, path)
    column = schema.get_field_index("user_id")
    bounds = np.iinfo(np.int64)
    low = np.full(meta.num_row_groups, bounds.min, np.int64)
    high = np.full(meta.num_row_groups, bounds.max, np.int64)
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is not None and stats.has_min_max:  # without statistics a group can hold anyone
            low[g], high[g] = stats.min, stats.max
    found = _Footer(meta, schema, low, high)
    with _FOOTERS_LOCK:
        _FOOTERS[key] = found
        while len(_FOOTERS) > FOOTERS:
            _FOOTERS.popitem(last=False)
    return found
