"""Historical representations (LoopFM): point-in-time sequences, their stored layout, and the
ranker's two ways of reading them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from pipelines.model import GemModel, HistoryIndex
from pipelines.model.context import context_dtype, decode_contexts, decode_sequences, encode_contexts
from pipelines.model.rep_history import compute_rep_history, events_needed, rep_history_table, rep_sequences
from pipelines.schemas.layouts import rep_history_schema
from pipelines.transfer.data import VerticalSpec, prepare_splits
from pipelines.transfer.downstream import RankerConfig, fit_ranker, predict_ranker, ranker_inputs
from tests.model.factories import tiny_config
from tests.model.toyworld import ToyWorld, make_world

LENGTH = 6


@pytest.fixture(scope="module")
def world() -> tuple[pa.Table, pa.Table, GemModel]:
    histories, examples = make_world(ToyWorld(users=60, days=4, mean_impressions=15, seed=8))
    torch.manual_seed(0)
    return histories, examples, GemModel(tiny_config(max_len=32)).eval()


def _cut(index: HistoryIndex, examples: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    return index.rows_of(examples.column("user_id").to_numpy()), examples.column("history_end").to_numpy()


def _sequences(histories: pa.Table, examples: pa.Table, model: GemModel) -> np.ndarray:
    index = HistoryIndex(histories)
    rows, ends = _cut(index, examples)
    history = compute_rep_history(model, index, events_needed(index, rows, ends, LENGTH))
    return rep_sequences(history, index, rows, ends, LENGTH)


def _before(histories: pa.Table, cutoff_ms: int) -> pa.Table:
    """The histories as a snapshot taken at ``cutoff_ms`` holds them: later events never arrived."""
    rows = histories.to_pylist()
    for row in rows:
        kept = [e for e in row["events"] if int(e["event_time"].timestamp() * 1000) < cutoff_ms]
        row["num_events_total"] -= len(row["events"]) - len(kept)
        row["events"] = kept
    return pa.Table.from_pylist(rows, schema=histories.schema)


def test_no_representation_computed_after_an_example_reaches_it(world: tuple[pa.Table, pa.Table, GemModel]) -> None:
    histories, examples, model = world
    times = examples.column("event_time").cast(pa.int64()).to_numpy()
    cutoff = int(np.median(times))
    early = examples.filter(pc.less(examples.column("event_time").cast(pa.int64()), cutoff))
    assert early.num_rows > 20
    full = _sequences(histories, early, model)
    # the world after the cutoff (later events, and the outcomes of these impressions) is gone:
    # an as-of computation cannot tell the difference
    truncated = _sequences(_before(histories, cutoff), early, model)
    np.testing.assert_array_equal(full, truncated)
    assert np.any(full != 0), "the examples read some historical representations"


def test_each_example_reads_only_events_before_it(world: tuple[pa.Table, pa.Table, GemModel]) -> None:
    histories, examples, model = world
    index = HistoryIndex(histories)
    rows, ends = _cut(index, examples)
    seq = _sequences(histories, examples, model)
    held = np.any(seq != 0, axis=2).sum(1)
    np.testing.assert_array_equal(held, np.minimum(ends, LENGTH))
    # the newest event a window holds (right-aligned, so every other one is older) precedes the example
    some = ends > 0
    newest = index.offsets[rows[some]] + ends[some] - 1
    assert np.all(index.event_time[newest] < examples.column("event_time").cast(pa.int64()).to_numpy()[some])


def test_an_example_without_history_gets_the_fallback_in_its_newest_slot(
    world: tuple[pa.Table, pa.Table, GemModel],
) -> None:
    histories, _, model = world
    index = HistoryIndex(histories)
    rows = np.array([0, -1, 1])
    ends = np.array([0, 0, 2])
    history = compute_rep_history(model, index, events_needed(index, rows, ends, LENGTH))
    fallback = np.arange(3 * model.config.representation_dim, dtype=np.float32).reshape(3, -1) + 1
    seq = rep_sequences(history, index, rows, ends, LENGTH, fallback)
    np.testing.assert_array_equal(seq[0, -1], fallback[0])
    np.testing.assert_array_equal(seq[1, -1], fallback[1])
    assert not np.any(seq[:2, :-1])
    assert np.any(seq[2, -2:] != 0) and not np.any(seq[2, -1] == fallback[2])
    with pytest.raises(ValueError, match="no representation"):
        rep_sequences(history, index, np.array([1]), np.array([5]), LENGTH)


def test_the_stored_layout_keeps_each_users_events_in_order(world: tuple[pa.Table, pa.Table, GemModel]) -> None:
    histories, examples, model = world
    index = HistoryIndex(histories)
    rows, ends = _cut(index, examples)
    history = compute_rep_history(model, index, events_needed(index, rows, ends, LENGTH))
    table = rep_history_table(history, index)
    assert table.schema.equals(rep_history_schema(model.config.representation_dim), check_metadata=False)
    assert table.schema.metadata[b"gem.layout"] == b"rep_history"
    assert sum(len(e) for e in table.column("events").to_pylist()) == len(history)
    for events in table.column("events").to_pylist():
        positions = [e["position"] for e in events]
        assert positions == sorted(positions)


@pytest.mark.parametrize("mode", ["attention", "pool"])
def test_the_ranker_ignores_padding_in_the_sequence(world: tuple[pa.Table, pa.Table, GemModel], mode: str) -> None:
    histories, examples, model = world
    index = HistoryIndex(histories)
    splits = prepare_splits(index, examples, VerticalSpec(max_train=300, max_validation=100, max_holdout=100))
    x = ranker_inputs(splits.train.examples, "clicked")
    rows, ends = _cut(index, splits.train.rows)
    history = compute_rep_history(model, index, events_needed(index, rows, ends, LENGTH))
    seq = rep_sequences(history, index, rows, ends, LENGTH)
    ranker = fit_ranker(x, splits.train.weights, RankerConfig(epochs=1, hidden=(8,), seq_mode=mode), seq=seq)
    padded = np.concatenate([np.zeros((len(seq), 3, seq.shape[2]), np.float32), seq], axis=1)
    np.testing.assert_allclose(predict_ranker(ranker, x, seq=seq), predict_ranker(ranker, x, seq=padded), rtol=1e-5)


def test_a_context_record_carries_the_sequence() -> None:
    rng = np.random.default_rng(0)
    contexts = np.zeros(2, context_dtype())
    contexts["last_ms"] = [5, 7]
    seq = rng.normal(size=(2, 4, 8)).astype(np.float32)
    payloads = encode_contexts(contexts, seq)
    np.testing.assert_array_equal(decode_contexts(payloads, sequence=(4, 8)), contexts)
    np.testing.assert_array_equal(decode_sequences(payloads, 4, 8), seq.astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="no sequence"):
        decode_contexts(payloads)


@pytest.mark.parametrize("mode", ["attention", "pool"])
def test_one_sequence_serves_every_candidate_of_a_request(
    world: tuple[pa.Table, pa.Table, GemModel], mode: str
) -> None:
    histories, examples, _ = world
    index = HistoryIndex(histories)
    splits = prepare_splits(index, examples, VerticalSpec(max_train=200, max_validation=50, max_holdout=50))
    x = ranker_inputs(splits.train.examples, "clicked")
    seq = np.random.default_rng(1).normal(size=(1, LENGTH, 8)).astype(np.float32)
    ranker = fit_ranker(
        x, splits.train.weights, RankerConfig(epochs=1, hidden=(8,), seq_mode=mode), seq=seq.repeat(len(x), 0)
    )
    np.testing.assert_allclose(
        predict_ranker(ranker, x, seq=seq), predict_ranker(ranker, x, seq=seq.repeat(len(x), 0)), rtol=1e-5
    )
