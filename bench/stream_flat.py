"""Is the streaming state flat? ``stream``'s cost for the same events, with a state of U users
against one of 10U users, on Flink at parallelism 2 (a cluster of the bench's own, shaped like
``make flink-up``'s: two TaskManagers of one slot, an SDK worker pool, a standing job server,
RocksDB with incremental checkpoints every CHECKPOINT_MS).

For each state size N (U, then 10U) one ``stream`` job reads a fresh topic:

1. warm-up: N users' histories (WARM events each) are produced and the job runs until its group
   has committed them all (committed = flushed and checkpointed);
2. settling (SETTLE=1, the default): the ACTIVE users get EVENTS other events each, produced and
   committed as in the measured phase. RocksDB compacts the warm-up's files once new writes
   arrive, and the 10U warm-up wrote ten times the U one's: a one-off cost of loading the
   state, which lands here rather than in the measured phase. SETTLE=0 leaves it out;
3. measured: the same ACTIVE users (the first ones, in both states) get the same EVENTS events
   each, produced in SPREAD_S equal slices one second apart (a steady stream, so that the phase
   spans about SPREAD_S * 1000 / CHECKPOINT_MS checkpoints, not the two or three one burst
   takes; the environment's SPREAD_S overrides it); the job runs until its group has committed
   them too.

Over the measured phase it reads the CPU seconds (utime + stime from /proc) of the cluster's work
processes (the TaskManagers, the worker pool and its SDK workers) and the bytes of the
incremental checkpoints completed in it, per checkpoint (Flink REST ``/jobs/<jid>/checkpoints``:
``checkpointed_size``, the bytes a checkpoint added; ``state_size``, the full state, is printed
beside it). The phase's wall time includes the wait for the last commit, so an idle cluster's
own CPU counts too, equally in both states.

Prints ``RESULT stream-flat-cpu`` (CPU s per event, U / 10U), ``RESULT stream-flat-checkpoint``
(bytes per checkpoint in the measured phase, U / 10U) and ``RESULT stream-flat`` (the smaller
of the two), target 0.85 each; ``SKIP stream-flat <why>`` without a Flink home or job server jar.
QUICK: U = 200, spread over 10 s; full: U = 1,000, over 20 s.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# bench/kafka.py would shadow the kafka-python package: this folder must not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402

from bench.common import QUICK, WORK, kafka_connection, result  # noqa: E402
from bench.flink_parts import OwnFlink, cpu_seconds, cpu_used, own_flink, own_flink_missing  # noqa: E402

if TYPE_CHECKING:
    from pipelines.io.kafka.config import KafkaConnection

NAME = "stream-flat"
TARGET = 0.85
U = 200 if QUICK else 1_000
WARM = 5 if QUICK else 4  # events per user in the warm-up
ACTIVE = 100 if QUICK else 500  # users that get the measured events (the same in both states)
EVENTS = 5 if QUICK else 10  # measured events per active user
SPREAD_S = int(os.environ.get("SPREAD_S", 10 if QUICK else 20))  # seconds the measured events are spread over
SETTLE = os.environ.get("SETTLE", "1") not in ("", "0")  # a settling phase before the measured one
PARTITIONS = 2
CHECKPOINT_MS = 2000
DEADLINE_S = 600


def events(users: range, per_user: int, start_ms: int, seed: int) -> list[tuple[bytes, bytes]]:
    """``per_user`` events for each of ``users`` as (key, JSON value), user by user interleaved, event
    times 1 ms apart from ``start_ms``; the same ``seed`` gives the same items."""
    rng = np.random.default_rng(seed)
    items = rng.integers(0, 10**6, size=len(users) * per_user)
    out = []
    for i in range(len(users) * per_user):
        user = users[i % len(users)]
        value = (
            f'{{"event_id":"s{seed}-{i}","user_id":{user},"item_id":{int(items[i])},"is_ad":false,'
            f'"advertiser_id":null,"item_category":3,"surface":"instagram_reels","event_type":"impression",'
            f'"event_time":{start_ms + i},"value":1.0,"device":"ios"}}'
        )
        out.append((str(user).encode(), value.encode()))
    return out


@dataclass
class Cost:
    """The measured phase of one state size."""

    users: int
    events: int
    wall_s: float
    cpu_s: float
    checkpoints: list[dict[str, Any]]
    by_vertex: dict[str, float]  # bytes per checkpoint each operator chain added, from the details kept

    @property
    def cpu_per_event(self) -> float:
        return self.cpu_s / self.events

    @property
    def checkpointed(self) -> int:
        return sum(int(c["checkpointed_size"]) for c in self.checkpoints)

    @property
    def per_checkpoint(self) -> float:
        """Bytes an incremental checkpoint of the measured phase added, on average."""
        return self.checkpointed / max(len(self.checkpoints), 1)

    def line(self) -> str:
        full = max((int(c["state_size"]) for c in self.checkpoints), default=0)
        return (
            f"state of {self.users} users: {self.events} events in {self.wall_s:.1f} s, "
            f"{self.cpu_s:.1f} CPU s = {self.cpu_per_event * 1e3:.2f} CPU ms/event; {len(self.checkpoints)} "
            f"checkpoints added {self.checkpointed / 1e6:.2f} MB "
            f"({self.per_checkpoint / 1e3:.1f} kB each), full state {full / 1e6:.2f} MB; by operator chain: "
            + "; ".join(f"{b / 1e3:.1f} kB {name}" for name, b in sorted(self.by_vertex.items(), key=lambda v: -v[1]))
        )


def completed_checkpoints(cluster: OwnFlink, jid: str) -> dict[int, dict[str, Any]]:
    """The completed, non-savepoint checkpoints in the job's REST history, by id."""
    history = cluster.get(f"/jobs/{jid}/checkpoints").get("history", [])
    return {c["id"]: c for c in history if c["status"] == "COMPLETED" and not c.get("is_savepoint")}


