"""Kafka: consume → Arrow throughput of the project's source vs kcat (librdkafka) to /dev/null.

One topic of generator events (JSON wire format) is read end to end by
- kcat -C ... -e > /dev/null (baseline; the Debian package, installed with
  apt-get when missing),
- the project's reader with each backend (kafka-python, confluent): fetch the
  partition ranges and decode every batch into EVENT tables + dead letters,
  exactly what ReadEventsFromKafka does inside Beam; once in this process (one
  worker), and once in READERS processes that take pieces of the partition
  ranges as they come free, as Beam's workers do (``--direct_num_workers``, or
  a Flink/Dataflow job's parallelism).
Each is run REPEAT times alternately; the best of each counts. Beside each rate
the CPU it cost per message is printed: the reader's processes (all their
threads, librdkafka's included) and the broker's JVM (from /proc), since the
broker shares this machine's cores with whoever reads. Produce throughput of
the delivery-confirming sinks (acks=all) is printed too.
ratio = best project configuration msg/s / kcat msg/s (target 0.5).

Scale matters: kcat's fixed start (connect, metadata) weighs on the QUICK topic
(0.3M messages) but not on the full one (2.1M messages), while the project's
reader is CPU-bound at any size (over half of its CPU is Arrow's JSON reader),
so READERS is at most the number of cores the readers get. Figures of past runs:
docs/benchmarks/results.md.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple

# This script's folder must not be on the path: it would shadow the kafka-python package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from bench.common import QUICK, WORK, generate, result, timed  # noqa: E402
from pipelines.features.sources import decode_batch  # noqa: E402
from pipelines.io.kafka.config import DEFAULT_BOOTSTRAP, KafkaConnection  # noqa: E402
from pipelines.io.kafka.consume import BACKENDS, open_fetcher, open_lookup, prefetched  # noqa: E402
from pipelines.io.kafka.memory import keep_large_buffers  # noqa: E402
from pipelines.io.kafka.produce import delete_topics, ensure_topic, file_messages, open_sink  # noqa: E402
from pipelines.io.kafka.ranges import PartitionRange, Position, resolve_ranges, split_ranges  # noqa: E402

BOOTSTRAP = os.environ.get("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
PARTITIONS = 4
REPEAT = 2 if QUICK else 3
READERS = min(PARTITIONS, os.cpu_count() or 1)
BROKER_PID = Path(__file__).resolve().parent.parent / ".cache" / "kafka" / "kafka.pid"


def ensure_kcat() -> str:
    found = shutil.which("kcat") or shutil.which("kafkacat")
    if found:
        return found
    print("kcat missing: apt-get install kcat", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "kcat"], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    )
    return shutil.which("kcat") or "kcat"


def require_broker() -> None:
    host, _, port = BOOTSTRAP.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError:
        sys.exit(f"Kafka is not reachable at {BOOTSTRAP}: run make kafka-up")


def load(connection: KafkaConnection, topic: str, path: str, backend: str, limit: int | None = None) -> int:
    """Produce ``path`` (or its first ``limit`` messages) into ``topic``; returns messages acknowledged."""
    _, batches = file_messages(path, batch=5_000)
    sink, sent = open_sink(connection, topic, backend), 0
    try:
        for batch in batches:
            batch = batch[: None if limit is None else limit - sent]
            sink.send_many(batch)
            sent += len(batch)
            if limit is not None and sent >= limit:
                break
        return sink.flush()
    finally:
        sink.close()


def ranges_of(connection: KafkaConnection, topic: str) -> list[PartitionRange]:
    lookup = open_lookup(connection)
    try:
        return resolve_ranges(lookup, topic, Position("earliest"), Position("latest"))
    finally:
        lookup.close()


class Read(NamedTuple):
    """One reader's count of what it read, and the CPU seconds its process spent on it."""

    events: int
    dead: int
    cpu_s: float


def consume_to_arrow(connection: KafkaConnection, ranges: list[PartitionRange], backend: str) -> Read:
    keep_large_buffers()  # as ReadFromKafka(keep_buffers=True), which `replay` sets, does in each worker
    cpu = time.process_time()  # the whole process: prefetch and librdkafka threads included
    fetcher = open_fetcher(connection, backend, max_batch=20_000)
    events = dead = 0
    try:
        for part in ranges:
            for batch in prefetched(fetcher.fetch(part)):
                decoded = decode_batch(batch)
                events += decoded.events.num_rows
                dead += decoded.dead_letters.num_rows
    finally:
        fetcher.close()
    return Read(events, dead, time.process_time() - cpu)


