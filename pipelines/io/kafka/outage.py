"""Riding out a broker outage in a long-running job: one shared view of "is Kafka reachable", bounded.

Every Kafka client of a streaming job in a worker process (the partition reader, the offset
commits, the redelivery check) reports each request's outcome to the process's
:class:`BrokerWatch` for that cluster (:func:`broker_watch`). The watch turns them into one log
line per state change, a WARNING when the broker goes away and an INFO line when it is back
(with how long it was gone), instead of a line (or a traceback) per failed request. A job
retries for as long as the outage lasts, up to ``limit_s`` (``--broker-timeout``, default the
same 120 s of no progress that ``replay``'s reader allows: :data:`DEFAULT_LIMIT_S`); a broker
away longer than that raises :class:`BrokerUnavailableError`, naming the fix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pipelines.errors import PipelinesError
from pipelines.io.kafka.config import KafkaConnection

__all__ = ["DEFAULT_LIMIT_S", "BrokerUnavailableError", "BrokerWatch", "LazyClient", "broker_watch"]

log = logging.getLogger(__name__)

#: How long a Kafka read may make no progress (the broker away) before it fails: replay's reader
#: (:data:`pipelines.io.kafka.consume.DEFAULT_STALL_S`) and a streaming job's watch alike.
DEFAULT_LIMIT_S = 120.0


class BrokerUnavailableError(PipelinesError):
    """The broker stayed unreachable for longer than the job's ``--broker-timeout``."""


class BrokerWatch:
    """Whether a cluster answers, from the outcomes its clients report (thread-safe).

    ``failed(exc)`` after a request that failed retriably (the broker away, a timeout), ``ok()``
    after one that was answered. Times come from ``clock`` (injectable for tests).
    """

    def __init__(self, name: str, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if limit_s <= 0:
            raise ValueError(f"limit_s must be > 0, got {limit_s}")
        self.name, self.limit_s, self._clock = name, limit_s, clock
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def down_for(self) -> float:
        """Seconds since the first failure of the current outage (0 while the broker answers)."""
        since = self._down_since
        return 0.0 if since is None else self._clock() - since

    def failed(self, exc: BaseException) -> None:
        """A request failed retriably. Logs the outage's start once; raises :class:`BrokerUnavailableError`
        once it has lasted ``limit_s``."""
        with self._lock:
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                log.warning(
                    "kafka: %s unreachable (%s: %s); retrying for up to %.0f s (--broker-timeout)",
                    self.name,
                    type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "no answer",
                    self.limit_s,
                )
            gone = now - self._down_since
        if gone > self.limit_s:
            raise BrokerUnavailableError(self.expired_message(gone)) from exc

    def expired(self) -> bool:
        """Whether the current outage has outlasted ``limit_s``."""
        return self.down_for() > self.limit_s

    def expired_message(self, gone: float | None = None) -> str:
        gone = self.down_for() if gone is None else gone
        return (
            f"Kafka at {self.name} unreachable for {gone:.0f} s (more than --broker-timeout {self.limit_s:.0f} s). "
            "Fix: bring the broker back, then start the job again (it resumes from its committed offsets); "
            "a longer --broker-timeout rides out longer outages"
        )

    def ok(self) -> None:
        """A request was answered: logs the end of an outage once."""
        if self._down_since is None:  # the common case: no lock
            return
        with self._lock:
            if self._down_since is None:
                return
            gone, self._down_since = self._clock() - self._down_since, None
        log.info("kafka: %s back after %.0f s", self.name, gone)


_WATCHES: dict[tuple[str, ...], BrokerWatch] = {}
_GUARD = threading.Lock()


def broker_watch(connection: KafkaConnection, limit_s: float = DEFAULT_LIMIT_S) -> BrokerWatch:
    """The process's watch of ``connection``'s cluster (one per bootstrap list; the latest caller's limit)."""
    if limit_s <= 0:
        raise ValueError(f"limit_s must be > 0, got {limit_s}")
    key = tuple(connection.bootstrap_servers)
    with _GUARD:
        watch = _WATCHES.get(key)
        if watch is None:
            watch = _WATCHES[key] = BrokerWatch(",".join(key), limit_s)
        watch.limit_s = limit_s
        return watch


C = TypeVar("C")


class LazyClient(Generic[C]):
    """A Kafka client made on first use, not in a DoFn's ``setup``: kafka-python's consumer connects
    when it is built, and a worker that (re)starts during an outage failed its setup, which failed the
    job (30 s into the outage). ``get()`` raises what building raises (a ``KafkaError`` while the
    broker is away), so the caller treats it as one more failed request."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._client: C | None = None

    def get(self) -> C:
        if self._client is None:
            self._client = self._make()
        return self._client

    def close(self) -> None:
        client: Any = self._client
        if client is not None:
            client.close()
            self._client = None
