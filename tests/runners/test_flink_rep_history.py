"""``stream --rep-history`` on Flink: each user's row of historical representations lives in the
keyed state Flink checkpoints, the second half of a topic is appended to rows the first half made,
and the rows equal ``precompute --rep-history`` on ``replay``'s histories of the same topic.

The job runs at parallelism 2 on a Flink cluster of its own (``own_flink``, as the Flink stream
tests run), so its SDK workers import this checkout."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from pipelines.io.kafka.config import KafkaConnection
from tests.fixtures.kafka import MakeTopic, produce
from tests.runners.test_flink_stream import OwnFlink, _finish, _flink_args, _start, _stop, own_flink  # noqa: F401
from tests.streaming.streams import committed, keyed, stream_cmd
from tests.streaming.test_rep_history_stream import (
    N_STREAM,
    assert_rep_history_equals_precompute,
    halves,
    rows_spanning,
)
from tests.streaming.test_stream_refresh import world_with_model

pytestmark = pytest.mark.integration


def test_stream_on_flink_appends_to_the_keyed_rows_what_precompute_backfills(
    kafka: KafkaConnection,
    make_topic: MakeTopic,
    own_flink: OwnFlink,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    lines, candidates, model = world_with_model(tmp_path)
    first, second, middle = halves(lines)
    topic, group = make_topic(2, prefix="i31-flink-reps"), f"i31-g-{uuid.uuid4().hex[:8]}"
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    produce(kafka, topic, first, keys=keyed(first))
    reps = ["--model", str(model), "--rep-history", str(N_STREAM)]
    job = _start(stream_cmd(topic, group, out, "--idle-exit", "3", *reps, *_flink_args(own_flink)), log)
    try:
        deadline = time.monotonic() + 300
        while sum(c or 0 for c in committed(kafka, topic, group, 2)) < len(first):  # the first half flushed
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first half was not committed in time"
            time.sleep(0.5)
        produce(kafka, topic, second, keys=keyed(second))
        done = _finish(job, log, own_flink, timeout=400)
    finally:
        _stop(job)
    assert done == 0, log.read_text()[-3000:]
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)
    got, _ = assert_rep_history_equals_precompute(tmp_path, topic, out, candidates, model)
    assert rows_spanning(got, middle) >= 3  # rows the second half appended to, in keyed state
