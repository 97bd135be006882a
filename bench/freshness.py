"""Freshness of streaming histories: an event produced to Kafka → its user's history visible on disk.

Starts ``python -m pipelines stream`` (Beam on Prism, flush interval FLUSH_S),
produces events at a steady RATE (kafka-python sink, acks=all) and watches the
flush files: an event is visible when the first flush file holding it is
written (its mtime). p50/p99 of (visible - sent) over all events; the bound is
p99 <= 2 s, so ratio = 2 / p99 (target 1). The representation-in-store leg is
not wired (precompute does not consume streaming histories yet).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

# bench/kafka.py would shadow the kafka-python package: this folder must not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.common import QUICK, WORK, result  # noqa: E402

BOUND_S = 2.0
FLUSH_S = 0.25
RATE = 500 if QUICK else 2_000
SECONDS = 20 if QUICK else 60
USERS = 2_000


def _event(i: int, now_ms: int, rng: np.random.Generator) -> tuple[bytes, bytes]:
    user = int(rng.integers(0, USERS))
    value = (f'{{"event_id":"f{i}","user_id":{user},"item_id":{int(rng.integers(0, 10**6))},"is_ad":false,'
             f'"advertiser_id":null,"item_category":3,"surface":"instagram_reels","event_type":"impression",'
             f'"event_time":{now_ms},"value":1.0,"device":"ios"}}')
    return str(user).encode(), value.encode()


class Watcher(threading.Thread):
    """Polls the flush files; records when each event id first became visible."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.visible, self.stop = root, {}, threading.Event()
        self._seen_files: set[Path] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            self.scan()
            time.sleep(0.05)

    def scan(self) -> None:
        for path in sorted(self.root.glob("histories/shard=*/*.parquet")):
            if path in self._seen_files:
                continue
            self._seen_files.add(path)
            at = path.stat().st_mtime
            events = pc.list_flatten(pq.read_table(path, columns=["events"]).column("events"))
            for event_id in pc.struct_field(events, "event_id").to_pylist():
                self.visible.setdefault(event_id, at)


def main() -> None:
    from pipelines.kafka.config import DEFAULT_BOOTSTRAP, KafkaConnection
    from pipelines.kafka.produce import KafkaSink, ensure_topic
    from pipelines.kafka.produce_cli import Pacer
    from pipelines.options import default_prism

    if not default_prism():
        sys.exit("no Prism binary: run make prism")
    bootstrap = os.environ.get("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    connection = KafkaConnection(bootstrap_servers=(bootstrap,))
    topic, group = f"bench-fresh-{uuid.uuid4().hex[:8]}", f"bench-fresh-{uuid.uuid4().hex[:8]}"
    out = WORK / "freshness" / topic
    out.mkdir(parents=True, exist_ok=True)
    ensure_topic(connection, topic, 4)
    job = subprocess.Popen([sys.executable, "-m", "pipelines", "stream", "--topic", topic, "--group", group,
                            "--output", str(out), "--num-shards", "4", "--flush-interval", str(FLUSH_S),
                            "--bootstrap-servers", bootstrap], stdout=subprocess.DEVNULL,
                           stderr=open(WORK / "freshness" / f"{topic}.log", "wb"), start_new_session=True)
    watcher = Watcher(out)
    sink = KafkaSink(connection, topic, linger_ms=2)
    rng = np.random.default_rng(5)
    sent: dict[str, float] = {}
    try:
        sink.send(_event(-1, int(time.time() * 1000), rng)[1], b"0")  # warm-up: wait for the first flush
        sink.flush()
        deadline = time.time() + 120
        while not list(out.glob("histories/shard=*/*.parquet")):
            if job.poll() is not None or time.time() > deadline:
                sys.exit(f"the streaming job did not start (see {WORK / 'freshness' / f'{topic}.log'})")
            time.sleep(0.1)
        watcher.scan()
        watcher.start()
        total = RATE * SECONDS
        pacer = Pacer(RATE)
        for i in range(total):
            now = time.time()
            key, value = _event(i, int(now * 1000), rng)
            sink.send(value, key)
            sent[f"f{i}"] = now
            if i % 50 == 49:
                sink.flush()  # keep the producer from batching for long: each send goes out now
                pacer.wait(i + 1)
        sink.flush()
        deadline = time.time() + 60
        while len(set(sent) & set(watcher.visible)) < len(sent) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        watcher.stop.set()
        sink.close()
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    watcher.scan()
    lat = np.asarray([watcher.visible[e] - t for e, t in sent.items() if e in watcher.visible])
    missing = len(sent) - len(lat)
    if missing:
        gone = sorted(int(e[1:]) for e in sent if e not in watcher.visible)
        print(f"not visible: {missing} events, indices {gone[:3]} .. {gone[-3:]}")
    p50, p99 = (float(np.percentile(lat, q)) for q in (50, 99))
    print(f"events: {len(sent)} at {RATE}/s for {SECONDS} s over {USERS} users; flush interval {FLUSH_S} s")
    print(f"produce -> history visible: p50 {p50 * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms  max "
          f"{lat.max() * 1000:.0f} ms  ({missing} not visible)")
    result("freshness", BOUND_S / p99 if not missing else 0.0, 1,
           f"p99 {p99:.2f} s (bound {BOUND_S} s), p50 {p50:.2f} s at {RATE} events/s, Prism, "
           f"flush {FLUSH_S} s; {missing} events missing")


if __name__ == "__main__":
    main()
