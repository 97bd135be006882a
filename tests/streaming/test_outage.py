"""A broker outage under a running `stream` job, on a private broker of the test
session's own (the shared one is never stopped): the job rides it out within --broker-timeout, logs
one line when the broker goes away and one when it is back (no traceback), and its histories equal a
replay of the topic."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from pipelines.io.kafka.produce import ensure_topic
from pipelines.streaming.state import latest_histories
from tests.fixtures.kafka import PrivateBroker, produce
from tests.streaming.streams import committed, generate, keyed, replay, same_histories, stream_cmd

pytestmark = pytest.mark.integration

#: How long the broker stays stopped: longer than a request's timeout, shorter than --broker-timeout.
OUTAGE_S = 20


def _wait_for_commits(broker: PrivateBroker, topic: str, group: str, target: int, job: subprocess.Popen, log: Path):
    deadline = time.monotonic() + 180
    while sum(c or 0 for c in committed(broker.connection, topic, group, 2)) < target:
        assert job.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"not {target} committed in time: {log.read_text()[-4000:]}"
        time.sleep(0.3)


def _outage(broker: PrivateBroker, kind: str) -> None:
    """The broker goes away under the running job for about OUTAGE_S, and comes back: ``paused`` stops
    answering (SIGSTOP: connections stay open, requests time out), ``stopped`` is shut down and started
    again (connections refused)."""
    if kind == "paused":
        broker.pause()
        try:
            time.sleep(OUTAGE_S)  # the outage itself (not a wait for a condition)
        finally:
            broker.resume()
        return
    started = time.monotonic()
    broker.script("down")
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - started)))  # the outage itself
    broker.script("up")


@pytest.mark.parametrize("outage", ["paused", "stopped"])
def test_stream_rides_out_a_broker_outage(
    private_kafka: PrivateBroker, tmp_path: Path, prism: str, outage: str
) -> None:
    broker = private_kafka
    lines = generate(tmp_path, 100, seed=26)
    first, second = lines[: len(lines) // 2], lines[len(lines) // 2 :]
    topic, group = f"outage-{uuid.uuid4().hex[:10]}", f"g-{uuid.uuid4().hex[:8]}"
    assert ensure_topic(broker.connection, topic, 2, configs={"retention.ms": "-1"})
    produce(broker.connection, topic, first, keys=keyed(first))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    command = stream_cmd(topic, group, out, "--broker-timeout", "90", bootstrap=broker.bootstrap)
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True)
    try:
        _wait_for_commits(broker, topic, group, len(first), job, log)
        _outage(broker, outage)
        assert job.poll() is None, f"the job died during the outage: {log.read_text()[-4000:]}"
        produce(broker.connection, topic, second, keys=keyed(second))
        _wait_for_commits(broker, topic, group, len(lines), job, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    same_histories(latest_histories(str(out)), replay(topic, tmp_path / "batch", bootstrap=broker.bootstrap))
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    down = [line for line in text.splitlines() if "unreachable" in line]
    back = [line for line in text.splitlines() if "back after" in line]
    assert len(down) == 1 and len(back) == 1, text[-4000:]  # one line per state change
