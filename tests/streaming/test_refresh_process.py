"""RefreshProcess: the streaming job's representation refresh, run in a child process (LMDB stores)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.store import open_store
from pipelines.streaming.job import StreamConfig
from pipelines.streaming.refresh import RefreshError, RefreshProcess, open_refresh
from tests.precompute.conftest import World


def _config(world: World, store: Path, model: Path | None = None) -> StreamConfig:
    return StreamConfig(
        topic="t", output="unused", group="g", model=str(model or world.model), store=f"lmdb://{store}", device="cpu"
    )


def _histories(world: World) -> pa.Table:
    return world.histories.slice(0, 40)


def _embeddings(store: Path, users: list[int]) -> np.ndarray:
    with open_store(f"lmdb://{store}") as opened:
        got = opened.read_batch([(u, None) for u in users])
    assert got.found.all()
    return np.asarray(got.embedding)


def test_the_child_writes_what_the_in_process_refresh_writes(world: World, tmp_path: Path) -> None:
    histories = _histories(world)
    users = histories.column("user_id").to_pylist()
    refresh = RefreshProcess(_config(world, tmp_path / "child"))
    refresh(histories)
    open_refresh(_config(world, tmp_path / "here"))(histories)
    np.testing.assert_allclose(_embeddings(tmp_path / "child", users), _embeddings(tmp_path / "here", users), atol=1e-6)


def test_a_bad_checkpoint_fails_the_start_with_the_childs_traceback(world: World, tmp_path: Path) -> None:
    (tmp_path / "no-model").mkdir()
    with pytest.raises(RefreshError, match="start failed in the refresh process") as failed:
        RefreshProcess(_config(world, tmp_path / "store", model=tmp_path / "no-model"))
    assert "Traceback" in str(failed.value)


def test_a_failed_refresh_is_raised_and_the_child_keeps_serving(world: World, tmp_path: Path) -> None:
    refresh = RefreshProcess(_config(world, tmp_path / "store"))
    with pytest.raises(RefreshError, match="refresh of 1 users failed"):
        refresh(pa.table({"not_a_history": [1]}))
    histories = _histories(world)
    refresh(histories)
    assert len(_embeddings(tmp_path / "store", histories.column("user_id").to_pylist())) == histories.num_rows


def test_a_dead_child_is_a_refresh_error(world: World, tmp_path: Path) -> None:
    refresh = RefreshProcess(_config(world, tmp_path / "store"))
    refresh._process.kill()
    refresh._process.join()
    with pytest.raises(RefreshError, match="died"):
        refresh(pa.concat_tables([_histories(world)] * 50))  # more than a pipe holds: the send fails
