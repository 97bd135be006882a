"""Parquet writes: embedding columns skip the dictionary; everything reads back as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.io.parquet import conform, read_table, write_table
from pipelines.schemas.layouts import REPRESENTATION


def _representations(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    dim = REPRESENTATION.schema.field("embedding").type.list_size
    values = pa.array(rng.standard_normal(rows * dim).astype(np.float16), pa.float16())
    return pa.table(
        {
            "user_id": pa.array(np.arange(rows) % 7, pa.int64()),
            "ad_id": pa.array(np.arange(rows), pa.int64()),
            "embedding": pa.FixedSizeListArray.from_arrays(values, dim),
            "embedding_scale": pa.nulls(rows, pa.float32()),
            "p_click": pa.array(rng.random(rows), pa.float32()),
            "p_conversion": pa.array(rng.random(rows), pa.float32()),
            "model_version": pa.array(["m1"] * rows),
            "history_watermark": pa.array(np.zeros(rows, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
            "computed_at": pa.array(np.ones(rows, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
        }
    )


def test_embeddings_are_written_without_a_dictionary_and_read_back_equal(tmp_path: Path) -> None:
    table = _representations(500)
    path = write_table(table, str(tmp_path / "part.parquet"), REPRESENTATION)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {meta.column(i).path_in_schema.split(".")[0]: meta.column(i) for i in range(meta.num_columns)}
    assert not any("DICTIONARY" in e for e in chunks["embedding"].encodings)
    assert chunks["embedding"].statistics is None or not chunks["embedding"].statistics.has_min_max
    assert any("DICTIONARY" in e for e in chunks["model_version"].encodings)  # other columns keep theirs
    assert read_table(path, REPRESENTATION).equals(conform(table, REPRESENTATION))
