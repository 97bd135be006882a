"""``stream --rep-history N``: each flush appends its new events' historical representations.

The append's pure part against the batch computation (two flushes, a late event, a row whose
positions no longer fit), and a whole ``stream`` run on Prism over a real Kafka topic against
``precompute --rep-history`` on ``replay``'s histories of the same topic."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipelines.cli import main
from pipelines.errors import ConfigError
from pipelines.io.kafka.config import KafkaConnection
from pipelines.model import GemModel, HistoryIndex
from pipelines.model.rep_history import compute_rep_history, latest_events, latest_rep_history, stored_reps
from pipelines.streaming import rep_history as streamed
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.rep_history import append_rep_history
from pipelines.streaming.state import latest_histories, merge_shard
from tests.features.factories import event, events_table
from tests.fixtures.kafka import MakeTopic, produce
from tests.model.factories import tiny_config
from tests.streaming.streams import committed, keyed, replay, stream_cmd
from tests.streaming.test_stream_refresh import world_with_model

N = 4
#: The Prism run's length: most generated users' whole two days (so that many rows hold events of
#: both runs), a few heavy users' more than it keeps.
N_STREAM = 32


@pytest.fixture(scope="module")
def model() -> GemModel:
    torch.manual_seed(0)
    return GemModel(tiny_config(max_len=32)).eval()


def _events(user: int, start: int, count: int) -> list[dict]:
    return [event(f"u{user}-{i}", user, 1000 * i, item_id=100 + i) for i in range(start, start + count)]


def _want(model: GemModel, history: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(positions, embeddings) of the batch computation on ``history``'s newest N events."""
    index = HistoryIndex(history)
    got = compute_rep_history(model, index, latest_events(index, N))
    return got.event, got.embedding


def _flushes(model: GemModel, batches: list[list[dict]]) -> tuple[pa.Table, pa.Table]:
    """(the history, its REP_HISTORY row) after flushing ``batches`` one by one."""
    history: pa.Table | None = None
    reps: pa.Table | None = None
    for batch in batches:
        merged = merge_shard(events_table(batch), history, max_history=64)
        previous = merged.changed.slice(0, 0) if history is None else history
        reps = append_rep_history(model, previous, merged.changed, reps, N)
        history = merged.state
    assert history is not None and reps is not None
    return history, reps


