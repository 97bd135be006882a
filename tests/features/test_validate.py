from __future__ import annotations

import pyarrow as pa

from pipelines.features import reasons
from pipelines.features.validate import check_columns, validate_event_table
from pipelines.schemas.layouts import EVENT
from tests.features.factories import T0, event, events_table


def test_layout_table_passes_unchanged() -> None:
    table = events_table([event("a", 1, 0), event("b", 2, 5, value=2.5)])
    result = validate_event_table(table, "x.parquet")
    assert result.dead_letters.num_rows == 0
    assert result.events.equals(table)


def test_string_enums_are_mapped_to_codes() -> None:
    table = pa.table(
        {
            **{f.name: [v] for f, v in zip(EVENT.schema, event("a", 1, 0).values(), strict=True)},
            "surface": ["instagram_reels"],
            "event_type": ["click"],
            "device": [None],
        }
    )
    result = validate_event_table(table, "x.parquet")
    row = result.events.to_pylist()[0]
    assert (row["surface"], row["event_type"], row["device"]) == (5, 1, None)


def test_bad_rows_become_dead_letters_with_row_sources() -> None:
    table = events_table(
        [
            event("ok", 1, 0),
            event("neg", -1, 0),
            event("enum", 1, 0, surface=99),
            event("noadv", 1, 0, advertiser_id=None),
            event("nan", 1, 0, value=float("nan")),
            event("", 1, 0),
        ]
    )
    result = validate_event_table(table, "x.parquet", first_row=100)
    assert result.events.column("event_id").to_pylist() == ["ok"]
    dead = result.dead_letters.to_pydict()
    assert dead["reason"] == [
        reasons.OUT_OF_RANGE,
        reasons.UNKNOWN_ENUM,
        reasons.AD_WITHOUT_ADVERTISER,
        reasons.NON_FINITE,
        reasons.OUT_OF_RANGE,
    ]
    assert dead["source"] == [f"x.parquet:{i}" for i in range(101, 106)]


def test_missing_column_rejects_every_row() -> None:
    table = events_table([event("a", 1, 0)]).drop_columns(["surface"])
    result = validate_event_table(table, "x.parquet")
    assert result.events.num_rows == 0
    assert result.dead_letters.column("reason").to_pylist() == [reasons.MISSING_FIELD]


def test_absent_optional_columns_read_as_nulls() -> None:
    table = events_table([event("a", 1, 0)]).drop_columns(["device", "value"])
    result = validate_event_table(table, "x.parquet")
    assert result.dead_letters.num_rows == 0
    assert result.events.column("device").to_pylist() == [None] and result.events.column("value").null_count == 1


def test_check_columns_refuses_a_file_without_a_required_column() -> None:
    schema = events_table([event("a", 1, 0)]).drop_columns(["user_id", "device"]).schema
    problem = check_columns(schema)
    assert problem is not None and "user_id" in problem and "device" not in problem.split("(")[0]
    assert check_columns(events_table([event("a", 1, 0)]).drop_columns(["device"]).schema) is None


def test_negative_timestamp_is_rejected() -> None:
    table = events_table([event("a", 1, -T0 - 1)])
    assert validate_event_table(table, "x").dead_letters.column("reason").to_pylist() == [reasons.BAD_TIMESTAMP]
