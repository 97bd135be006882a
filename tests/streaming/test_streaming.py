"""Streaming histories on Prism against the real broker: parity with replay, SIGKILL + restart without loss.
A broker restart under the running job is tests/streaming/test_outage.py's, on a private broker (stopping
the shared one failed other tests running beside it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.state import latest_histories
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import (
    committed,
    generate,
    keyed,
    replay,
    same_histories,
    skewed,
    stream_cmd,
    trickle,
    wait_for_a_commit,
)

pytestmark = pytest.mark.integration


def _dead_sources(output: Path) -> list[str]:
    files = sorted((output / "dead_letters").glob("*.parquet"))
    return sorted(s for f in files for s in pq.read_table(f).column("source").to_pylist())


def test_streaming_equals_replay_and_commits_everything(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    lines = generate(tmp_path, 120, seed=21)
    topic, group = make_topic(3), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out = tmp_path / "stream"
    _stream_to_idle(topic, group, out)
    batch_out = tmp_path / "batch"
    same_histories(latest_histories(str(out)), replay(topic, batch_out))
    batch_dead = sorted(pq.read_table(batch_out / "dead_letters" / "part-00000.parquet").column("source").to_pylist())
    assert _dead_sources(out) == batch_dead and batch_dead
    assert sum(c or 0 for c in committed(kafka, topic, group, 3)) == len(lines)


@pytest.mark.parametrize("flush", ["0.3", "0"])  # a timer per slot; each arrival merged at once
def test_a_skewed_topic_with_one_user_holding_a_tenth_of_the_events_equals_replay(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str, flush: str
) -> None:
    """The hot user is flushed many times, often twice in one bundle when flushed on arrival."""
    lines = skewed(generate(tmp_path, 80, seed=23))
    topic, group = make_topic(3), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out = tmp_path / "stream"
    _stream_to_idle(topic, group, out, "--flush-interval", flush)
    streamed = latest_histories(str(out))
    assert 999_999 in streamed.column("user_id").to_pylist()
    same_histories(streamed, replay(topic, tmp_path / "batch"))
    assert sum(c or 0 for c in committed(kafka, topic, group, 3)) == len(lines)


def _stream_to_idle(topic: str, group: str, out: Path, *extra: str) -> None:
    """Run the streaming job until the topic has been idle for 3 s; it must exit cleanly, and a clean run
    logs no traceback (Prism's FinalizeBundle for bundles that registered nothing logged dozens)."""
    done = subprocess.run(
        stream_cmd(topic, group, out, "--idle-exit", "3", *extra), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "finalizable" not in done.stderr, done.stderr[-3000:]


@dataclass
class _HalfStreamed:
    """A topic whose first half is produced, with the streaming job running on it."""

    lines: list[bytes]
    topic: str
    group: str
    out: Path
    log: Path
    job: subprocess.Popen

    @property
    def first(self) -> list[bytes]:
        return self.lines[: len(self.lines) // 2]

    @property
    def second(self) -> list[bytes]:
        return self.lines[len(self.lines) // 2 :]


def _start_on_first_half(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, *, users: int, seed: int, partitions: int
) -> _HalfStreamed:
    """Generate ``users``' events, produce the first half to a new topic and start the streaming job on it in
    the background, in its own session (so a SIGKILL takes its Prism too). Its stderr goes to ``log``, a file
    rather than a pipe: a full pipe would block the job."""
    lines = generate(tmp_path, users, seed=seed)
    first = lines[: len(lines) // 2]
    topic, group = make_topic(partitions), f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, first, keys=keyed(first))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    job = subprocess.Popen(
        stream_cmd(topic, group, out), stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True
    )
    return _HalfStreamed(lines, topic, group, out, log, job)


def test_sigkill_mid_topic_then_restart_loses_and_duplicates_nothing(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, prism: str
) -> None:
    run = _start_on_first_half(kafka, make_topic, tmp_path, users=150, seed=22, partitions=3)
    lines, second, topic, group, out, log, job = run.lines, run.second, run.topic, run.group, run.out, run.log, run.job

    late = trickle(kafka, topic, second, pause_s=0.3)  # over ~3 s, so the kill lands mid-topic
    try:
        wait_for_a_commit(kafka, topic, group, 3, job, log, deadline=time.monotonic() + 120)
        late.start()  # the rest of the topic arrives while the job runs ...
        time.sleep(1.0)
    finally:
        _kill(job)  # ... and the job (and its Prism) dies mid-topic
        late.join(timeout=120)
    at_kill = committed(kafka, topic, group, 3)
    assert 0 < sum(c or 0 for c in at_kill) < len(lines), f"not mid-topic: {at_kill} of {len(lines)}"
    _stream_to_idle(topic, group, out)
    batch = replay(topic, tmp_path / "batch")
    same_histories(latest_histories(str(out)), batch)
    assert sum(c or 0 for c in committed(kafka, topic, group, 3)) == len(lines)


def _kill(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's session (the job and its Prism); one already gone is no error that hides the test's own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
