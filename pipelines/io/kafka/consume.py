"""Read partition ranges from Kafka as batches of raw messages.

The pure reader under the Beam source: :func:`open_fetcher` gives a
:class:`Fetcher` (kafka-python by default, confluent-kafka/librdkafka when asked
and installed) whose ``fetch(range)`` yields :class:`MessageBatch` es in offset
order (a message's source is ``kafka:<topic>/<partition>/<offset>``;
:func:`pipelines.features.sources.decode_batch` turns a batch into events). The kafka-python
fetcher sends Fetch requests with kafka-python's network client and parses each
response whole (:mod:`pipelines.io.kafka.records`), so no message becomes a Python
object; the streaming :class:`PartitionPoller` sends the same requests, held by the broker until a
record arrives.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from pipelines.errors import ConfigError, PipelinesError
from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.kafka.outage import DEFAULT_LIMIT_S, BrokerWatch
from pipelines.io.kafka.ranges import PartitionRange
from pipelines.io.kafka.records import Records, RecordsError, parse_records
from pipelines.io.payloads import Payloads

__all__ = [
    "BACKENDS",
    "Fetcher",
    "KafkaReadError",
    "MessageBatch",
    "PartitionPoller",
    "kafka_source",
    "open_fetcher",
    "open_lookup",
    "prefetched",
]

log = logging.getLogger(__name__)

BACKENDS = ("kafka-python", "confluent")
#: How long a fetch waits without progress (broker down, range past the log end) before failing.
DEFAULT_STALL_S = DEFAULT_LIMIT_S
#: Pause before retrying a fetch that failed with a retriable error.
_RETRY_S = 0.2
#: How long the broker may hold a Fetch for data to arrive (no long poll: ranges end at known offsets).
_FETCH_WAIT_MS = 10
#: How long a streaming poll waits for the broker's answer (the broker holds a poll well under a
#: second): one that stops answering (a paused or partitioned broker) is an outage after this long.
POLL_TIMEOUT_S = 10.0
#: The end of an unbounded partition range (a streaming read).
_UNBOUNDED = 2**62


class KafkaReadError(PipelinesError):
    """A range could not be read completely (the broker stayed away, or the log lost the offsets)."""


def kafka_source(topic: str, partition: int, offset: int) -> str:
    """The dead-letter ``source`` of one message."""
    return f"kafka:{topic}/{partition}/{offset}"


@dataclass(frozen=True)
class MessageBatch:
    """Messages of one partition in offset order: ``offsets`` is ``(n,)`` int64."""

    topic: str
    partition: int
    offsets: np.ndarray
    payloads: Payloads

    def __len__(self) -> int:
        return len(self.offsets)

    def sources(self, indices: np.ndarray) -> list[str]:
        return [kafka_source(self.topic, self.partition, int(o)) for o in self.offsets[indices]]


T = TypeVar("T")


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetched(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``items`` produced by a background thread, up to ``depth`` ahead of the consumer.

    Fetching (network, librdkafka) overlaps with decoding (Arrow's reader runs
    without the GIL). An error in the producer is raised in the consumer; a
    consumer that stops early stops the producer before this generator closes.
    """
    handoff: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop, done = threading.Event(), object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(_Failed(exc))

    thread = threading.Thread(target=work, name="kafka-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is done:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


class Fetcher(Protocol):
    def fetch(self, part: PartitionRange) -> Iterator[MessageBatch]: ...

    def close(self) -> None: ...


def _batch(part: PartitionRange, offsets: list[int] | np.ndarray, values: list[bytes | None]) -> MessageBatch:
    if None in values:  # a null value (tombstone) is an empty payload: a dead letter downstream
        values = [v if v is not None else b"" for v in values]
    payloads = Payloads.from_list(values)  # type: ignore[arg-type]
    return MessageBatch(part.topic, part.partition, np.asarray(offsets, dtype=np.int64), payloads)


def _retriable(exc: BaseException) -> bool:
    """Whether trying again may succeed: kafka-python says so of its errors (broker away, leader moved),
    and a socket error is a connection lost."""
    return isinstance(exc, OSError) or bool(getattr(exc, "retriable", False))


def _read_error(part: PartitionRange, position: int, cause: object) -> KafkaReadError:
    return KafkaReadError(f"{part.topic}/{part.partition} at offset {position}: {cause}")


class _Stall:
    """Raises once ``limit_s`` pass without progress (injectable clock for tests)."""

    def __init__(self, part: PartitionRange, limit_s: float, clock: Callable[[], float]) -> None:
        self._part, self._limit, self._clock = part, limit_s, clock
        self._since = clock()

    def progressed(self) -> None:
        self._since = self._clock()

    def check(self, position: int) -> None:
        if self._clock() - self._since > self._limit:
            p = self._part
            raise KafkaReadError(
                f"{p.topic}/{p.partition}: no progress at offset {position} of "
                f"[{p.start}, {p.stop}) for {self._limit:.0f} s (broker reachable?)"
            )


class KafkaPythonFetcher:
    """kafka-python's network client fetches each range from its partition's leader; every response is
    parsed whole by :func:`pipelines.io.kafka.records.parse_records` (no Python object per message).

    Retriable errors (broker away, leader moved) are retried until ``stall_s``
    pass without progress; an offset no longer in the log is a :class:`KafkaReadError`.
    """

    def __init__(
        self,
        connection: KafkaConnection,
        *,
        max_batch: int = 20_000,
        stall_s: float = DEFAULT_STALL_S,
        clock: Callable[[], float] = time.monotonic,
        partition_bytes: int = 4 << 20,
        timeout_s: float = 30.0,
    ) -> None:
        from kafka.net.compat import KafkaNetClient

        self._max_batch, self._stall_s, self._clock = max_batch, stall_s, clock
        # One attempt never outlasts the stall limit, so an unreachable broker fails in about stall_s.
        self._partition_bytes, self._timeout_ms = partition_bytes, int(min(timeout_s, stall_s) * 1000)
        # A batch bigger than partition_bytes still comes whole (up to the broker's message.max.bytes).
        self._client = KafkaNetClient(
            **connection.kafka_python(), receive_message_max_bytes=partition_bytes + (64 << 20)
        )
        self._topics: set[str] = set()

    def fetch(self, part: PartitionRange) -> Iterator[MessageBatch]:
        from kafka.errors import KafkaError

        if part.size == 0:
            return
        position, stall = part.start, _Stall(part, self._stall_s, self._clock)
        while position < part.stop:
            try:
                records = parse_records(self.fetch_once(part, position), position, part.stop)
            except (KafkaError, OSError, RecordsError) as exc:
                if not _retriable(exc):
                    raise _read_error(part, position, exc) from exc
                log.warning("%s/%s at offset %s: %s (retrying)", part.topic, part.partition, position, exc)
                stall.check(position)
                time.sleep(_RETRY_S)
                continue
            for lo in range(0, len(records.offsets), self._max_batch):
                hi = min(lo + self._max_batch, len(records.offsets))
                yield MessageBatch(part.topic, part.partition, records.offsets[lo:hi], records.payloads.slice(lo, hi))
            if records.next_offset > position:  # records, or only control batches passed over
                stall.progressed()
                position = records.next_offset
            else:
                stall.check(position)

    def fetch_once(self, part: PartitionRange, position: int, wait_ms: int = _FETCH_WAIT_MS) -> bytes:
        """The ``records`` bytes of one Fetch request for ``part`` at ``position`` (kafka-python errors raised);
        the broker holds the request up to ``wait_ms`` for a first record to arrive."""
        from kafka.errors import for_code
        from kafka.protocol.consumer.fetch import FetchRequest

        topic = FetchRequest.FetchTopic(
            topic=part.topic,
            partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=part.partition,
                    current_leader_epoch=-1,
                    fetch_offset=position,
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=self._partition_bytes,
                )
            ],
        )
        request = FetchRequest(
            max_wait_ms=wait_ms,
            min_bytes=1,
            max_bytes=self._partition_bytes,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[topic],
            forgotten_topics_data=[],
            rack_id="",
            min_version=4,
            max_version=12,
        )
        timeout_ms = self._timeout_ms + wait_ms
        response = self._client.send_and_receive(self._leader(part), request, timeout_ms=timeout_ms)
        [answer] = [p for t in response.responses for p in t.partitions]
        if answer.error_code:
            error = for_code(answer.error_code)
            if error.invalid_metadata:
                self._client.cluster.request_update()
            raise error()
        return answer.records or b""

    def _leader(self, part: PartitionRange) -> int:
        """The node that leads ``part`` (metadata fetched on first use and when it proves stale)."""
        from kafka import TopicPartition
        from kafka.errors import LeaderNotAvailableError

        cluster = self._client.cluster
        if part.topic not in self._topics:
            self._client.poll(timeout_ms=self._timeout_ms, future=cluster.add_topic(part.topic))
            self._topics.add(part.topic)
        leader = cluster.leader_for_partition(TopicPartition(part.topic, part.partition))
        if leader is None or leader < 0:
            self._client.poll(timeout_ms=self._timeout_ms, future=cluster.request_update())
            raise LeaderNotAvailableError(f"no leader known for {part.topic}/{part.partition}")
        return int(leader)

    def close(self) -> None:
        self._client.close()


