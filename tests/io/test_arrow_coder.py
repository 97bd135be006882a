"""ArrowTableCoder: tables round-trip; only big ones pay for LZ4."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.io.arrow_coder import COMPRESS_FROM_BYTES, ArrowTableCoder

_LZ4_FRAME_MAGIC = bytes.fromhex("04224d18")  # what every LZ4-compressed IPC buffer starts with


def _table(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64) % 7  # compressible
    return pa.table(
        {
            "user_id": ids,
            "name": pa.array([f"user-{i}" for i in ids]),
            "items": pa.array([[int(i)] * 3 for i in ids], pa.list_(pa.int64())),
        }
    )


@pytest.mark.parametrize("rows", [0, 5, 200_000])
def test_tables_round_trip(rows: int) -> None:
    table = _table(rows)
    coder = ArrowTableCoder()
    assert coder.decode(coder.encode(table)).equals(table)


def test_small_tables_are_written_plain_and_big_ones_compressed() -> None:
    coder = ArrowTableCoder()
    small, big = _table(50), _table(200_000)
    assert small.nbytes < COMPRESS_FROM_BYTES <= big.nbytes
    assert _LZ4_FRAME_MAGIC not in coder.encode(small)
    encoded = coder.encode(big)
    assert _LZ4_FRAME_MAGIC in encoded
    assert len(encoded) < big.nbytes / 4


def test_a_coder_without_a_threshold_never_compresses() -> None:
    big = _table(200_000)
    encoded = ArrowTableCoder(compress_from_bytes=None).encode(big)
    assert _LZ4_FRAME_MAGIC not in encoded
    assert ArrowTableCoder().decode(encoded).equals(big)