def added_by_vertex(cluster: OwnFlink, jid: str, ids: list[int]) -> dict[str, float]:
    """The bytes each operator chain (its name, cut short) added per checkpoint, over those of ``ids``
    whose details the JobManager still keeps (``web.checkpoints.history``, the last 10)."""
    names = {v["id"]: v["name"][:60] for v in cluster.get(f"/jobs/{jid}").get("vertices", [])}
    totals: dict[str, float] = {}
    kept = 0
    for i in ids:
        try:
            tasks = cluster.get(f"/jobs/{jid}/checkpoints/details/{i}").get("tasks", {})
        except OSError:
            continue  # no longer kept
        kept += 1
        for vertex, stats in tasks.items():
            name = names.get(vertex, vertex)
            totals[name] = totals.get(name, 0.0) + float(stats.get("checkpointed_size", 0))
    return {name: b / kept for name, b in totals.items() if b} if kept else {}


def committed_total(connection: KafkaConnection, topic: str, group: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**connection.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        return sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in range(PARTITIONS))
    finally:
        consumer.close()


def produce(
    connection: KafkaConnection,
    topic: str,
    messages: list[tuple[bytes, bytes]],
    slices: int = 1,
    then: Callable[[], None] = lambda: None,
) -> None:
    """``messages`` in ``slices`` equal parts one second apart, each flushed (then ``then()``), through one producer."""
    from pipelines.io.kafka.produce import open_sink

    sink = open_sink(connection, topic, "confluent")
    began = time.perf_counter()
    try:
        for second in range(slices):
            time.sleep(max(0.0, began + second - time.perf_counter()))
            sink.send_many(messages[second * len(messages) // slices : (second + 1) * len(messages) // slices])
            sink.flush()
            then()
    finally:
        sink.close()


def wait(
    what: str, done: Callable[[], bool], job: subprocess.Popen[bytes], log: Path, tick: Callable[[], None]
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if job.poll() is not None:
            sys.exit(f"error: the stream job exited ({job.returncode}) before {what}; see {log}")
        if time.monotonic() > deadline:
            sys.exit(f"error: no {what} within {DEADLINE_S} s; see {log}")
        tick()
        time.sleep(0.5)


def measure(cluster: OwnFlink, connection: KafkaConnection, users: int, work: Path) -> Cost:
    """One job: warm-up with ``users`` users' histories, then the measured events."""
    from pipelines.io.kafka.produce import delete_topics, ensure_topic

    topic, group = f"bench-flat-{uuid.uuid4().hex[:8]}", f"bench-flat-{uuid.uuid4().hex[:8]}"
    ensure_topic(connection, topic, PARTITIONS)
    start_ms = int(time.time() * 1000) - 3_600_000
    warm = events(range(users), WARM, start_ms, seed=1)
    settle = events(range(ACTIVE), EVENTS, start_ms + len(warm), seed=3) if SETTLE else []
    measured = events(range(ACTIVE), EVENTS, start_ms + len(warm) + len(settle), seed=2)
    produce(connection, topic, warm)
    out, log = work / topic, work / f"{topic}.log"
    cmd = [
        *(sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", group),
        *("--output", str(out), "--bootstrap-servers", connection.bootstrap, "--flush-interval", "1"),
        *cluster.runner_flags(checkpoint_ms=CHECKPOINT_MS),
    ]
    with log.open("wb") as sink:
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    jid: list[str] = []
    seen: dict[int, dict[str, Any]] = {}

    def tick() -> None:
        if not jid and (found := cluster.running_job()):
            jid.append(found)
        if jid:
            seen.update(completed_checkpoints(cluster, jid[0]))

    def committed(what: str, total: int) -> None:
        wait(f"the {what} committed", lambda: committed_total(connection, topic, group) >= total, job, log, tick)

    try:
        committed("warm-up", len(warm))
        if settle:
            produce(connection, topic, settle, SPREAD_S, then=tick)
            committed("settling events", len(warm) + len(settle))
        tick()
        before_ids = set(seen)
        began, before = time.perf_counter(), cpu_seconds(cluster.work_pids())
        produce(connection, topic, measured, SPREAD_S, then=tick)
        committed("measured events", len(warm) + len(settle) + len(measured))
        after, wall = cpu_seconds(cluster.work_pids()), time.perf_counter() - began
        tick()
        by_vertex = added_by_vertex(cluster, jid[0], sorted(set(seen) - before_ids))
    finally:
        if jid:
            cluster.cancel(jid[0])
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        delete_topics(connection, [topic])
        shutil.rmtree(out, ignore_errors=True)
    checkpoints = [c for i, c in sorted(seen.items()) if i not in before_ids]
    return Cost(users, len(measured), wall, cpu_used(before, after), checkpoints, by_vertex)


def main() -> None:
    missing = own_flink_missing()
    if missing:
        print(f"SKIP {NAME} {missing}")
        return
    connection = kafka_connection()
    work = WORK / NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    with own_flink(work / "flink", slots=1) as cluster:
        small = measure(cluster, connection, U, work)
        print(small.line(), flush=True)
        large = measure(cluster, connection, 10 * U, work)
        print(large.line(), flush=True)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    cpu = small.cpu_per_event / large.cpu_per_event
    ckpt = small.per_checkpoint / max(large.per_checkpoint, 1.0)
    settled = "after a settling phase" if SETTLE else "no settling phase"
    common = f"{ACTIVE} active users x {EVENTS} events, {settled}, Flink p=2, RocksDB incremental; load average {load}"
    result(
        f"{NAME}-cpu",
        cpu,
        TARGET,
        f"{small.cpu_per_event * 1e3:.2f} CPU ms/event with {U} users vs {large.cpu_per_event * 1e3:.2f} "
        f"with {10 * U} ({common})",
    )
    result(
        f"{NAME}-checkpoint",
        ckpt,
        TARGET,
        f"{small.per_checkpoint / 1e3:.1f} kB per checkpoint with {U} users vs {large.per_checkpoint / 1e3:.1f} kB "
        f"with {10 * U}, measured phase, every {CHECKPOINT_MS} ms ({common})",
    )
    result(NAME, min(cpu, ckpt), TARGET, f"the smaller of CPU/event {cpu:.3f} and checkpoint bytes {ckpt:.3f}")


if __name__ == "__main__":
    main()
