"""The user's precomputed context: served inputs built from the stored record equal the ones the
training path cuts from the history index, for the same user and time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.model import HistoryIndex, ad_catalog, build_candidate_batch
from pipelines.model.context import decode_contexts, encode_contexts, user_contexts
from pipelines.model.inputs import ExampleSet
from pipelines.store import LmdbConfig, LmdbStore, ManualClock
from pipelines.transfer.context import context_inputs, write_user_contexts
from pipelines.transfer.downstream import RankerInputs, inputs_from_batch, ranker_inputs
from tests.model.toyworld import ToyWorld, make_world


@pytest.fixture(scope="module")
def world() -> tuple[HistoryIndex, pa.Table, pa.Table]:
    histories, examples = make_world(ToyWorld(users=60, days=3, seed=4))
    index = HistoryIndex(histories)
    return index, examples, ad_catalog(index)


def _request(user: int, ads: np.ndarray, at_ms: int, surface: int) -> pa.Table:
    return pa.table(
        {
            "user_id": pa.array([user], pa.int64()),
            "surface": pa.array([surface], pa.int8()),
            "request_time": pa.array([at_ms], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "ad_ids": pa.array([ads.tolist()], pa.list_(pa.int64())),
        }
    )


def _assert_rows_equal(served: RankerInputs, rows: RankerInputs) -> None:
    assert served.shared_window or len(rows) == 1
    np.testing.assert_array_equal(served.ids, rows.ids)
    np.testing.assert_array_equal(served.dense, rows.dense)
    np.testing.assert_array_equal(np.broadcast_to(served.window, rows.window.shape), rows.window)


def test_inputs_from_the_stored_context_equal_the_candidate_rows(
    world: tuple[HistoryIndex, pa.Table, pa.Table], tmp_path: Path
) -> None:
    """Contexts written at T by the precompute step, read through a real store for a request at
    t >= T with no event of the user in [T, t): the same inputs as cutting the history at t."""
    index, _, catalog = world
    rng = np.random.default_rng(0)
    ads = np.append(rng.choice(catalog.column("item_id").to_numpy(), 40), [-7])  # one unknown ad
    t_ms = int(np.median(index.event_time))
    users = np.append(index.user_ids[:30], [999_999])  # one user without a history
    rows = index.rows_of(users)
    ends = index.ends_before(rows, np.full(len(users), t_ms))
    last = np.array(
        [index.event_time[index.offsets[r] + e - 1] if r >= 0 and e else 0 for r, e in zip(rows, ends, strict=True)]
    )
    at_ms = int(last.max()) + 1  # every user's last event before t is before the precompute time
    clock = ManualClock(t_ms / 1000)
    with LmdbStore(LmdbConfig(str(tmp_path / "store")), clock=clock) as store:
        write_user_contexts(store, index, users, at_ms, model_version="ctx-test")
        for user in users.tolist():
            read = store.read_for_request(user, ads, with_context=True)
            assert read.context is not None and read.context.found
            served = context_inputs(
                decode_contexts([read.context.payload])[0], ads, catalog, surface=3, request_ms=t_ms
            )
            batch = build_candidate_batch(index, _request(user, ads, t_ms, 3), max_len=32, catalog=catalog)
            _assert_rows_equal(served, inputs_from_batch(batch))


def test_served_inputs_equal_the_training_rows_of_the_same_impressions(
    world: tuple[HistoryIndex, pa.Table, pa.Table],
) -> None:
    """The ranker's training rows (``ranker_inputs``) against the context at each impression's time:
    window, count and match features and the ad's ids equal; the device is the one field serving
    does not know (-1), as in ``build_candidate_batch``."""
    index, examples, catalog = world
    ads = examples.filter(pa.compute.equal(examples.column("is_ad"), True)).slice(0, 300)
    trained = ranker_inputs(ExampleSet(index, ads), "clicked")
    at = ads.column("event_time").cast(pa.int64()).to_numpy()
    contexts = decode_contexts(encode_contexts(user_contexts(index, ads.column("user_id").to_numpy(), at)))
    items = ads.column("item_id").to_numpy()
    surfaces = ads.column("surface").to_numpy()
    compared = 0
    for i in range(ads.num_rows):
        served = context_inputs(contexts[i], items[i : i + 1], catalog, surface=int(surfaces[i]), request_ms=int(at[i]))
        np.testing.assert_array_equal(served.window[0], trained.window[i])
        np.testing.assert_array_equal(served.dense[0], trained.dense[i])
        np.testing.assert_array_equal(np.delete(served.ids[0], 4), np.delete(trained.ids[i], 4))
        assert served.ids[0, 4] == -1
        compared += 1
    assert compared == ads.num_rows > 100


def test_a_missing_context_reads_as_a_user_without_events(world: tuple[HistoryIndex, pa.Table, pa.Table]) -> None:
    index, _, catalog = world
    ads = catalog.column("item_id").to_numpy()[:5]
    served = context_inputs(None, ads, catalog, surface=1, request_ms=10**12)
    req = _request(123_456_789, ads, 10**12, 1)
    _assert_rows_equal(served, inputs_from_batch(build_candidate_batch(index, req, max_len=32, catalog=catalog)))


def test_decode_refuses_payloads_of_another_window() -> None:
    with pytest.raises(ValueError, match="expected"):
        decode_contexts([b"\x00" * 10])
