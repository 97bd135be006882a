"""Candidate sets inside the stream graph on Flink (parallelism 2, the SDK worker pool): sets that
arrive once their users' events are in the keyed state get the pairs batch ``precompute`` computes on
the same histories, in a real Redis, and both topics are committed to their end; a TaskManager
SIGKILLed while sets arrive loses none of those in time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.store import open_store
from pipelines.store.redis_store import default_redis_url
from tests.conftest import require_redis
from tests.fixtures.kafka import MakeTopic, produce
from tests.runners.test_flink_stream import (  # noqa: F401
    OwnFlink,
    _finish,
    _flink_args,
    _running_job,
    _start,
    _stop,
    own_flink,
)
from tests.streaming.streams import committed, keyed, replay, send_sets, stream_cmd
from tests.streaming.test_stream_pairs import (
    assert_pairs_equal_batch,
    batch_pairs,
    funnel_sets,
    pair_keys_of,
    write_catalog,
)
from tests.streaming.test_stream_refresh import world_with_model

pytestmark = pytest.mark.integration


@dataclass
class World:
    """Events on a topic, their histories in batch, an untrained model, a Redis namespace, and the
    ``stream`` job's flags for both topics."""

    kafka: KafkaConnection
    tmp: Path
    events: int
    histories: pa.Table
    model: Path
    store: str
    topic: str
    sets_topic: str
    group: str

    def stream(self, cluster: OwnFlink) -> subprocess.Popen[bytes]:
        """The job, started: --idle-exit 10 ends it once both topics stayed committed that long (a
        test sends its sets within a second of the events' commit)."""
        catalog = write_catalog(self.histories, self.tmp / "catalog.parquet")
        pairs = ["--candidates-topic", self.sets_topic, "--model", str(self.model), "--store", self.store]
        cmd = stream_cmd(self.topic, self.group, self.tmp / "stream", "--idle-exit", "10", *pairs)
        return _start([*cmd, "--ad-catalog", str(catalog), *_flink_args(cluster)], self.log)

    @property
    def log(self) -> Path:
        return self.tmp / "stream.log"

    def wait_committed(self, topic: str, records: int, job: subprocess.Popen[bytes], deadline: float) -> None:
        while sum(c or 0 for c in committed(self.kafka, topic, self.group, 2)) < records:
            assert job.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{topic} not committed in time"
            time.sleep(0.5)


def _world(kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prefix: str) -> World:
    base = default_redis_url()
    require_redis(base)
    lines, _, model = world_with_model(tmp_path)
    topic = make_topic(2, prefix=f"{prefix}-events")
    produce(kafka, topic, lines, keys=keyed(lines))
    return World(
        kafka=kafka,
        tmp=tmp_path,
        events=len(lines),
        histories=replay(topic, tmp_path / "batch"),
        model=model,
        store=f"{base}?namespace=gem-test:{uuid.uuid4().hex}:",
        topic=topic,
        sets_topic=make_topic(2, prefix=f"{prefix}-sets"),
        group=f"{prefix}-g-{uuid.uuid4().hex[:8]}",
    )


def test_stream_on_flink_candidate_sets_meet_the_keyed_state_and_equal_batch_precompute(
    kafka: KafkaConnection,
    make_topic: MakeTopic,
    own_flink: OwnFlink,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    w = _world(kafka, make_topic, tmp_path, "i30-flink")
    job = w.stream(own_flink)
    try:
        # the sets come once every event is in the keyed state (committed = flushed and checkpointed)
        w.wait_committed(w.topic, w.events, job, time.monotonic() + 300)
        live, late, other = funnel_sets(w.histories, int(time.time() * 1000))
        sent = send_sets(kafka, w.sets_topic, live, late, other, bad=[b"{not json"])
        done = _finish(job, w.log, own_flink, timeout=300)
    finally:
        _stop(job)
    assert done == 0, w.log.read_text()[-3000:]
    assert sum(c or 0 for c in committed(kafka, w.sets_topic, w.group, 2)) == sent
    assert_pairs_equal_batch(w.store, batch_pairs(tmp_path, tmp_path / "batch", live, w.model), w.histories)
    with open_store(w.store) as s:
        assert not s.read_batch(pair_keys_of(late) + pair_keys_of(other)).found.any()


def test_stream_on_flink_a_taskmanager_sigkill_loses_no_candidate_set_in_time(
    kafka: KafkaConnection,
    make_topic: MakeTopic,
    own_flink: OwnFlink,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """Sets keep coming while a TaskManager (its SDK workers with it) is SIGKILLed: Flink restarts the
    job from its last checkpoint, the sets not yet committed are read again, and every set in time
    ends with its pairs in the store, equal to batch ``precompute``'s."""
    w = _world(kafka, make_topic, tmp_path, "i30-kill")
    live, late, other = funnel_sets(w.histories, int(time.time() * 1000), live_sets=24)
    chunks = [live.slice(i, 3) for i in range(0, live.num_rows, 3)]
    job = w.stream(own_flink)
    try:
        deadline = time.monotonic() + 300
        jid = _running_job(own_flink, job, w.log, deadline)
        w.wait_committed(w.topic, w.events, job, deadline)
        send_sets(kafka, w.sets_topic, chunks[0])
        w.wait_committed(w.sets_topic, 1, job, deadline)  # a checkpoint covered some sets
        send_sets(kafka, w.sets_topic, chunks[1])  # read, and not yet committed, at the kill
        time.sleep(0.5)
        at_kill = sum(c or 0 for c in committed(kafka, w.sets_topic, w.group, 2))
        os.kill(own_flink.taskmanager_pid(), signal.SIGKILL)  # a TaskManager dies mid-topic ...
        # ... sets go on arriving (before the replacement starts: the topic is then never all
        # committed long enough for --idle-exit to end the job while it restarts) ...
        for chunk in chunks[2:]:
            send_sets(kafka, w.sets_topic, chunk)
            time.sleep(0.2)
        own_flink.sh("up")  # ... and a replacement registers its slots
        sent = live.num_rows + send_sets(kafka, w.sets_topic, late, other)
        done = _finish(job, w.log, own_flink, timeout=600)
    finally:
        _stop(job)
    assert done == 0, w.log.read_text()[-3000:]
    assert 0 < at_kill < live.num_rows, f"not mid-topic: {at_kill} of {live.num_rows} sets committed at the kill"
    assert own_flink.get(f"/jobs/{jid}/checkpoints")["counts"]["restored"] >= 1  # restarted from a checkpoint
    assert sum(c or 0 for c in committed(kafka, w.sets_topic, w.group, 2)) == sent
    assert_pairs_equal_batch(w.store, batch_pairs(tmp_path, tmp_path / "batch", live, w.model), w.histories)
