"""Arrow tables → JSON messages for topics (events, histories, dead letters), vectorised with Polars.

- events: the JSON wire format of ``pipelines/schemas/README.md`` (enum strings, integer ms);
- histories (HISTORY layout) and dead letters (DEAD_LETTER layout): one JSON
  object per row with the layout's field names; times are integer ms since the
  epoch, enums inside histories are the layout's small integer codes, and a dead
  letter's raw ``payload`` is base64 (``payload_base64``) so any bytes survive.
Keys are the user id as a decimal string (None for dead letters).
"""

from __future__ import annotations

import base64

import pyarrow as pa

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import EVENT

__all__ = ["dead_letters_to_json", "events_to_wire", "histories_to_json"]

Message = tuple[bytes | None, bytes]
_ENUMS = {"surface": SURFACES, "event_type": EVENT_TYPES, "device": DEVICES}


def _json_rows(table: pa.Table) -> list[bytes]:
    import polars as pl

    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    encoded = frame.select(pl.struct(frame.columns).struct.json_encode().alias("v")).to_series()
    return [s.encode() for s in encoded.to_list()]


def _times_as_ms(dtype: pa.DataType) -> pa.DataType:
    """``dtype`` with every timestamp (however nested) replaced by int64 milliseconds."""
    if pa.types.is_timestamp(dtype):
        return pa.int64()
    if pa.types.is_struct(dtype):
        return pa.struct([f.with_type(_times_as_ms(f.type)) for f in dtype])
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        item = dtype.value_field
        return pa.list_(item.with_type(_times_as_ms(item.type)))
    return dtype


def _ms(table: pa.Table) -> pa.Table:
    for name in table.column_names:
        if pa.types.is_timestamp(table.schema.field(name).type):
            table = table.set_column(
                table.schema.get_field_index(name),
                name,
                table.column(name).cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()),
            )
    schema = pa.schema([f.with_type(_times_as_ms(f.type)) for f in table.schema])
    return table.cast(schema)


def events_to_wire(events: pa.Table) -> list[bytes]:
    """EVENT-layout rows (enum codes or strings) as JSON wire-format payloads."""
    table = _ms(events.select(EVENT.schema.names))
    for name, values in _ENUMS.items():
        column = table.column(name)
        if pa.types.is_integer(column.type):
            strings = pa.array(values, pa.string()).take(column.cast(pa.int32()).combine_chunks())
            table = table.set_column(table.schema.get_field_index(name), name, strings)
    return _json_rows(table)


def histories_to_json(histories: pa.Table) -> list[Message]:
    """(user id, history JSON) per row of a HISTORY table."""
    keys = [str(u).encode() for u in histories.column("user_id").to_pylist()]
    return list(zip(keys, _json_rows(_ms(histories)), strict=True))


def dead_letters_to_json(dead: pa.Table) -> list[Message]:
    """(None, dead-letter JSON) per row of a DEAD_LETTER table; the payload as base64."""
    encoded = pa.array([base64.b64encode(p).decode() for p in dead.column("payload").to_pylist()], pa.string())
    table = dead.drop_columns(["payload"]).append_column("payload_base64", encoded)
    return [(None, v) for v in _json_rows(table)]
