"""When a partition's read ends on its own: after ``--idle-exit`` on Prism (the job then ends), never
on Flink, where the driver cancels the job and an ended read would leave later records unread."""

from __future__ import annotations

import time

import pytest

from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.outage import BrokerWatch
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.job import _ReadPartitionFn


def _reader(checkpointed: bool, committed: int) -> _ReadPartitionFn:
    config = StreamConfig(topic="t", output="o", group="g", idle_exit_s=0.05, checkpointed=checkpointed)
    reader = _ReadPartitionFn(KafkaConnection(), config)
    reader._idle_since, reader._commits = {}, {0: (committed, 0.0)}  # what setup() and polls keep
    reader._watch = BrokerWatch("127.0.0.1:1", limit_s=60)
    return reader


@pytest.mark.parametrize(("checkpointed", "ends"), [(False, True), (True, False)])
def test_a_quiet_committed_partition_ends_its_read_on_prism_only(checkpointed: bool, ends: bool) -> None:
    reader = _reader(checkpointed, committed=10)
    assert not reader._idle(0, 10)  # quiet from now
    time.sleep(0.1)
    assert reader._idle(0, 10) is ends


def test_a_partition_with_uncommitted_reads_never_ends_its_read() -> None:
    reader = _reader(False, committed=7)
    reader._idle(0, 10)
    time.sleep(0.1)
    assert not reader._idle(0, 10)


def test_a_broker_away_is_no_quiet_topic() -> None:
    reader = _reader(False, committed=10)
    reader._idle(0, 10)
    reader._watch.failed(ConnectionRefusedError("broker away"))
    time.sleep(0.1)
    assert not reader._idle(0, 10)  # the outage does not count as quiet ...
    reader._watch.ok()
    assert not reader._idle(0, 10)  # ... and the quiet spell starts again once it is back
    time.sleep(0.1)
    assert reader._idle(0, 10)


def test_sigterm_drains_on_prism_and_a_second_one_cancels() -> None:
    """The first SIGTERM ends every read (the graph drains); the second cancels, and the block ends quietly."""
    import os
    import signal

    from pipelines.streaming.drive import stopping_on_sigterm
    from pipelines.streaming.job import DRAIN

    DRAIN.clear()
    previous, reached = signal.getsignal(signal.SIGTERM), list[object]()
    try:
        with stopping_on_sigterm(drain=True):
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append(DRAIN.is_set())
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises at the next bytecode: never reached
            reached.append("after the second")
    finally:
        DRAIN.clear()
    assert reached == [True]
    assert signal.getsignal(signal.SIGTERM) == previous  # the previous handler is back


def test_sigterm_on_flink_cancels_at_once() -> None:
    import os
    import signal

    from pipelines.streaming.drive import stopping_on_sigterm
    from pipelines.streaming.job import DRAIN

    previous = signal.getsignal(signal.SIGTERM)
    with stopping_on_sigterm(drain=False):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        pytest.fail("not cancelled")
    assert not DRAIN.is_set() and signal.getsignal(signal.SIGTERM) == previous