def test_two_flushes_append_what_the_batch_computes_on_the_whole_history(
    model: GemModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    computed: list[int] = []
    real = streamed.compute_rep_history

    def spy(m: GemModel, index: HistoryIndex, events: np.ndarray) -> Any:
        computed.append(len(events))
        return real(m, index, events)

    monkeypatch.setattr(streamed, "compute_rep_history", spy)
    history, reps = _flushes(model, [_events(7, 0, 3), _events(7, 3, 2)])
    assert computed == [3, 2]  # the second flush runs the model on its two new events only
    positions, embedding = stored_reps(reps)
    want_positions, want = _want(model, history)
    assert positions.tolist() == want_positions.tolist() == [1, 2, 3, 4]  # the newest N of 5
    np.testing.assert_allclose(embedding, want, rtol=2e-3, atol=1e-4)
    times = [e["event_time"] for e in reps.column("events")[0].as_py()]
    assert times == sorted(times) and len(times) == N


def test_a_late_event_gets_its_own_and_the_later_ones_keep_theirs(model: GemModel) -> None:
    early = _events(7, 0, 2) + _events(7, 3, 2)  # times 0, 1, 3, 4 s
    history, before = _flushes(model, [early])
    late = _events(7, 2, 1)  # time 2 s: lands between the stored events
    merged = merge_shard(events_table(late), history, max_history=64)
    after = append_rep_history(model, history, merged.changed, before, N)
    old_positions, old = stored_reps(before)
    positions, embedding = stored_reps(after)
    assert old_positions.tolist() == [0, 1, 2, 3] and positions.tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(embedding[[0, 2, 3]], old[1:])  # carried over, moved by one
    want_positions, want = _want(model, merged.state)
    np.testing.assert_allclose(embedding[1], want[list(want_positions).index(2)], rtol=2e-3, atol=1e-4)


def test_a_row_that_no_longer_fits_its_history_is_recomputed(model: GemModel) -> None:
    history, reps = _flushes(model, [_events(7, 0, 3)])
    wrong = _flushes(model, [_events(7, 10, 3)])[1]  # another history's row: its event times differ
    more = merge_shard(events_table(_events(7, 3, 1)), history, max_history=64)
    fixed = append_rep_history(model, history, more.changed, wrong, N)
    want_positions, want = _want(model, more.state)
    positions, embedding = stored_reps(fixed)
    assert positions.tolist() == want_positions.tolist()
    np.testing.assert_allclose(embedding, want, rtol=2e-3, atol=1e-4)
    assert stored_reps(reps)[0].tolist() == [0, 1, 2]


def test_rep_history_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--rep-history"):
        StreamConfig(topic="t", output=str(tmp_path), group="g", rep_history=3)
    with pytest.raises(ConfigError, match="--rep-history"):
        StreamConfig(topic="t", output=str(tmp_path), group="g", rep_history=-1, model="m")
    # a model without a store is enough for historical representations (no refresh then)
    assert not StreamConfig(topic="t", output=str(tmp_path), group="g", rep_history=3, model="m").refresh
    with pytest.raises(ConfigError, match="--candidates"):  # read only by the refresh, which needs a store
        StreamConfig(topic="t", output=str(tmp_path), group="g", rep_history=3, model="m", candidates=("c",))
    argv = ["stream", "--topic", "t", "--group", "g", "--output", str(tmp_path / "o"), "--rep-history", "3"]
    assert main(argv) == 2


def halves(lines: list[bytes]) -> tuple[list[bytes], list[bytes], int]:
    """The topic's lines cut at the median event time, each half in event-time order (malformed
    lines first), and the time they are cut at: the second half only adds later events."""
    timed: list[tuple[int, bytes]] = []
    for raw in lines:
        try:
            timed.append((int(json.loads(raw)["event_time"]), raw))
        except (ValueError, KeyError, TypeError):
            timed.append((-1, raw))
    timed.sort(key=lambda tr: tr[0])
    middle = timed[len(timed) // 2][0]
    return [r for t, r in timed if t < middle], [r for t, r in timed if t >= middle], middle


@pytest.mark.integration
def test_a_stream_in_two_runs_appends_what_precompute_backfills_on_replayed_histories(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    lines, candidates, model = world_with_model(tmp_path)
    first, second, middle = halves(lines)
    topic, group, out = make_topic(2), f"g-{uuid.uuid4().hex[:8]}", tmp_path / "stream"
    cmd = stream_cmd(topic, group, out, "--idle-exit", "3", "--model", str(model), "--rep-history", str(N_STREAM))
    for half in (first, second):  # the second run meets every user afresh: their rows come from the files
        produce(kafka, topic, half, keys=keyed(half))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)

    got, histories = assert_rep_history_equals_precompute(tmp_path, topic, out, candidates, model)
    # the append path: rows holding entries of both runs (carried from the first, added by the second)
    assert rows_spanning(got, middle) >= 3
    assert max(len(e) for e in histories.column("events").to_pylist()) > N_STREAM  # the oldest dropped
    assert latest_histories(str(out)).num_rows == histories.num_rows


def rows_spanning(rows: pa.Table, middle: int) -> int:
    """How many REP_HISTORY rows hold events both before ``middle`` (ms) and at or after it."""
    spans = [[round(e["event_time"].timestamp() * 1000) for e in row] for row in rows.column("events").to_pylist()]
    return sum(min(times) < middle <= max(times) for times in spans)


def assert_rep_history_equals_precompute(
    tmp_path: Path, topic: str, out: Path, candidates: Path, model: Path
) -> tuple[pa.Table, pa.Table]:
    """The stream's rows under ``out`` equal ``precompute --rep-history N_STREAM`` on ``replay``'s
    histories of ``topic`` (same users, positions and times; vectors within a float16 step);
    returns (the stream's rows, the replayed histories)."""
    histories = replay(topic, tmp_path / "batch")
    batch = tmp_path / "reps"
    argv = ["precompute", "--features", str(tmp_path / "batch"), "--candidates", str(candidates)]
    argv += ["--model", str(model), "--all-users"]
    argv += ["--output", str(batch), "--rep-history", str(N_STREAM), "--device", "cpu"]
    done = subprocess.run([sys.executable, "-m", "pipelines", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = latest_rep_history(str(out)), latest_rep_history(str(batch))
    assert got.column("user_id").to_pylist() == want.column("user_id").to_pylist()
    assert got.num_rows == histories.num_rows
    for g, w in zip(got.column("events").to_pylist(), want.column("events").to_pylist(), strict=True):
        assert [e["position"] for e in g] == [e["position"] for e in w]
        assert [e["event_time"] for e in g] == [e["event_time"] for e in w]
        np.testing.assert_allclose(
            np.asarray([e["embedding"] for e in g], np.float32),
            np.asarray([e["embedding"] for e in w], np.float32),
            rtol=2e-3,
            atol=1e-3,
        )
    return got, histories
