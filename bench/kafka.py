"""Kafka: consume → Arrow throughput of the project's source vs kcat (librdkafka) to /dev/null.

One topic of generator events (JSON wire format) is read end to end by
- kcat -C ... -e > /dev/null (baseline; the Debian package, installed with
  apt-get when missing),
- the project's reader with each backend (kafka-python, confluent): fetch the
  partition ranges and decode every batch into EVENT tables + dead letters,
  exactly what ReadEventsFromKafka does inside Beam.
Each is run REPEAT times alternately; the best of each counts. Produce
throughput of the delivery-confirming sinks (acks=all) is printed too.
ratio = best project backend msg/s / kcat msg/s (target 0.5).

Scale matters: kcat's fixed start (connect, metadata) weighs on the QUICK topic
(0.3M messages, kcat ~0.4M msg/s here) but not on the full one (2.1M messages,
kcat ~1.3M msg/s), while the project's reader is CPU-bound (JSON → Arrow ~2 µs
per message plus ~2 µs of fetching on a shared 2-core machine) at any size.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

# This script's folder must not be on the path: it would shadow the kafka-python package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from bench.common import QUICK, WORK, generate, result, timed  # noqa: E402
from pipelines.kafka.config import DEFAULT_BOOTSTRAP, KafkaConnection  # noqa: E402
from pipelines.kafka.consume import BACKENDS, decode_batch, open_fetcher, open_lookup, prefetched  # noqa: E402
from pipelines.kafka.produce import ensure_topic, file_messages, open_sink  # noqa: E402
from pipelines.kafka.ranges import PartitionRange, Position, resolve_ranges  # noqa: E402

BOOTSTRAP = os.environ.get("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
PARTITIONS = 4
REPEAT = 2 if QUICK else 3


def ensure_kcat() -> str:
    found = shutil.which("kcat") or shutil.which("kafkacat")
    if found:
        return found
    print("kcat missing: apt-get install kcat", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "kcat"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
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


def consume_to_arrow(connection: KafkaConnection, ranges: list[PartitionRange], backend: str) -> tuple[int, int]:
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
    return events, dead


def kcat_to_null(kcat: str, topic: str) -> None:
    with open(os.devnull, "wb") as null:
        subprocess.run([kcat, "-C", "-b", BOOTSTRAP, "-t", topic, "-o", "beginning", "-e", "-q"], stdout=null,
                       check=True)


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

    best: dict[str, float] = {}
    for rep in range(REPEAT):
        runs: dict[str, float] = {}
        _, runs["kcat"] = timed(lambda: kcat_to_null(kcat, topic))
        for backend in BACKENDS:
            (events, dead), runs[backend] = timed(lambda b=backend: consume_to_arrow(connection, ranges, b))
            assert events + dead == n, f"{backend} read {events + dead} of {n}"
        best = {k: min(best.get(k, float("inf")), v) for k, v in runs.items()}
        print(f"run {rep + 1}/{REPEAT}: " + "  ".join(f"{k} {n / v / 1e3:.0f}k msg/s" for k, v in runs.items()),
              flush=True)
    rates = {k: n / v for k, v in best.items()}

    produce_n = min(total, 20_000 if QUICK else 100_000)
    produce_rates = {}
    for backend in BACKENDS:
        scratch = f"bench-produce-{uuid.uuid4().hex[:8]}"
        ensure_topic(connection, scratch, PARTITIONS)
        started = time.perf_counter()
        acked = load(connection, scratch, path, backend, limit=produce_n)
        produce_rates[backend] = acked / (time.perf_counter() - started)
        _delete(connection, scratch)

    print(f"messages: {n} in {PARTITIONS} partitions ({users} users)")
    for name, rate in rates.items():
        what = "to /dev/null" if name == "kcat" else "to Arrow (fetch + decode)"
        print(f"consume {name:>12} {what}: {rate / 1e3:8.1f} k msg/s")
    for name, rate in produce_rates.items():
        print(f"produce {name:>12} (acks=all, confirmed): {rate / 1e3:8.1f} k msg/s")
    project = max(BACKENDS, key=lambda b: rates[b])
    result("kafka", rates[project] / rates["kcat"], 0.5,
           f"consume->Arrow {project} {rates[project] / 1e3:.0f}k msg/s "
           f"(kafka-python {rates['kafka-python'] / 1e3:.0f}k) vs kcat {rates['kcat'] / 1e3:.0f}k msg/s; "
           f"produce kafka-python {produce_rates['kafka-python'] / 1e3:.1f}k, "
           f"confluent {produce_rates['confluent'] / 1e3:.0f}k msg/s; {n} messages")


def _delete(connection: KafkaConnection, topic: str) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(**connection.kafka_python())
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()


if __name__ == "__main__":
    main()
