"""The one suite every store backend passes (LMDB embedded, real Redis)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipelines.store import NULL_MS, ManualClock, RepresentationArrays, record_nbytes
from tests.conftest import MakeStore
from tests.store.reps import T0_MS, T0_S, grid, reps


def _without_read_columns(table: pa.Table) -> pa.Table:
    return table.drop_columns(["age_s", "stale"])


def test_round_trip_returns_the_written_table(make_store: MakeStore) -> None:
    store = make_store()
    table = reps(grid(5, 4))
    report = store.write_batch(table)
    assert (report.written, report.skipped_older) == (25, 0)
    assert report.value_bytes == 25 * record_nbytes("float16", 64) == 25 * 168
    got = store.read_batch(grid(5, 4))
    assert got.found.all()
    assert _without_read_columns(got.to_arrow()).equals(table)
    np.testing.assert_array_equal(
        got.embedding,
        table.column("embedding").combine_chunks().flatten().to_numpy().reshape(25, 64).astype(np.float32),
    )


def test_batch_read_keeps_request_order_and_reports_missing_keys(make_store: MakeStore) -> None:
    store = make_store()
    store.write_batch(reps([(1, None), (1, 10), (2, 10)]))
    keys = [(9, None), (2, 10), (1, 11), (1, None), (2, None), (2, 10), (-5, 10)]
    got = store.read_batch(keys)
    assert got.keys == tuple(keys)
    assert got.found.tolist() == [False, True, False, True, False, True, False]
    missing = ~got.found
    assert np.isnan(got.embedding[missing]).all() and np.isnan(got.age_s[missing]).all()
    assert np.isnan(got.p_click[missing]).all() and (got.computed_at_ms[missing] == NULL_MS).all()
    assert got.model_version[missing].tolist() == [None] * 4
    assert not got.fresh[missing].any() and not got.stale[missing].any()
    np.testing.assert_array_equal(got.embedding[1], got.embedding[5])
    assert len(store.read_batch([])) == 0
    nothing = store.read_batch([(9, None), (9, 1)]).to_arrow()
    assert nothing.num_rows == 0 and nothing.column_names[-2:] == ["age_s", "stale"]


def test_staleness_is_reported_with_the_age_never_as_fresh(make_store: MakeStore) -> None:
    clock = ManualClock(T0_S + 10)
    store = make_store(clock=clock, max_age_s=3600)
    store.write_batch(reps([(1, 10)], computed_at_ms=T0_MS))
    store.write_batch(reps([(1, None)], computed_at_ms=T0_MS - 3_000_000))
    got = store.read_batch([(1, 10), (1, None)])
    np.testing.assert_allclose(got.age_s, [10, 3010])
    assert got.fresh.tolist() == [True, True]
    clock.advance(600)  # ages 610 and 3610 s
    got = store.read_batch([(1, 10), (1, None)])
    np.testing.assert_allclose(got.age_s, [610, 3610])
    assert got.stale.tolist() == [False, True] and got.fresh.tolist() == [True, False]
    assert got.found.all() and not np.isnan(got.embedding).any()  # stale data is still returned
    assert got.stale_after(600).tolist() == [True, True]
    assert store.read_batch([(1, 10)], max_age_s=60).stale.tolist() == [True]


def test_no_max_age_means_never_stale(make_store: MakeStore) -> None:
    clock = ManualClock(T0_S)
    store = make_store(clock=clock)
    store.write_batch(reps([(1, 10)]))
    clock.advance(365 * 86400)
    got = store.read_batch([(1, 10)])
    assert got.fresh.tolist() == [True] and got.age_s[0] == pytest.approx(365 * 86400)


def test_expired_records_read_as_missing(make_store: MakeStore) -> None:
    import time

    now_ms = int(time.time() * 1000)  # Redis expires by its own clock: keep records near real time
    clock = ManualClock(now_ms / 1000)
    store = make_store(clock=clock, max_age_s=60, expire_after_s=3600)
    store.write_batch(reps([(1, 10)], computed_at_ms=now_ms))
    store.write_batch(reps([(2, 10)], computed_at_ms=now_ms - 7_200_000))  # expired on arrival
    got = store.read_batch([(1, 10), (2, 10)])
    assert got.found.tolist() == [True, False]
    clock.advance(1800)
    assert store.read_batch([(1, 10)]).stale.tolist() == [True]
    clock.advance(1801)
    got = store.read_batch([(1, 10)])
    assert got.found.tolist() == [False] and not got.fresh.any()


def test_model_version_is_carried_and_survives_a_reopen(make_store: MakeStore) -> None:
    keys = [(1, 10), (1, 11), (2, None)]
    store = make_store()
    store.write_batch(reps(keys, version=["gem-v1", "gem-v2-20260101-abcdef0123456789", "gem-v1"]))
    expected = ["gem-v1", "gem-v2-20260101-abcdef0123456789", "gem-v1"]
    assert store.read_batch(keys).model_version.tolist() == expected
    fresh_process_view = make_store()  # its version cache is empty: names come from the store
    assert fresh_process_view.read_batch(keys).model_version.tolist() == expected


def test_int8_encoding_quantises_floats_within_half_a_step(make_store: MakeStore) -> None:
    store = make_store(encoding="int8")
    table = reps(grid(3, 3))
    report = store.write_batch(table)
    assert report.value_bytes == 12 * record_nbytes("int8", 64) == 12 * 104
    got = store.read_batch(grid(3, 3))
    original = RepresentationArrays.from_arrow(table).values()
    assert (np.abs(got.embedding - original) <= got.embedding_scale[:, None] / 2 + 1e-6).all()
    cosine = (
        (got.embedding * original).sum(1) / np.linalg.norm(got.embedding, axis=1) / np.linalg.norm(original, axis=1)
    )
    assert cosine.min() > 0.999


def test_int8_input_with_a_scale_round_trips_exactly(make_store: MakeStore) -> None:
    store = make_store(encoding="int8")
    table = reps([(1, 10), (1, None)], scale=[0.01, 0.5])
    store.write_batch(table)
    got = store.read_batch([(1, 10), (1, None)])
    assert _without_read_columns(got.to_arrow()).equals(table)
    codes = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(2, 64)
    np.testing.assert_allclose(got.embedding, codes.astype(np.float32) * np.array([[0.01], [0.5]], dtype=np.float32))


def test_float16_store_decodes_int8_input_to_its_values(make_store: MakeStore) -> None:
    store = make_store(encoding="float16")
    table = reps([(1, 10)], scale=[0.25])
    store.write_batch(table)
    got = store.read_batch([(1, 10)])
    assert np.isnan(got.embedding_scale).all()
    codes = table.column("embedding").combine_chunks().flatten().to_numpy()
    np.testing.assert_array_equal(got.embedding[0], (codes.astype(np.float32) * 0.25).astype(np.float16))


def test_newer_record_overwrites_and_older_is_skipped(make_store: MakeStore) -> None:
    store = make_store()
    store.write_batch(reps([(1, 10), (1, None)], computed_at_ms=T0_MS, seed=1, version="v1"))
    report = store.write_batch(reps([(1, 10), (1, None)], computed_at_ms=[T0_MS + 1, T0_MS - 1], seed=2, version="v2"))
    assert (report.written, report.skipped_older) == (1, 1)
    got = store.read_batch([(1, 10), (1, None)])
    assert got.model_version.tolist() == ["v2", "v1"]
    assert got.computed_at_ms.tolist() == [T0_MS + 1, T0_MS]
    same_time = reps([(1, None)], computed_at_ms=T0_MS, seed=3, version="v3")
    assert store.write_batch(same_time).written == 1  # a tie overwrites: re-runs are idempotent
    assert store.read_batch([(1, None)]).model_version.tolist() == ["v3"]


def test_duplicate_keys_in_one_batch_keep_the_newest(make_store: MakeStore) -> None:
    store = make_store()
    table = reps([(1, 10), (1, 10), (1, 10)], computed_at_ms=[T0_MS + 5, T0_MS + 9, T0_MS + 1], version=["a", "b", "c"])
    assert store.write_batch(table).written == 1
    assert store.read_batch([(1, 10)]).model_version.tolist() == ["b"]


def test_read_for_request_splits_one_round_trip(make_store: MakeStore) -> None:
    store = make_store()
    store.write_batch(reps([(1, None), (1, 10), (7, 11), (8, 10), (8, 12)]))
    got = store.read_for_request(1, [10, 11, 12], neighbor_ids=[7, 8])
    assert got.pairs.keys == ((1, 10), (1, 11), (1, 12)) and got.pairs.found.tolist() == [True, False, False]
    assert got.user.keys == ((1, None),) and got.user.found.tolist() == [True]
    assert got.neighbor_pairs.found.reshape(2, 3).tolist() == [[False, True, False], [True, False, True]]
    assert got.neighbor_pairs.keys[4] == (8, 11)
    assert len(store.read_for_request(1, []).pairs) == 0


def test_read_arrays_answers_like_read_batch(make_store: MakeStore) -> None:
    store = make_store()
    store.write_batch(reps([(1, None), (1, 10), (2, 10), (3, 0)]))
    keys = [(2, 10), (1, None), (1, 11), (3, 0), (3, None), (1, 10)]
    users = np.array([u for u, _ in keys])
    ads = np.array([-1 if a is None else a for _, a in keys])  # ignored where has_ad is False
    has_ad = np.array([a is not None for _, a in keys])
    got, want = store.read_arrays(users, ads, has_ad), store.read_batch(keys)
    assert got.keys == want.keys == tuple(keys)
    assert got.found.tolist() == [True, True, False, True, False, True]
    np.testing.assert_array_equal(got.embedding, want.embedding)
    assert got.model_version.tolist() == want.model_version.tolist()
    assert got.to_arrow().equals(want.to_arrow())


def test_delete_and_clear(make_store: MakeStore) -> None:
    store = make_store()
    store.write_batch(reps(grid(2, 2)))
    assert store.delete_batch([(0, 1000), (0, 1000), (5, None)]) == 1
    assert store.read_batch([(0, 1000), (0, 1001)]).found.tolist() == [False, True]
    store.clear()
    assert not store.read_batch(grid(2, 2)).found.any()


def test_large_batch_round_trips(make_store: MakeStore) -> None:
    keys = grid(400, 49)  # 20,000 records: several Redis chunks, one LMDB transaction
    table = reps(keys, dim=32)
    store = make_store()
    assert store.write_batch(table).written == 20_000
    got = store.read_batch(keys)
    assert got.found.all() and len(got) == 20_000
    assert _without_read_columns(got.to_arrow()).equals(table)
    mixed = keys[::7] + [(u, 99) for u in range(500)]
    assert store.read_batch(mixed).found.sum() == len(keys[::7])
