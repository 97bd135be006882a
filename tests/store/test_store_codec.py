"""The record and key layouts, and the column checks on what is written (pure, no store)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import LayoutError
from pipelines.store import RepresentationArrays, pair_grid, record_nbytes
from pipelines.store.codec import (
    COMPUTED_AT_OFFSET,
    HEADER_BYTES,
    DecodedRecords,
    computed_at_of,
    decode_key,
    encode_key,
    encode_keys,
    encode_records,
    quantize_int8,
)
from tests.store.reps import T0_MS, reps

ids = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def test_bytes_per_record() -> None:
    assert HEADER_BYTES == 40
    assert record_nbytes("float16", 64) == 168
    assert record_nbytes("int8", 64) == 104
    assert record_nbytes("float16", 256) == 552


@given(ids, st.none() | ids)
def test_key_round_trip(user: int, ad: int | None) -> None:
    key = encode_key(user, ad)
    assert len(key) == (8 if ad is None else 16)
    assert decode_key(key) == (user, ad)


@given(st.lists(st.tuples(ids, st.none() | ids), max_size=50))
def test_vectorised_keys_equal_scalar_keys(keys: list[tuple[int, int | None]]) -> None:
    users = np.array([u for u, _ in keys], dtype=np.int64)
    ads = np.array([a or 0 for _, a in keys], dtype=np.int64)
    has_ad = np.array([a is not None for _, a in keys], dtype=bool)
    assert encode_keys(users, ads, has_ad) == [encode_key(u, a) for u, a in keys]


def test_vectorised_user_level_keys() -> None:
    users = np.array([0, 256, -1], dtype=np.int64)
    want = [encode_key(u, None) for u in users.tolist()]
    assert encode_keys(users, np.zeros(3, np.int64), np.zeros(3, bool)) == want
    assert encode_keys(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)) == []


def test_a_users_keys_share_a_prefix() -> None:
    assert encode_key(42, 7).startswith(encode_key(42, None))


@settings(max_examples=50)
@given(st.integers(0, 2**32 - 1), st.floats(1e-3, 1e3))
def test_int8_quantisation_is_within_half_a_step(seed: int, magnitude: float) -> None:
    values = np.random.default_rng(seed).normal(scale=magnitude, size=(8, 16)).astype(np.float32)
    values[3] = 0.0
    codes, scale = quantize_int8(values)
    assert codes.dtype == np.int8 and np.abs(codes).max() <= 127
    assert scale[3] == 1.0
    assert (np.abs(codes * scale[:, None] - values) <= scale[:, None] / 2 * (1 + 1e-5)).all()


def _encode(encoding: str, n: int = 3, dim: int = 4) -> list[bytes]:
    values = np.arange(n * dim, dtype=np.float32).reshape(n, dim) / 7
    return encode_records(
        encoding=encoding,  # type: ignore[arg-type]
        values=values,
        codes=None,
        scale=None,
        p_click=np.full(n, 0.5, np.float32),
        p_conversion=np.full(n, 0.1, np.float32),
        version_ids=np.arange(n, dtype=np.uint64),
        computed_at_ms=T0_MS + np.arange(n, dtype=np.int64),
        history_watermark_ms=np.full(n, T0_MS, np.int64),
    )


def test_decode_groups_mixed_encodings_back_into_request_order() -> None:
    f16, i8 = _encode("float16"), _encode("int8")
    values = [i8[0], b"", f16[1], i8[2], b"", f16[0]]
    decoded = DecodedRecords(values)
    assert decoded.dim == 4
    order = decoded.index.tolist()
    assert sorted(order) == [0, 2, 3, 5]
    by_pos = dict(zip(order, decoded["computed_at_ms"].tolist(), strict=True))
    assert by_pos == {0: T0_MS, 2: T0_MS + 1, 3: T0_MS + 2, 5: T0_MS}
    assert dict(zip(order, decoded["int8"].tolist(), strict=True)) == {0: True, 2: False, 3: True, 5: False}
    assert [computed_at_of(v) for v in f16] == [T0_MS, T0_MS + 1, T0_MS + 2]
    assert f16[0][COMPUTED_AT_OFFSET : COMPUTED_AT_OFFSET + 8] == T0_MS.to_bytes(8, "little")


def test_decode_of_one_layout_keeps_request_order() -> None:
    f16 = _encode("float16", n=4)
    decoded = DecodedRecords([b"", f16[2], f16[0], b"", f16[3]])
    assert decoded.dim == 4 and decoded.index.tolist() == [1, 2, 4]
    assert decoded["computed_at_ms"].tolist() == [T0_MS + 2, T0_MS, T0_MS + 3]
    assert decoded["int8"].tolist() == [False] * 3 and decoded["codes"].dtype == np.float16
    grouped = DecodedRecords([f16[2], _encode("int8", n=1)[0], f16[0]])  # mixed: decoded per layout
    assert sorted(zip(grouped.index.tolist(), grouped["computed_at_ms"].tolist(), strict=True)) == [
        (0, T0_MS + 2),
        (1, T0_MS),
        (2, T0_MS),
    ]


def test_decode_same_length_other_layout_is_not_mistaken_for_one() -> None:
    f16_4 = _encode("float16", n=1, dim=4)[0]  # 40 + 8 bytes
    i8_8 = _encode("int8", n=1, dim=8)[0]  # 40 + 8 bytes too
    assert len(f16_4) == len(i8_8)
    with pytest.raises(ValueError, match="several dims"):
        DecodedRecords([f16_4, i8_8])


def test_decode_rejects_unknown_layouts_and_mixed_dims() -> None:
    bad = b"\x09" + _encode("float16")[0][1:]
    with pytest.raises(ValueError, match="unknown record layout"):
        DecodedRecords([bad])
    with pytest.raises(ValueError, match="several dims"):
        DecodedRecords([_encode("float16", dim=4)[0], _encode("float16", dim=8)[0]])
    assert DecodedRecords([b"", b""]).index.tolist() == []


def test_arrays_from_arrow_check_the_columns() -> None:
    table = reps([(1, 10), (1, None)], dim=8)
    arrays = RepresentationArrays.from_arrow(table)
    assert arrays.has_ad.tolist() == [True, False] and arrays.dim == 8
    with pytest.raises(LayoutError, match="lacks columns"):
        RepresentationArrays.from_arrow(table.drop_columns(["model_version"]))
    nan = table.set_column(
        2, "embedding", pa.FixedSizeListArray.from_arrays(pa.array([float("nan")] * 16, pa.float16()), 8)
    )
    with pytest.raises(ValueError, match="NaN/inf"):
        RepresentationArrays.from_arrow(nan)
    empty_version = table.set_column(6, "model_version", pa.array(["v1", ""]))
    with pytest.raises(ValueError, match="model_version"):
        RepresentationArrays.from_arrow(empty_version)


@given(st.lists(ids, unique=True, max_size=6), st.lists(ids, unique=True, max_size=12))
def test_pair_grid_rows_and_key_order(users: list[int], ads: list[int]) -> None:
    user_col, ad_col, order = pair_grid(np.array(users, np.int64), np.array(ads, np.int64))
    assert list(zip(user_col.tolist(), ad_col.tolist(), strict=True)) == [(u, a) for u in users for a in ads]
    np.testing.assert_array_equal(order, np.lexsort((ad_col, user_col)))
