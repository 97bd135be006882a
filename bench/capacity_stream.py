"""The `stream` job's events/s per core for bench/capacity.py, measured through its CLI.

``python -m pipelines stream`` (a subprocess, on Prism with its defaults: LOOPBACK, the histories
only, no model) drains a topic whose events were all produced before it starts, and exits once the
group has committed the topic and been idle for ``--idle-exit``. Its CPU time is the sum over its
process tree (the driver with its in-process SDK workers, and Prism), sampled from /proc while it
runs. That includes the start (imports, Prism, the consumers) and the idle wait; two runs of
different sizes, each on a fresh topic, group and output, cancel those: events/s per core = (events
of the large run - events of the small one) / (its CPU - the small one's).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from typing import Any

from bench.common import WORK, generate, kafka_connection
from bench.flink_parts import HarnessCpu, tree_pids

USERS, DAYS = 4_000, 14
SMALL, LARGE = 20_000, 120_000  # events per run
PARTITIONS = 2


def _run(events: str, count: int) -> tuple[int, float, float]:
    """(events produced, the job's CPU seconds, its wall seconds) for the first ``count`` events."""
    import time

    from bench.kafka import load
    from pipelines.io.kafka.produce import delete_topics, ensure_topic

    connection = kafka_connection()
    topic = f"bench-capacity-stream-{uuid.uuid4().hex[:8]}"
    out = WORK / "capacity-stream" / topic
    ensure_topic(connection, topic, PARTITIONS)
    root: list[int] = []
    try:
        sent = load(connection, topic, events, "confluent", limit=count)
        cmd = [
            sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", topic,
            "--output", str(out), "--bootstrap-servers", connection.bootstrap, "--idle-exit", "3s",
        ]  # fmt: skip
        with HarnessCpu(pids=lambda: tree_pids(root[0]) if root else []) as cpu:
            start = time.perf_counter()
            job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            root.append(job.pid)
            _, err = job.communicate()
            wall = time.perf_counter() - start
        if job.returncode != 0:
            raise RuntimeError(f"stream exited {job.returncode}: {err[-500:]}")
    finally:
        delete_topics(connection, [topic])
        shutil.rmtree(out, ignore_errors=True)
    return sent, sum(cpu.seconds.values()), wall


def measure_stream() -> dict[str, Any]:
    """The capacity figure ``stream_events_per_core``."""
    events = str(generate(USERS, DAYS, WORK / f"kafka-{USERS}u" / "events.jsonl"))
    small, small_cpu, small_wall = _run(events, SMALL)
    large, large_cpu, large_wall = _run(events, LARGE)
    value = (large - small) / max(large_cpu - small_cpu, 1e-9)
    print(
        f"stream: {small:,} events in {small_cpu:.1f} CPU s ({small_wall:.1f} s wall), {large:,} in "
        f"{large_cpu:.1f} CPU s ({large_wall:.1f} s wall): {value:,.0f} events/s per core",
        flush=True,
    )
    return {
        "value": round(value, 3),
        "unit": "events/s per core",
        "how": (
            f"python -m pipelines stream (Prism, LOOPBACK, histories only) draining {large:,} vs {small:,} "
            f"events produced beforehand on {PARTITIONS} partitions; (events difference {large - small:,}) / "
            f"(CPU of the job's process tree, difference {large_cpu - small_cpu:.1f} s), which cancels start-up "
            f"and the idle exit; wall {large_wall:.1f} vs {small_wall:.1f} s"
        ),
    }
