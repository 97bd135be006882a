"""Soak on Flink: the streaming histories job at ``--parallelism 2`` under a steady events stream.

The same soak as ``bench/soak.py`` (a generated world's events produced to a fresh 4-partition
topic at SOAK_FLINK_RATE events/s for SECONDS, then a ``replay`` of the topic compared user by
user: nothing lost or doubled), with ``python -m pipelines stream`` submitted to a Flink cluster
of the bench's own (``bench/flink_parts.py`` ``own_flink``: two TaskManagers of one slot, an SDK
worker pool, a standing job server, RocksDB, checkpoints every CHECKPOINT_MS).

The lag comes from where it comes on Prism: the submitting process's ``/metrics``
(``--metrics-port``), whose lag monitor (:mod:`pipelines.streaming.lag`) reads the group's
committed offsets (committed only after the flush and the checkpoint) and the age of the first
uncommitted record from Kafka. The job's other metrics live in the workers, so the bench reads
two things itself, every SAMPLE_S: the events sent (the topic's end offsets) and the RSS of every
process of the cluster (JobManager, TaskManagers, job server, worker pool and its SDK workers)
from /proc; flat means each grows < 10% from the end of the warm-up (the first 20% of the run)
to the end. ``--idle-exit`` ends the job once the topic is committed, as on Prism.

``RESULT soak-flink ratio=<rate held>/20000 target=1`` as ``bench/soak.py`` reports it (rate
held: what the producer achieved when the lag p99 <= 5 s and nothing was lost or doubled, else
the rate the job drained at). ``SKIP soak-flink <why>`` without a Flink home or job server jar.
QUICK: 1,000 events/s for 60 s; full: SOAK_FLINK_RATE (default 2,000) for SOAK_SECONDS (600).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

# bench/kafka.py would shadow the kafka-python package: this folder must not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from bench.common import QUICK, WORK, generate, kafka_connection  # noqa: E402
from bench.flink_parts import OwnFlink, free_port, own_flink, own_flink_missing  # noqa: E402
from bench.soak import BACKEND, compare, drain, produced, report, scrape, wait_for_endpoint  # noqa: E402

if TYPE_CHECKING:
    from kafka import KafkaConsumer

NAME = "soak-flink"
RATE = int(os.environ.get("SOAK_FLINK_RATE", 1_000 if QUICK else 2_000))
SECONDS = int(os.environ.get("SOAK_SECONDS", 60 if QUICK else 600))
PARTITIONS = 4
CHECKPOINT_MS = 2000
SAMPLE_S = 1.0


def rss_bytes(pid: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_growth(warm: dict[str, float], end: dict[str, float], names: dict[str, str]) -> tuple[float, str]:
    """The largest growth of a process alive at both readings, and each process' readings as text."""
    both = sorted(set(warm) & set(end), key=lambda p: names.get(p, p))
    growth = {p: end[p] / max(warm[p], 1.0) - 1 for p in both}
    text = "RSS after warm-up -> end: " + ", ".join(
        f"{names.get(p, '?')} {p} {warm[p] / 2**20:,.0f} -> {end[p] / 2**20:,.0f} MiB ({growth[p]:+.0%})" for p in both
    )
    return max(growth.values(), default=0.0), text


def main() -> None:
    from kafka import KafkaConsumer

    from pipelines.io.kafka.produce import delete_topics, ensure_topic

    missing = own_flink_missing()
    if missing:
        print(f"SKIP {NAME} {missing}")
        return
    connection = kafka_connection()  # no broker: the fix, before the events are generated
    total = RATE * SECONDS
    users = max(1_000, total // (4 * 14))
    events = generate(users, 14, WORK / "soak" / f"events-{users}x14.parquet")
    work = WORK / NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    topic = f"bench-soak-flink-{uuid.uuid4().hex[:8]}"
    ensure_topic(connection, topic, PARTITIONS, configs={"retention.ms": "-1"})
    out, log = work / topic, work / f"{topic}.log"
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    consumer = KafkaConsumer(**connection.kafka_python(), enable_auto_commit=False)
    try:
        with own_flink(work / "flink", slots=1) as cluster:
            samples, rss, produced_s, drained = soak(cluster, connection.bootstrap, consumer, topic, events, out, log)
    finally:
        consumer.close()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    check = compare(connection, topic, out)
    what = f"histories only, Flink p=2, checkpoints every {CHECKPOINT_MS} ms; load average at the end {load}"
    report(NAME, samples, int(samples[-1]["events"]), produced_s, drained, check, rss, what, asked=RATE)
    delete_topics(connection, [topic])
    shutil.rmtree(out, ignore_errors=True)


def soak(
    cluster: OwnFlink, bootstrap: str, consumer: KafkaConsumer, topic: str, events: Path, out: Path, log: Path
) -> tuple[list[dict[str, float]], tuple[float, str], float, float]:
    """Run the job, produce for SECONDS, wait for the lag to reach 0; (samples, RSS growth and
    text, seconds produced, seconds to drain)."""
    port = free_port()
    cmd = [
        *(sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", topic, "--output", str(out)),
        *("--num-shards", "4", "--flush-interval", "1", "--idle-exit", "20", "--metrics-port", str(port)),
        *("--bootstrap-servers", bootstrap, *cluster.runner_flags(checkpoint_ms=CHECKPOINT_MS)),
    ]
    with log.open("wb") as sink:
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    try:
        wait_for_endpoint(port, job)
        wait_running(cluster, job, log)
        started = time.time()
        producer = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "produce", "--input", str(events), "--topic", topic,
             "--rate", str(RATE), "--no-progress", "--kafka-backend", BACKEND, "--bootstrap-servers", bootstrap],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        samples, readings = [], []
        while producer.poll() is None and time.time() - started < SECONDS:
            samples.append(scrape(port) | {"t": time.time() - started, "events": produced(consumer, topic, PARTITIONS)})
            readings.append({p: r for p in cluster.processes() if (r := rss_bytes(p)) is not None})
            time.sleep(SAMPLE_S)
        producer.send_signal(signal.SIGINT)
        producer.wait(timeout=120)
        produced_s = time.time() - started
        drained = drain(port, samples, started, lambda: produced(consumer, topic, PARTITIONS))
        rss = rss_growth(readings[max(0, len(readings) // 5 - 1)], readings[-1], cluster.processes())
        job.wait(timeout=300)
    finally:
        if jid := cluster.running_job():
            cluster.cancel(jid)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    return samples, rss, produced_s, drained


def wait_running(cluster: OwnFlink, job: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while not cluster.running_job():
        if job.poll() is not None:
            sys.exit(f"error: the stream job exited ({job.returncode}) before it ran; see {log}")
        if time.monotonic() > deadline:
            sys.exit(f"error: the stream job was not RUNNING within 180 s; see {log}")
        time.sleep(0.5)


if __name__ == "__main__":
    main()
