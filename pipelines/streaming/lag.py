"""Consumer lag of a group, measured from outside the job: what the broker holds past the group's commits.

:class:`LagMonitor` (a daemon thread) asks the broker every ``interval_s`` for each
partition's end offset and the group's committed offset (no group membership: it
never joins or rebalances the group), and sets ``gem_consumer_lag_messages`` to their
difference and ``gem_consumer_lag_seconds`` to the age of the first uncommitted record
(its Kafka timestamp; 0 when nothing is behind). The streaming job commits only what is
durable, so this lag is what a crash would make it read again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.metrics import JobMetrics, Rates

__all__ = ["LagMonitor", "stream_status", "watch_stream"]

log = logging.getLogger(__name__)


class LagMonitor(threading.Thread):
    """The lag of ``group`` on every partition of ``topics`` (the events', and the candidate sets')."""

    def __init__(
        self,
        connection: KafkaConnection,
        topics: Sequence[str],
        group: str,
        metrics: JobMetrics,
        interval_s: float = 2.0,
    ) -> None:
        super().__init__(daemon=True, name="lag-monitor")
        self._connection, self._topics, self._group = connection, tuple(topics), group
        self._metrics, self._interval = metrics, interval_s
        self.stopped = threading.Event()
        #: (topic, partition) -> (messages behind, seconds behind), after each measurement
        self.last: dict[tuple[str, int], tuple[int, float]] = {}

    def run(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        group = KafkaConsumer(**self._connection.kafka_python(), group_id=self._group, enable_auto_commit=False)
        peek = KafkaConsumer(**self._connection.kafka_python(), group_id=None, enable_auto_commit=False)
        try:
            while not self.stopped.is_set():
                try:
                    self.measure(group, peek)
                except KafkaError as exc:  # the broker away: measure again later
                    log.debug("lag: %r", exc)
                self.stopped.wait(self._interval)
        finally:
            group.close()
            peek.close()

    def measure(self, group: Any, peek: Any) -> None:
        from kafka import TopicPartition

        tps = [TopicPartition(t, p) for t in self._topics for p in sorted(group.partitions_for_topic(t) or ())]
        if not tps:
            return
        ends = group.end_offsets(tps)
        starts = group.beginning_offsets(tps)
        now = time.time()
        for tp in tps:
            found = group.committed(tp)
            committed = int(starts[tp]) if found is None else int(found)
            behind = max(0, int(ends[tp]) - committed)
            age = _record_age(peek, tp, committed, now) if behind else 0.0
            self.last[(tp.topic, tp.partition)] = (behind, age)
            self._metrics.lag(tp.topic, tp.partition, behind, age)


def _record_age(peek: Any, tp: Any, offset: int, now: float) -> float:
    """Seconds since the record at ``offset`` of ``tp`` was written (0 if it cannot be read now)."""
    peek.assign([tp])
    peek.seek(tp, offset)
    records = peek.poll(timeout_ms=500, max_records=1).get(tp, [])
    return max(0.0, now - records[0].timestamp / 1000.0) if records else 0.0


def stream_status(
    metrics: JobMetrics, rates: Rates, lag: dict[Any, tuple[int, float]], seconds: float, *, pairs: bool = False
) -> str:
    """The streaming job's status line: rates over the last ``seconds``, lag, p99 freshness, state, RSS;
    with ``pairs``, the candidate sets' too."""
    behind = lag.values()
    sets = (
        f"{rates.rate(seconds, 'gem_records_total', kind='candidate_sets'):,.1f} sets/s, "
        f"{rates.rate(seconds, 'gem_pairs_total', outcome='computed'):,.0f} pairs/s, "
        f"p99 set->pair {metrics.p99('candidate_to_pair'):.2f} s, "
        f"late sets {metrics.value('gem_deadline_dropped_total'):,.0f}, "
        if pairs
        else ""
    )
    return (
        f"stream: {rates.rate(seconds, 'gem_records_total', kind='events'):,.0f} events/s, {sets}"
        f"lag {sum(m for m, _ in behind):,} msgs ({max((s for _, s in behind), default=0.0):.1f} s), "
        f"p99 event->history {metrics.p99('event_to_history'):.2f} s, "
        f"event->user rep {metrics.p99('event_to_user_rep'):.2f} s, "
        f"dead letters {metrics.value('gem_dead_letters_total'):,.0f}, "
        f"users {metrics.value('gem_state_users'):,.0f}, "
        f"RSS {metrics.value('process_resident_memory_bytes') / 2**20:,.0f} MiB"
    )


def watch_stream(
    connection: KafkaConnection,
    topics: Sequence[str],
    group: str,
    port: int | None,
    status_interval_s: float = 5.0,
    *,
    pairs: bool = False,
) -> Callable[[], None]:
    """Start what an operator watches of ``stream``: ``/metrics`` on ``port`` (None: not served), the
    lag monitor, and a status line every ``status_interval_s`` on a terminal. Returns ``stop()``.
    With ``pairs`` (candidate sets read), every pair outcome is served from the start."""
    from pipelines.streaming.metrics import StatusLine, shared_metrics

    metrics = shared_metrics("stream")
    if pairs:
        metrics.expect_pairs()
    if port is not None:
        metrics.serve(port)
    lag = LagMonitor(connection, topics, group, metrics)
    lag.start()
    rates = Rates(metrics)

    def render(seconds: float) -> str:
        return stream_status(metrics, rates, lag.last, seconds, pairs=pairs)

    status = StatusLine(render, status_interval_s)
    status.start()

    def stop() -> None:
        lag.stopped.set()
        status.stopped.set()

    return stop
