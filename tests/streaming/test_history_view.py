"""The benches' view of histories: follows a stream's flush files, reads a features snapshot once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.errors import ConfigError
from pipelines.streaming.history_view import HistoryView
from pipelines.streaming.state import flush_path, merge_shard, write_flush
from tests.precompute.conftest import World


def _events(user: int, n: int, start_ms: int) -> pa.Table:
    from pipelines.schemas.layouts import EVENT

    return pa.table(
        {
            "event_id": [f"e{user}-{start_ms}-{i}" for i in range(n)],
            "user_id": [user] * n,
            "item_id": list(range(n)),
            "is_ad": [False] * n,
            "advertiser_id": pa.nulls(n, pa.int64()),
            "item_category": [1] * n,
            "surface": [0] * n,
            "event_type": [0] * n,
            "event_time": pa.array([start_ms + i for i in range(n)]).cast(pa.timestamp("ms", tz="UTC")),
            "value": pa.nulls(n, pa.float32()),
            "device": pa.nulls(n, pa.int8()),
        }
    ).cast(EVENT.schema)


def test_follows_flush_files_as_the_stream_writes_them(tmp_path: Path) -> None:
    now = [0.0]
    output = str(tmp_path / "stream")
    (tmp_path / "stream").mkdir()
    view = HistoryView(output, refresh_s=1.0, clock=lambda: now[0])  # a stream that has not flushed yet
    assert view.rows(np.array([1, 2])).num_rows == 0
    first = merge_shard(_events(1, 3, 1_000), None, max_history=100)
    write_flush(first.changed, flush_path(output, 0))
    assert view.rows(np.array([1])).num_rows == 0  # not reloaded before refresh_s
    now[0] = 1.5
    rows = view.rows(np.array([1, 2]))
    assert rows["user_id"].to_pylist() == [1] and rows["num_events_total"].to_pylist() == [3]
    second = merge_shard(_events(1, 2, 5_000), first.state, max_history=100)
    write_flush(second.changed, flush_path(output, 0))
    now[0] = 3.0
    assert view.rows(np.array([1]))["num_events_total"].to_pylist() == [5]


def test_reads_a_features_snapshot(world: World) -> None:
    view = HistoryView(str(world.features))
    users = world.histories["user_id"].to_numpy()[:5]
    assert sorted(view.rows(users)["user_id"].to_pylist()) == sorted(users.tolist())
    assert view.num_users == world.histories.num_rows


def test_a_missing_folder_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--histories"):
        HistoryView(str(tmp_path / "nowhere"))
