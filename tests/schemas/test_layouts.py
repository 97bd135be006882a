"""Layouts change only together with their version; the wire-format document stays generated."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.io.parquet import read_table, write_table
from pipelines.schemas import LAYOUTS, SURFACES, Layout, layout_of
from pipelines.schemas.wire import event_json_schema, render_event_json_schema

HERE = Path(__file__).parent
LOCK = json.loads((HERE / "layout_fingerprints.json").read_text())


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_changes_bump_the_version(name: str) -> None:
    layout, locked = LAYOUTS[name], LOCK[name]
    if layout.version == locked["version"]:
        assert layout.fingerprint() == locked["fingerprint"], (
            f"layout {name!r} changed without a version bump: bump its version in pipelines/schemas/layouts.py "
            "and record the new fingerprint in tests/schemas/layout_fingerprints.json"
        )
    else:
        assert layout.version > locked["version"], f"layout {name!r} version went backwards"


def test_every_layout_is_locked() -> None:
    assert set(LOCK) == set(LAYOUTS)


def test_fingerprint_sees_type_and_nullability() -> None:
    base = Layout("x", 1, pa.schema([pa.field("a", pa.int64(), nullable=False)]))
    assert base.fingerprint() != Layout("x", 1, pa.schema([pa.field("a", pa.int64())])).fingerprint()
    assert base.fingerprint() != Layout("x", 1, pa.schema([pa.field("a", pa.int32(), nullable=False)])).fingerprint()


def test_committed_json_schema_is_current() -> None:
    committed = (HERE.parent.parent / "pipelines" / "schemas" / "event.schema.json").read_text()
    assert committed == render_event_json_schema(), "run `python -m pipelines.schemas` to regenerate it"


def test_json_schema_lists_the_enums_and_required_fields() -> None:
    schema = event_json_schema()
    assert schema["properties"]["surface"]["enum"] == list(SURFACES)
    assert "advertiser_id" not in schema["required"] and "event_time" in schema["required"]


def test_parquet_files_carry_name_and_version(tmp_path: Path) -> None:
    layout = LAYOUTS["dead_letter"]
    table = layout.schema.empty_table()
    path = write_table(table, str(tmp_path / "d.parquet"), layout)
    assert layout_of(pq.read_schema(path)) == ("dead_letter", layout.version)
    assert read_table(path, layout).num_rows == 0
    with pytest.raises(ValueError, match="expected history"):
        read_table(path, LAYOUTS["history"])