def consume_parallel(
    pool: ProcessPoolExecutor, connection: KafkaConnection, ranges: list[PartitionRange], backend: str
) -> Read:
    """Every range read once, by READERS processes that each take the next piece (a quarter of a reader's
    share of the messages) when they come free, as Beam's workers take split ranges (``replay --max-split``):
    partitions differ in size (keyed by user), so a reader dealt whole partitions can finish well before
    another."""
    pieces = split_ranges(ranges, math.ceil(sum(r.size for r in ranges) / (4 * READERS)))
    reads = list(pool.map(consume_to_arrow, repeat(connection), [[piece] for piece in pieces], repeat(backend)))
    return Read(sum(r.events for r in reads), sum(r.dead for r in reads), sum(r.cpu_s for r in reads))


def broker_cpu_s() -> float:
    """CPU seconds the project's broker has used so far (0 when its pid is unknown, e.g. a remote cluster)."""
    try:
        fields = Path(f"/proc/{int(BROKER_PID.read_text())}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Measured(NamedTuple):
    wall_s: float
    cpu_s: float
    broker_s: float


def children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def cpu_of(fn: Callable[[], Read | None]) -> tuple[Read | None, Measured]:
    """What ``fn`` returned, and its wall, CPU and the broker's CPU seconds (kcat's CPU: its child process's)."""
    children, broker = children_cpu_s(), broker_cpu_s()
    value, wall = timed(fn)
    cpu = value.cpu_s if value is not None else children_cpu_s() - children
    return value, Measured(wall, cpu, broker_cpu_s() - broker)


def kcat_to_null(kcat: str, topic: str) -> None:
    with open(os.devnull, "wb") as null:
        subprocess.run(
            [kcat, "-C", "-b", BOOTSTRAP, "-t", topic, "-o", "beginning", "-e", "-q"], stdout=null, check=True
        )


def main() -> None:
    require_broker()
    kcat = ensure_kcat()
    users = 6_000 if QUICK else 40_000
    path = str(generate(users, 14, WORK / f"kafka-{users}u" / "events.jsonl"))
    connection = KafkaConnection(bootstrap_servers=(BOOTSTRAP,))
    total, _ = file_messages(path)

    topic = f"bench-consume-{users}u"
    ensure_topic(connection, topic, PARTITIONS)
    ranges = ranges_of(connection, topic)
    if sum(r.size for r in ranges) != total:  # first run (or a stale topic): load it once
        if sum(r.size for r in ranges):
            sys.exit(f"topic {topic} holds {sum(r.size for r in ranges)} messages, expected 0 or {total}; delete it")
        print(f"loading {total} messages into {topic} ...", flush=True)
        load(connection, topic, path, "confluent")
        ranges = ranges_of(connection, topic)
    n = sum(r.size for r in ranges)

    crc = crc_cost(connection, ranges)
    print(crc, flush=True)
    runs = measure_consume(connection, kcat, topic, ranges)
    rates = {name: n / run.wall_s for name, run in runs.items()}
    produce_n = min(total, 20_000 if QUICK else 100_000)
    produce_rates = {}
    for backend in BACKENDS:
        scratch = f"bench-produce-{uuid.uuid4().hex[:8]}"
        ensure_topic(connection, scratch, PARTITIONS)
        started = time.perf_counter()
        acked = load(connection, scratch, path, backend, limit=produce_n)
        produce_rates[backend] = acked / (time.perf_counter() - started)
        delete_topics(connection, [scratch])

    print(f"messages: {n} in {PARTITIONS} partitions ({users} users); CPU in us per message")
    for name, run in runs.items():
        what = "to /dev/null" if name == "kcat" else "to Arrow (fetch + decode)"
        print(
            f"consume {name:>15} {what:<25}: {rates[name] / 1e3:8.1f} k msg/s   "
            f"CPU reader {run.cpu_s / n * 1e6:5.2f}  broker {run.broker_s / n * 1e6:5.2f}"
        )
    for name, rate in produce_rates.items():
        print(f"produce {name:>15} (acks=all, confirmed): {rate / 1e3:8.1f} k msg/s")
    project = max((name for name in runs if name != "kcat"), key=lambda name: rates[name])
    result(
        "kafka",
        rates[project] / rates["kcat"],
        0.5,
        f"consume->Arrow {project} {rates[project] / 1e3:.0f}k msg/s "
        f"(one kafka-python reader {rates['kafka-python'] / 1e3:.0f}k) vs kcat {rates['kcat'] / 1e3:.0f}k msg/s; "
        f"produce kafka-python {produce_rates['kafka-python'] / 1e3:.1f}k, "
        f"confluent {produce_rates['confluent'] / 1e3:.0f}k msg/s; {n} messages",
    )
    print(crc)


def crc_cost(connection: KafkaConnection, ranges: list[PartitionRange]) -> str:
    """The CRC-32C check's share of parse_records, on real fetch responses (held in memory, so the
    network is out of it): best of REPEAT parses of every response with and without the check."""
    from crc32c import crc32c

    from pipelines.io.kafka.consume import KafkaPythonFetcher
    from pipelines.io.kafka.records import parse_records

    fetcher = KafkaPythonFetcher(connection)
    responses: list[tuple[bytes, int, int]] = []
    try:
        for part in ranges:
            position = part.start
            while position < part.stop:
                buffer = fetcher.fetch_once(part, position)
                responses.append((buffer, position, part.stop))
                position = max(position + 1, parse_records(buffer, position, part.stop).next_offset)
    finally:
        fetcher.close()
    n = sum(len(parse_records(b, lo, hi).offsets) for b, lo, hi in responses)
    size = sum(len(b) for b, _, _ in responses)

    def crc_only() -> list[int]:  # the check alone: crc32c over every response's bytes, as parse_records calls it
        return [crc32c(memoryview(b)) for b, _, _ in responses]

    def parse(check: bool) -> list[Any]:
        return [parse_records(b, lo, hi, check_crc=check) for b, lo, hi in responses]

    runs: dict[str, Callable[[], list[Any]]] = {
        "off": partial(parse, False),
        "on": partial(parse, True),
        "crc": crc_only,
    }
    best: dict[str, float] = {}
    for mode in list(runs) * (REPEAT + 2):
        _, took = timed(runs[mode])
        best[mode] = min(best.get(mode, took), took)
    return (
        f"CRC-32C check: {best['crc'] / n * 1e9:.1f} ns per message ({size / best['crc'] / 1e9:.1f} GB/s), "
        f"{best['crc'] / best['off']:.1%} of parse_records without it ({best['off'] / n * 1e6:.2f} us per message); "
        f"parse_records with/without the check: ratio {best['on'] / best['off']:.3f} (end to end, noisy); "
        f"{n} messages, {size / 1e6:.0f} MB in {len(responses)} responses"
    )


def measure_consume(
    connection: KafkaConnection, kcat: str, topic: str, ranges: list[PartitionRange]
) -> dict[str, Measured]:
    """kcat and each reader configuration, REPEAT times alternately: the fastest run of each."""
    n = sum(r.size for r in ranges)
    readers: dict[str, Callable[[], Read | None]] = {"kcat": lambda: kcat_to_null(kcat, topic)}
    with ProcessPoolExecutor(READERS) as pool:
        list(pool.map(time.sleep, [0.0] * READERS))  # the workers exist before the first timed run
        for backend in BACKENDS:
            readers[backend] = partial(consume_to_arrow, connection, ranges, backend)
            readers[f"{backend} x{READERS}"] = partial(consume_parallel, pool, connection, ranges, backend)
        best: dict[str, Measured] = {}
        for rep in range(REPEAT):
            line = []
            for name, read in readers.items():
                got, run = cpu_of(read)
                assert got is None or got.events + got.dead == n, f"{name} read {got} of {n} messages"
                if name not in best or run.wall_s < best[name].wall_s:
                    best[name] = run
                line.append(f"{name} {n / run.wall_s / 1e3:.0f}k")
            print(f"run {rep + 1}/{REPEAT} (msg/s): " + "  ".join(line), flush=True)
    return best


if __name__ == "__main__":
    main()