class PartitionPoller:
    """Streaming reads: whatever one partition holds from a position now (no group).

    ``poll(topic, partition, position)`` returns (batch or None, next position); the
    position also moves over offsets that hold no record. Each poll is one Fetch request
    that the broker holds up to ``timeout_s`` for a first record, parsed whole by
    :func:`pipelines.io.kafka.records.parse_records` as :class:`KafkaPythonFetcher` does
    (kafka-python's consumer made a Python object of every record: a fifth of the
    streaming job's time); what a response holds past ``max_batch`` is kept for the next
    poll at that position.
    """

    def __init__(
        self,
        connection: KafkaConnection,
        *,
        max_batch: int = 5_000,
        partition_bytes: int = 1 << 20,
        watch: BrokerWatch | None = None,
        request_timeout_s: float = POLL_TIMEOUT_S,
    ) -> None:
        self._max_batch, self._watch = max_batch, watch
        self._fetcher = KafkaPythonFetcher(connection, partition_bytes=partition_bytes, timeout_s=request_timeout_s)
        self._kept: dict[tuple[str, int], tuple[int, Records]] = {}  # (topic, partition) -> (position, Records)

    def poll(
        self, topic: str, partition: int, position: int, timeout_s: float = 0.2
    ) -> tuple[MessageBatch | None, int]:
        """A retriable error (the broker away, a leader moving) reads as "nothing now": the caller polls again.
        With a ``watch``, each outcome goes to it (one log line per outage; :class:`BrokerUnavailableError`
        once the broker has been away for its limit); without, each failure is logged."""
        from kafka.errors import KafkaError, OffsetOutOfRangeError

        kept = self._kept.pop((topic, partition), None)
        try:
            records = (
                kept[1]
                if kept is not None and kept[0] == position
                else self._fetch(topic, partition, position, timeout_s)
            )
        except OffsetOutOfRangeError as exc:
            raise KafkaReadError(
                f"{topic}/{partition} has no offset {position} (deleted by retention before it was read, or the "
                "topic was recreated); fix: start from what the log holds, e.g. a new --group with --from earliest"
            ) from exc
        except (KafkaError, OSError) as exc:
            if not _retriable(exc):
                raise
            if self._watch is None:
                log.warning("%s/%s at offset %s: %s (polling again)", topic, partition, position, exc)
            else:
                self._watch.failed(exc)
            time.sleep(timeout_s)  # a refused connection fails at once: no busy loop while the broker is away
            return None, position
        if self._watch is not None:
            self._watch.ok()
        if not len(records.offsets):
            return None, max(position, records.next_offset)
        n = min(self._max_batch, len(records.offsets))
        batch = MessageBatch(topic, partition, records.offsets[:n], records.payloads.slice(0, n))
        if n == len(records.offsets):
            return batch, max(position, records.next_offset)
        after = int(records.offsets[n])
        rest = Records(records.offsets[n:], records.payloads.slice(n, len(records.offsets)), records.next_offset)
        self._kept[(topic, partition)] = (after, rest)
        return batch, after

    def _fetch(self, topic: str, partition: int, position: int, timeout_s: float) -> Records:
        part = PartitionRange(topic, partition, position, _UNBOUNDED)
        raw = self._fetcher.fetch_once(part, position, wait_ms=int(timeout_s * 1000))
        return parse_records(raw, position, _UNBOUNDED)

    def close(self) -> None:
        self._fetcher.close()


