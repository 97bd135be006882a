"""Soak: the streaming histories job under a steady events stream, watched through its own metrics.

Produces a generated world's events to a fresh topic at SOAK_RATE events/s
(``python -m pipelines produce --rate``) for SECONDS while ``python -m pipelines
stream --metrics-port`` (Prism, 4 shards, flush every second) consumes it, and scrapes
the job's ``/metrics`` every second: consumer lag (messages summed over partitions,
seconds: the oldest uncommitted record) and RSS; the events sent are the topic's end offsets
(the job's own records counter counts a redelivered read again). Then, once the job has drained and
exited, it replays the same topic with ``python -m pipelines replay`` (batch) and
compares every user's history: nothing lost or doubled means equal event ids per user.

Prints the rate, lag p50/p99/max, RSS at the end of the warm-up (first 20%) and at the
end, and the comparison. The rate is held when lag p99 <= 5 s and nothing is lost or doubled; RSS is flat when it
grows < 10% (a short run still adds users, so it grows there).
``RESULT soak ratio=<rate held>/20000 target=1`` (rate held = the rate the producer
achieved when held, else the rate the job drained at: events / seconds from the first
produce to lag 0).
QUICK: 5,000 events/s for 60 s; full: SOAK_RATE (default 20,000) for 600 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import QUICK, WORK, generate, kafka_connection, metric_samples, result  # noqa: E402
from bench.flink_parts import free_port  # noqa: E402

GOAL = 20_000
RATE = int(os.environ.get("SOAK_RATE", 5_000 if QUICK else GOAL))
SECONDS = int(os.environ.get("SOAK_SECONDS", 60 if QUICK else 600))
LAG_BOUND_S = 5.0
#: The producer's client: librdkafka when installed (kafka-python alone produced ~2,000 msg/s here).
BACKEND = os.environ.get("SOAK_BACKEND", "confluent")
PARTITIONS = 4


def scrape(port: int) -> dict[str, float]:
    out = {"lag": 0.0, "lag_s": 0.0, "rss": 0.0}
    for s in metric_samples(port):
        if s.name == "gem_consumer_lag_messages":
            out["lag"] += s.value
        elif s.name == "gem_consumer_lag_seconds":
            out["lag_s"] = max(out["lag_s"], s.value)
        elif s.name == "process_resident_memory_bytes":
            out["rss"] = s.value
    return out


def main() -> None:
    from kafka import KafkaConsumer

    from pipelines.io.kafka.produce import delete_topics, ensure_topic

    connection = kafka_connection()  # no broker: the fix, before the events are generated
    bootstrap = connection.bootstrap
    total = RATE * SECONDS
    users = max(1_000, total // (4 * 14))
    events = generate(users, 14, WORK / "soak" / f"events-{users}x14.parquet")
    topic = f"bench-soak-{uuid.uuid4().hex[:8]}"
    ensure_topic(connection, topic, PARTITIONS, configs={"retention.ms": "-1"})
    out, port = WORK / "soak" / topic, free_port()
    common = ["--bootstrap-servers", bootstrap]
    job = subprocess.Popen(
        [
            sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", topic, "--output", str(out),
            "--num-shards", "4", "--flush-interval", "1", "--idle-exit", "20", "--metrics-port", str(port), *common,
        ],
        stdout=subprocess.DEVNULL, stderr=open(WORK / "soak" / f"{topic}.log", "wb"), start_new_session=True,
    )  # fmt: skip
    samples: list[dict[str, float]] = []
    consumer = KafkaConsumer(**connection.kafka_python(), enable_auto_commit=False)
    try:
        wait_for_endpoint(port, job)
        started = time.time()
        producer = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "produce", "--input", str(events), "--topic", topic,
             "--rate", str(RATE), "--no-progress", "--kafka-backend", BACKEND, *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        while producer.poll() is None and time.time() - started < SECONDS:
            samples.append(scrape(port) | {"t": time.time() - started, "events": produced(consumer, topic)})
            time.sleep(1.0)
        producer.send_signal(signal.SIGINT)
        producer.wait(timeout=120)
        produced_s = time.time() - started
        drained = drain(port, samples, started, lambda: produced(consumer, topic))
        job.wait(timeout=300)
    finally:
        consumer.close()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    sent = int(samples[-1]["events"]) if samples else 0
    check = compare(connection, topic, out)
    during = [s for s in samples if s["t"] <= produced_s] or samples
    warm, end = during[max(0, len(during) // 5 - 1)]["rss"], during[-1]["rss"]
    rss = (end / max(warm, 1) - 1, f"RSS {warm / 2**20:,.0f} MiB after warm-up -> {end / 2**20:,.0f} MiB at the end")
    report("soak", samples, sent, produced_s, drained, check, rss, "histories only")
    delete_topics(connection, [topic])
    shutil.rmtree(out, ignore_errors=True)


def wait_for_endpoint(port: int, job: subprocess.Popen) -> None:
    deadline = time.time() + 180
    while time.time() < deadline:
        if job.poll() is not None:
            sys.exit("the streaming job exited before serving metrics (see out/bench/soak/*.log)")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit("the streaming job served no metrics within 180 s")


def drain(port: int, samples: list[dict[str, float]], started: float, sent: Callable[[], float]) -> float:
    """Scrape until the lag is 0 again with something sent; seconds from the start to then. ``sent``: the
    events sent so far (:func:`produced`)."""
    deadline = time.time() + 600
    while time.time() < deadline:
        sample = scrape(port) | {"t": time.time() - started, "events": sent()}
        samples.append(sample)
        if sample["lag"] == 0 and sample["events"] > 0:
            return sample["t"]
        time.sleep(1.0)
    return float("inf")


def produced(consumer: Any, topic: str, partitions: int = PARTITIONS) -> float:
    """Messages in ``topic`` so far (a fresh topic: its partitions' end offsets). The job's own
    ``gem_records_total`` would count a redelivered read again."""
    from kafka import TopicPartition

    return float(sum(consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)]).values()))


def compare(connection: object, topic: str, out: Path) -> tuple[int, int, int]:
    """(events lost, events doubled, users) of the streamed histories against a replay of the topic."""
    import pyarrow.compute as pc

    from pipelines.io.files import match_files
    from pipelines.io.parquet import read_table
    from pipelines.schemas.layouts import HISTORY
    from pipelines.streaming.state import latest_histories, newest_rows

    replayed = out.with_name(out.name + "-replay")
    subprocess.run(
        [sys.executable, "-m", "pipelines", "replay", "--topic", topic, "--from", "earliest", "--to", "latest",
         "--output", str(replayed), "--num-shards", "4"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    streamed = latest_histories(str(out))
    batch = newest_rows([read_table(p, HISTORY) for p in match_files(str(replayed / "histories/*/*.parquet"))])
    shutil.rmtree(replayed, ignore_errors=True)

    def ids(table: pa.Table) -> dict[int, list[str]]:
        events = pc.struct_field(table["events"].combine_chunks().flatten(), "event_id").to_pylist()
        lengths = pc.list_value_length(table["events"]).to_numpy()
        cuts = np.concatenate([[0], np.cumsum(lengths)])
        users = table["user_id"].to_pylist()
        return {u: sorted(map(str, events[cuts[i] : cuts[i + 1]])) for i, u in enumerate(users)}

    a, b = ids(streamed), ids(batch)
    lost = sum(len(set(b[u]) - set(a.get(u, []))) for u in b)
    doubled = sum(len(v) - len(set(v)) for v in a.values()) + sum(len(set(a[u]) - set(b.get(u, []))) for u in a)
    return lost, doubled, len(b)


def report(
    name: str,
    samples: list[dict[str, float]],
    sent: int,
    produced_s: float,
    drained: float,
    check: tuple[int, int, int],
    rss: tuple[float, str],
    what: str,
    asked: int = RATE,
) -> None:
    """Print the lag over time and the figures, then ``RESULT <name>``. ``samples``: lag (messages),
    lag_s (seconds) and t (seconds from the first produce); ``check``: (lost, doubled, users) from
    :func:`compare`; ``rss``: (growth from the warm-up to the end, its text); ``asked``: the rate
    the producer was asked for."""
    lost, doubled, users = check
    growth, rss_text = rss
    during = [s for s in samples if s["t"] <= produced_s] or samples
    step = max(1, len(during) // 12)
    print(
        "lag over time (s: messages/seconds behind): "
        + ", ".join(f"{s['t']:.0f}: {s['lag']:,.0f}/{s['lag_s']:.1f}" for s in during[::step]),
        flush=True,
    )
    lag_s = np.array([s["lag_s"] for s in during])
    lag = np.array([s["lag"] for s in during])
    p50, p99 = (float(np.percentile(lag_s, q)) for q in (50, 99))
    offered = sent / max(produced_s, 1e-9)  # what the producer achieved (at most RATE)
    held = p99 <= LAG_BOUND_S and not lost and not doubled
    rate_held = offered if held else sent / max(drained, 1e-9)
    print(
        f"soak: {sent:,} events in {produced_s:.0f} s ({offered:,.0f}/s offered, {asked:,}/s asked); lag seconds "
        f"p50 {p50:.1f} p99 {p99:.1f} max {lag_s.max():.1f}, lag messages p99 {np.percentile(lag, 99):,.0f}; "
        f"drained (lag 0) at {drained:.0f} s; {rss_text} ({growth:+.1%}, {'flat' if growth < 0.10 else 'grew'}); "
        f"replay comparison over {users:,} users: {lost} events lost, {doubled} doubled",
        flush=True,
    )
    result(
        name,
        rate_held / GOAL,
        1,
        f"{rate_held:,.0f} events/s {'held' if held else 'drained (not held)'} (lag p99 {p99:.1f} s, bound "
        f"{LAG_BOUND_S:g} s; RSS {growth:+.1%}; {lost} lost, {doubled} doubled), goal {GOAL:,}/s, {what}",
    )


if __name__ == "__main__":
    main()
