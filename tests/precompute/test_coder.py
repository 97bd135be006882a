"""GemBatchCoder: a request's shared history travels once and comes back row for row."""

from __future__ import annotations

from dataclasses import fields

import pyarrow as pa
import pytest
import torch

from pipelines.model.inputs import SEQUENCE_FIELDS, GemBatch, HistoryIndex, ad_catalog, build_user_batch
from pipelines.precompute.coder import GemBatchCoder
from pipelines.precompute.requests import request_elements
from tests.model.factories import random_batch
from tests.precompute.conftest import World


def _same(a: GemBatch, b: GemBatch) -> None:
    for f in fields(GemBatch):
        left, right = getattr(a, f.name), getattr(b, f.name)
        if left is None or right is None:
            assert left is None and right is None, f.name
        else:
            torch.testing.assert_close(right, left, equal_nan=True, rtol=0, atol=0, msg=f.name)


def _index(world: World) -> HistoryIndex:
    return HistoryIndex(world.histories)


def test_a_request_round_trips_with_its_history_stored_once(world: World) -> None:
    index = _index(world)
    requests = request_elements(index, pa.parquet.read_table(world.candidates), max_len=48, catalog=ad_catalog(index))
    batch = max((b for _, b in requests), key=lambda b: b.num_tokens)
    assert batch.num_rows > 1 and batch.num_tokens > 0
    coder = GemBatchCoder()
    encoded = coder.encode(batch)
    _same(batch, coder.decode(encoded))
    per_row_history_bytes = sum(getattr(batch, name).nbytes for name in SEQUENCE_FIELDS)
    assert len(encoded) < per_row_history_bytes / 10  # the history once, not once per ad


@pytest.mark.parametrize("labels", [False, True])
def test_batches_without_shared_histories_round_trip(world: World, labels: bool) -> None:
    coder = GemBatchCoder()
    _same(users := build_user_batch(_index(world), max_len=48), coder.decode(coder.encode(users)))
    batch = random_batch([3, 0, 7], seed=2, with_labels=labels)
    batch.user_id[:] = torch.tensor([1, 2, 3])
    _same(batch, coder.decode(coder.encode(batch)))
