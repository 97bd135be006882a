"""``precompute --rep-history N``: the historical representations' backfill equals the pure
computation on each user's newest N events."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from pipelines.cli import main
from pipelines.model import HistoryIndex, load_model
from pipelines.model.rep_history import compute_rep_history, latest_events
from pipelines.schemas.layouts import layout_of
from tests.precompute.conftest import World

N = 5


def test_the_backfill_holds_each_users_newest_events_as_of_each(world: World, tmp_path: Path) -> None:
    out = tmp_path / "reps"
    argv = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    argv += ["--model", str(world.model), "--output", str(out), "--rep-history", str(N), "--device", "cpu"]
    assert main(argv) == 0
    got = ds.dataset(out / "rep_history", format="parquet", partitioning="hive").to_table()
    assert layout_of(ds.dataset(out / "rep_history", format="parquet").schema) == ("rep_history", 1)
    index = HistoryIndex(world.histories)
    want = compute_rep_history(load_model(world.model, device="cpu"), index, latest_events(index, N))
    by_user = {u: e for u, e in zip(got.column("user_id").to_pylist(), got.column("events").to_pylist(), strict=True)}
    lengths = np.diff(index.offsets)
    assert set(by_user) == set(index.user_ids[lengths > 0].tolist())
    rows = index.rows_of(np.asarray(list(by_user), np.int64))
    for (user, events), row in zip(by_user.items(), rows, strict=True):
        positions = [e["position"] for e in events]
        assert positions == list(range(max(0, lengths[row] - N), lengths[row])), user
        flat = index.offsets[row] + np.asarray(positions)
        expected = want.embedding[np.searchsorted(want.event, flat)]
        stored = np.asarray([e["embedding"] for e in events], np.float32)
        # per shard vs the whole world: other batches, so at most a float16 step apart
        np.testing.assert_allclose(stored, expected, rtol=2e-3, atol=1e-4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rep_history_events"] == len(want) == sum(len(e) for e in by_user.values())
    assert summary["rep_history_users"] == len(by_user)


def test_a_negative_length_is_refused(world: World, tmp_path: Path) -> None:
    argv = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    argv += ["--model", str(world.model), "--output", str(tmp_path / "x"), "--rep-history", "-1"]
    assert main(argv) == 2