class ConfluentFetcher:
    """confluent-kafka (librdkafka) consumer: the optional backend, same batches (slower into Arrow than the
    kafka-python fetcher, which makes no Python object per message; its sink is the fast one)."""

    def __init__(
        self,
        connection: KafkaConnection,
        *,
        max_batch: int = 20_000,
        stall_s: float = DEFAULT_STALL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            from confluent_kafka import Consumer
        except ImportError as exc:
            raise ConfigError(
                "--kafka-backend",
                "confluent needs the confluent-kafka package",
                "pip install -e '.[kafka-fast]' or use --kafka-backend kafka-python",
            ) from exc
        conf: dict[str, Any] = {
            **connection.librdkafka(),
            "group.id": "gem-pipelines-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # An offset gone from the log is an error, never a jump to either end.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 8 << 20,
            "check.crcs": True,
            # Prefetch is bounded by bytes only: with the default queued.min.messages
            # (100k) librdkafka stopped fetching whenever the reader was 100k behind
            # ("Fetch backoff for 1000ms: Local: Queue full") and consume() sat idle
            # until the backoff ended.
            "queued.min.messages": 10_000_000,
            "queued.max.messages.kbytes": 64 << 10,
            "fetch.queue.backoff.ms": 5,
            # No long poll at the log end: it would hold up the fetch for the next range.
            "fetch.wait.max.ms": 10,
        }
        self._consumer = Consumer(conf)
        self._max_batch, self._stall_s, self._clock = max_batch, stall_s, clock

    def fetch(self, part: PartitionRange) -> Iterator[MessageBatch]:
        from confluent_kafka import KafkaError, TopicPartition

        if part.size == 0:
            return
        self._consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        position, stall = part.start, _Stall(part, self._stall_s, self._clock)
        while position < part.stop:
            wanted = min(self._max_batch, part.stop - position)  # consume() waits for all it asks for
            messages = self._consumer.consume(num_messages=wanted, timeout=0.5)
            if any(m.error() is not None for m in messages):
                for m in messages:
                    error = m.error()
                    if error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise _read_error(part, position, error.str())
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        log.warning("%s/%s: %s", part.topic, part.partition, error)
                messages = [m for m in messages if m.error() is None]
            if messages:
                offsets = _offsets_of(messages)
                keep = int(np.searchsorted(offsets, part.stop))
                if keep:
                    stall.progressed()
                    yield _batch(part, offsets[:keep], [m.value() for m in messages[:keep]])
                    position = max(position, int(offsets[keep - 1]) + 1)
            [tp] = self._consumer.position([TopicPartition(part.topic, part.partition)])
            position = max(position, tp.offset if tp.offset >= 0 else position)
            if not messages:
                stall.check(position)
        self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def _offsets_of(messages: list[Any]) -> np.ndarray:
    """Offsets of consecutive messages: a range when the first and last say so (no per-message call)."""
    first, last = int(messages[0].offset()), int(messages[-1].offset())
    if last - first + 1 == len(messages):
        return np.arange(first, last + 1, dtype=np.int64)
    return np.asarray([m.offset() for m in messages], dtype=np.int64)


def open_fetcher(connection: KafkaConnection, backend: str = "kafka-python", **kwargs: Any) -> Fetcher:
    """A fetcher for ``backend`` (``kafka-python`` or ``confluent``)."""
    if backend == "kafka-python":
        return KafkaPythonFetcher(connection, **kwargs)
    if backend == "confluent":
        return ConfluentFetcher(connection, **kwargs)
    raise ConfigError("--kafka-backend", f"got {backend!r}", f"pass one of {', '.join(BACKENDS)}")


class KafkaPythonLookup:
    """:class:`pipelines.io.kafka.ranges.OffsetLookup` over a kafka-python consumer (metadata only)."""

    def __init__(self, connection: KafkaConnection, timeout_s: float = 30.0) -> None:
        from kafka import KafkaConsumer

        self._timeout_ms = int(timeout_s * 1000)
        self._consumer = KafkaConsumer(
            **connection.kafka_python(),
            group_id=None,
            enable_auto_commit=False,
            request_timeout_ms=max(self._timeout_ms, 31_000),
        )

    def partitions(self, topic: str) -> Sequence[int]:
        return sorted(self._consumer.partitions_for_topic(topic) or ())

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, tuple[int, int]]:
        from kafka import TopicPartition

        tps = [TopicPartition(topic, p) for p in partitions]
        begin = self._consumer.beginning_offsets(tps, timeout_ms=self._timeout_ms)
        end = self._consumer.end_offsets(tps, timeout_ms=self._timeout_ms)
        return {tp.partition: (int(begin[tp]), int(end[tp])) for tp in tps}

    def offsets_at(self, topic: str, partitions: Sequence[int], time_ms: int) -> Mapping[int, int | None]:
        from kafka import TopicPartition

        found = self._consumer.offsets_for_times(
            {TopicPartition(topic, p): time_ms for p in partitions}, timeout_ms=self._timeout_ms
        )
        return {tp.partition: (None if hit is None else int(hit.offset)) for tp, hit in found.items()}

    def close(self) -> None:
        self._consumer.close()


