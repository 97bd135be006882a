"""Driving a streaming job that never ends by itself: watch it, and cancel it once its topic is done.

On Flink with checkpointing, Beam keeps the job's sources alive (so that checkpoints
go on) and a streaming job never reaches DONE; shutting them down
(``--shutdown_sources_after_idle_ms``) makes the portable operators wait for their
timers at the end of input, which hangs the job. So ``stream --idle-exit`` on Flink
ends the job from the driver: once the consumer group's committed offsets equal the
topic's end offsets and stay so for ``idle_exit_s``, every event read is flushed
(a commit never gets ahead of a flush) and the job is cancelled with nothing left in it.

SIGTERM stops a job cleanly (:func:`stopping_on_sigterm`): on Prism, whose workers run in the
driver's process, every read ends and the graph drains as at an idle exit (what was read is
written and committed); a second SIGTERM, or the first on Flink, cancels the job. Either way the
command ends as a finished one, and a restart resumes from the committed offsets.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipelines.io.kafka.config import KafkaConnection

__all__ = ["Stopped", "behind", "run_on_prism", "run_until_idle", "stopping_on_sigterm"]

log = logging.getLogger(__name__)

_TERMINAL = ("DONE", "FAILED", "CANCELLED", "STOPPED", "UPDATED", "DRAINED")


def behind(consumer: Any, topics: Sequence[str]) -> int:
    """Records of ``topics`` not yet committed by ``consumer``'s group (a partition without a commit
    counts from its first offset)."""
    from kafka import TopicPartition

    tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    if not tps:
        return 0
    ends, starts = consumer.end_offsets(tps), consumer.beginning_offsets(tps)
    total = 0
    for tp in tps:
        found = consumer.committed(tp)
        total += max(0, int(ends[tp]) - (int(starts[tp]) if found is None else int(found)))
    return total


def run_until_idle(
    result: Any,
    connection: KafkaConnection,
    topics: Sequence[str],
    group: str,
    idle_exit_s: float | None,
    cancel: Callable[[], None],
    poll_s: float = 1.0,
) -> str:
    """Wait for ``result`` (a running job); with ``idle_exit_s``, ``cancel()`` it once the group has
    committed every one of ``topics`` for that long. Returns the job's final state; a job that fails raises."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    consumer = KafkaConsumer(**connection.kafka_python(), group_id=group, enable_auto_commit=False)
    since: float | None = None
    progress = _Progress(", ".join(topics))
    try:
        while True:
            state = str(result.state)
            if state in _TERMINAL:
                if state != "DONE":
                    raise RuntimeError(f"the streaming job ended in state {state}; see the runner's log")
                return state
            if idle_exit_s is not None:
                try:
                    done = progress.saw(behind(consumer, topics)) == 0
                except KafkaError as exc:  # broker away: look again later
                    log.debug("idle check: %r", exc)
                    done = False
                since = (since or time.monotonic()) if done else None
                if since is not None and time.monotonic() - since >= idle_exit_s:
                    log.info("stream: %s committed for %.0f s: cancelling the job", ", ".join(topics), idle_exit_s)
                    cancel()
                    return "CANCELLED"
            time.sleep(poll_s)
    finally:
        consumer.close()


class _Progress:
    """Logs how far the group's commits are behind the topic's end, when it changed, at most every
    ``every_s``: an operator (or a failed test's log) sees whether a job is moving."""

    def __init__(self, topic: str, every_s: float = 30.0) -> None:
        self._topic, self._every_s = topic, every_s
        self._said: int | None = None
        self._at = time.monotonic()

    def saw(self, records: int) -> int:
        now = time.monotonic()
        if records != self._said and now - self._at >= self._every_s:
            log.info("stream: %d records of %s not yet committed", records, self._topic)
            self._said, self._at = records, now
        return records


class Stopped(BaseException):
    """SIGTERM cancelled the job (a BaseException, like KeyboardInterrupt: Beam's code does not catch it)."""


def _cancel(_signum: int, _frame: Any) -> None:
    raise Stopped


def _drain(signum: int, frame: Any) -> None:
    from pipelines.streaming.job import DRAIN

    if DRAIN.is_set():
        _cancel(signum, frame)
    DRAIN.set()
    log.info("SIGTERM: draining (what was read is written and committed); a second SIGTERM cancels")


@contextlib.contextmanager
def stopping_on_sigterm(drain: bool) -> Iterator[None]:
    """Within: SIGTERM drains the graph (``drain``: Prism, whose readers run in this process) or cancels
    it; a cancelled job ends the block quietly, as a finished one. On leaving, the previous handler is
    back and the drain is over (a next job in this process reads again)."""
    from pipelines.streaming.job import DRAIN

    previous = signal.signal(signal.SIGTERM, _drain if drain else _cancel)
    try:
        yield
    except Stopped:
        log.info("stopped (SIGTERM); a restart resumes from the committed offsets")
    finally:
        signal.signal(signal.SIGTERM, previous)
        DRAIN.clear()


def run_on_prism(p: Any) -> None:
    """Run ``p`` to its end; a :class:`Stopped` cancels it."""
    result = p.run()
    try:
        result.wait_until_finish()
    except Stopped:
        with contextlib.suppress(Exception):
            result.cancel()
        raise
