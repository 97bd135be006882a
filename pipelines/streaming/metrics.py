"""Metrics of the long-running graph (``stream``, and ``solaris``, the same graph with candidate sets):
Prometheus exposition and a status line.

:class:`JobMetrics` holds one job's metrics in its own registry (so two jobs, or
tests, in one process never clash); :meth:`JobMetrics.serve` exposes them on
``--metrics-port`` (``/metrics``, Prometheus text format). Names, all labelled
``pipeline`` (``stream``; not ``job``, which Prometheus sets itself):

- ``gem_consumer_lag_messages{topic,partition}``, ``gem_consumer_lag_seconds{topic,partition}``:
  records not yet committed, and the age of the oldest of them;
- ``gem_records_total{kind}``: events, candidate sets read (``rate()`` gives per second);
- ``gem_dead_letters_total{reason}``;
- ``gem_step_seconds{step}`` histogram: flush, refresh, pairs (one batch of candidate sets);
- ``gem_freshness_seconds{leg}`` histogram: event_to_history, event_to_user_rep,
  candidate_to_pair (candidate set's stage time to its pairs written);
- ``gem_deadline_dropped_total``: candidate sets past their deadline, not computed;
  ``gem_pairs_total{outcome}``: every pair asked for, by what became of it: computed, fresh
  (compute saved), repeated, or not written in time because its set was ``late`` (past its
  deadline). The share of the first three is the exact share (deploy/prometheus/rules/gem.yml);
- ``gem_user_encodings_total{outcome}``: candidate sets' histories whose user-side encoding was
  reused (``hit``) or computed (``miss``); ``gem_encoding_tokens_saved_total``: history tokens
  not encoded again (:mod:`pipelines.model.encoding`);
- ``gem_state_users``: users held; ``process_resident_memory_bytes`` and the other
  ``process_*`` series: RSS, CPU, open files.

:class:`StatusLine` prints one line every few seconds on a terminal.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

__all__ = ["PAIR_OUTCOMES", "JobMetrics", "Rates", "StatusLine", "shared_metrics"]

#: What becomes of a pair asked for (``gem_pairs_total{outcome}``): in the store by its deadline (the
#: first three: the exact share's numerator) or not, because its set passed its deadline (``late``).
PAIR_OUTCOMES = ("computed", "fresh", "repeated", "late")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class JobMetrics:
    """One job's metrics (see the module docstring for the names)."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r, p = self.registry, ["pipeline"]
        self.lag_messages = Gauge(
            "gem_consumer_lag_messages", "records not yet committed", [*p, "topic", "partition"], registry=r
        )
        self.lag_seconds = Gauge(
            "gem_consumer_lag_seconds",
            "age of the oldest record not yet committed",
            [*p, "topic", "partition"],
            registry=r,
        )
        self.records = Counter("gem_records", "records read", [*p, "kind"], registry=r)
        self.dead_letters = Counter(
            "gem_dead_letters", "records that went to the dead letters", [*p, "reason"], registry=r
        )
        self.step_seconds = Histogram(
            "gem_step_seconds", "duration of one step", [*p, "step"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.freshness = Histogram(
            "gem_freshness_seconds",
            "from a record to its effect being visible",
            [*p, "leg"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.deadline_dropped = Counter(
            "gem_deadline_dropped", "candidate sets past their deadline, not computed", p, registry=r
        )
        self.pairs = Counter("gem_pairs", "pairs asked for, by outcome", [*p, "outcome"], registry=r)
        self.user_encodings = Counter(
            "gem_user_encodings", "histories' user-side encodings, reused or computed", [*p, "outcome"], registry=r
        )
        self.encoding_tokens_saved = Counter(
            "gem_encoding_tokens_saved", "history tokens whose encoding was reused", p, registry=r
        )
        self.state_users = Gauge("gem_state_users", "users whose history the job holds", p, registry=r)
        self.deadline_dropped.labels(pipeline)  # a series from the start: rate() sees the first one
        self._recent: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose ``/metrics`` on ``addr:port`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)

    def expect_pairs(self) -> None:
        """Every pair outcome's series from the start, so that rate() (the exact share) sees the first pairs."""
        for outcome in PAIR_OUTCOMES:
            self.pairs.labels(self.pipeline, outcome)

    # -- recording -------------------------------------------------------------------------
    def read(self, kind: str, n: int = 1) -> None:
        self.records.labels(self.pipeline, kind).inc(n)

    def dead(self, reason: str, n: int = 1) -> None:
        self.dead_letters.labels(self.pipeline, reason).inc(n)

    def step(self, step: str, seconds: float) -> None:
        self.step_seconds.labels(self.pipeline, step).observe(seconds)

    def fresh(self, leg: str, seconds: np.ndarray | list[float]) -> None:
        """Observe freshness samples of ``leg`` (kept also for the status line's p99)."""
        histogram = self.freshness.labels(self.pipeline, leg)
        values = np.asarray(seconds, dtype=np.float64)
        for value in values.tolist():
            histogram.observe(value)
        with self._lock:
            self._recent.setdefault(leg, deque(maxlen=5_000)).extend(values.tolist())

    def lag(self, topic: str, partition: int, messages: int, seconds: float) -> None:
        self.lag_messages.labels(self.pipeline, topic, str(partition)).set(messages)
        self.lag_seconds.labels(self.pipeline, topic, str(partition)).set(seconds)

    # -- reading (status line, tests) ------------------------------------------------------
    def p99(self, leg: str) -> float:
        with self._lock:
            recent = list(self._recent.get(leg, ()))
        return float(np.percentile(recent, 99)) if recent else float("nan")

    def value(self, name: str, **labels: str) -> float:
        """The current value of a sample (``gem_records_total``, ...) summed over unnamed labels."""
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total


class StatusLine(threading.Thread):
    """Every ``interval_s``, one line of ``render()`` (given the seconds since the last line) on ``out``
    (default stderr) when it is a terminal."""

    def __init__(
        self, render: Callable[[float], str], interval_s: float = 5.0, out: TextIO | None = None, force: bool = False
    ) -> None:
        super().__init__(daemon=True, name="status-line")
        self._render, self._interval = render, interval_s
        self._out = out or sys.stderr
        self._enabled = force or self._out.isatty()
        self.stopped = threading.Event()

    def run(self) -> None:
        last = time.monotonic()
        while self._enabled and not self.stopped.wait(self._interval):
            now = time.monotonic()
            print(self._render(now - last), file=self._out, flush=True)
            last = now


class Rates:
    """Per-second rates of counters between two calls (for status lines)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self._metrics = metrics
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def rate(self, seconds: float, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        now = self._metrics.value(name, **labels)
        before = self._last.get(key, now)
        self._last[key] = now
        return (now - before) / max(seconds, 1e-9)


_SHARED: dict[str, JobMetrics] = {}
_SHARED_LOCK = threading.Lock()


def shared_metrics(pipeline: str) -> JobMetrics:
    """This process's metrics of ``pipeline``: the streaming job's DoFns record into them, and
    ``stream --metrics-port`` serves them (on Prism's LOOPBACK environment the SDK worker runs in
    the process that launched the job; on another runner each worker would serve its own)."""
    with _SHARED_LOCK:
        if pipeline not in _SHARED:
            _SHARED[pipeline] = JobMetrics(pipeline)
        return _SHARED[pipeline]