class _AuthFailures(logging.Handler):
    """Remembers a SASL authentication failure that kafka-python logs (and retries) while it
    bootstraps; its bootstrap error then only says that it timed out."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "SaslAuthenticationFailed" in text or "Authentication failed" in text:
            self.seen = text


def _listening(connection: KafkaConnection, timeout_s: float = 3.0) -> bool:
    """Whether some bootstrap server accepts a TCP connection."""
    import socket

    for server in connection.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return True
        except OSError:
            continue
    return False


def open_lookup(connection: KafkaConnection) -> KafkaPythonLookup:
    """An offset lookup; fails with a hint when the cluster cannot be reached or refuses the credentials."""
    from kafka.errors import KafkaError

    watch, kafka_log = _AuthFailures(), logging.getLogger("kafka")
    kafka_log.addHandler(watch)
    try:
        return KafkaPythonLookup(connection)
    except KafkaError as exc:
        if watch.seen or "Authentication" in str(exc) or (connection.sasl_mechanism and _listening(connection)):
            # the broker's port answers but no SASL login completed: the broker closes a connection
            # whose credentials it refused, often before kafka-python reads the refusal itself
            raise ConfigError(
                "--sasl-username",
                f"Kafka at {connection.bootstrap} is reachable but refused the SASL {connection.sasl_mechanism} "
                f"login of {connection.sasl_username!r} (authentication failed)",
                "check --sasl-username, the password (GEM_KAFKA_SASL_PASSWORD or --sasl-password) and --sasl-mechanism",
            ) from exc
        raise ConfigError(
            "--bootstrap-servers",
            f"cannot reach Kafka at {connection.bootstrap} ({exc})",
            "start the project's broker with make kafka-up, or point at a running cluster",
        ) from exc
    finally:
        kafka_log.removeHandler(watch)
