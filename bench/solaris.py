"""Solaris in real time: when the late ranking stage asks for its ads' pair representations, are they there?

Replays a generated ranking funnel (``generate --funnel``) against ``python -m pipelines solaris``
(the stream graph with candidate sets, :mod:`bench.solaris_stream`: a subprocess, an untrained
model of the default GemConfig, seeded: inference costs the same whatever the weights; its keyed
state seeded by streaming the world's events first; an LMDB store), on Prism and then on a Flink
cluster of the bench's own at parallelism 2: at each rate of RATES requests/s it sends each
request's early-stage candidate set (~200 ads) to the candidates topic at its turn,
with ``needed_by`` = now + the request's own early -> late gap from the generator
(lognormal, median 150 ms); when that moment comes it resolves the request's
late-stage ads (~50, a subset) with the real resolver
(:class:`pipelines.similarity.resolver.Resolver`: the store and a FAISS index of the
users' representations, written before the run as a nightly precompute would) and
records each ad's path (exact pair / same user / similar users / none) and age.

Per rate it prints: candidate set sent -> its pairs visible in the store, p50/p99 (a
watcher reads one late-stage pair of every pending set every POLL_S; the job writes a
batch's pairs in one store write), the share of late-stage ads served exactly, the
fallback mix of the rest, and the compute the job saved by skipping pairs already fresh
in the store (the job's metrics, on Prism). The baseline is the resolver alone on the same
store without the job (every ad then takes a fallback): printed as ``exact share
without the job``.

``RESULT solaris-exact-stream ratio=<exact share at the highest rate where it is >= 0.95>/0.95``
on Prism and ``RESULT solaris-exact-flink`` on Flink (``SKIP`` where its parts are missing); the
lowest rate's share when none holds; target 1. QUICK: rates 5 and 20 for 15 s.
SOLARIS_RATES=5,20,50, SOLARIS_SECONDS and SOLARIS_RUNNERS=prism,flink override.

While the sets flow, the stream's own events flow into the same graph at SOLARIS_EVENTS events/s
(default 2,000; 0: none): fresh events for the world's users (:class:`bench.solaris_stream.EventFlow`),
so the histories the sets meet change under them, and the graph flushes and refreshes them too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# bench/kafka.py would shadow the kafka-python package: this folder must not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from collections.abc import Callable  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import QUICK, WORK, generate, kafka_connection, result, untrained_model  # noqa: E402
from bench.solaris_stream import EventFlow, JobRunner, rows_of, snapshot_histories  # noqa: E402

if TYPE_CHECKING:
    from pipelines.io.kafka.produce import KafkaSink
    from pipelines.similarity.resolver import Resolver
    from pipelines.similarity.user_index import UserIndex

Encode = Callable[[pa.Table], list[tuple[bytes | None, bytes]]]
TARGET = 0.95
POLL_S = 0.02
RATES = [int(r) for r in os.environ.get("SOLARIS_RATES", "5,20" if QUICK else "5,20,50").split(",")]
SECONDS = float(os.environ.get("SOLARIS_SECONDS", 15 if QUICK else 60))
USERS, DAYS = (1_000, 7) if QUICK else (3_000, 7)
#: The runners (prism, flink), and the Flink cluster's settings (FLINK_* of scripts/flink.sh, e.g.
#: SOLARIS_FLINK_ENV="FLINK_SLOTS=2") and more Beam flags of its job.
RUNNERS = os.environ.get("SOLARIS_RUNNERS", "prism,flink").split(",")
#: events/s of the stream's own flow into the same graph while the sets flow (0: none)
EVENTS = int(os.environ.get("SOLARIS_EVENTS", 2_000))
FLINK_ENV = dict(kv.split("=", 1) for kv in os.environ.get("SOLARIS_FLINK_ENV", "").split())
FLINK_FLAGS = os.environ.get("SOLARIS_FLINK_FLAGS", "").split()
#: more flags of the job on both runners (e.g. SOLARIS_JOB_FLAGS="--flush-interval 5s")
JOB_FLAGS = os.environ.get("SOLARIS_JOB_FLAGS", "").split()
PATH_NAMES = ("exact", "same_user_pair", "same_user", "similar_users", "none")


@dataclass
class Run:
    rate: int
    sent: int = 0
    visible_s: list[float] = field(default_factory=list)
    never_visible: int = 0
    paths: np.ndarray = field(default_factory=lambda: np.zeros(len(PATH_NAMES), np.int64))
    exact_age_s: list[float] = field(default_factory=list)
    job_line: str = ""
    flow_line: str = ""

    @property
    def exact_share(self) -> float:
        return float(self.paths[0] / max(self.paths.sum(), 1))


def main() -> None:
    kafka_connection()  # no broker: the fix, before the world is built
    root = WORK / "solaris"
    need = int(sum(RATES) * SECONDS) + 50
    folder = root / f"world-{USERS}x{DAYS}-{need}"
    funnel_path, features = folder / "funnel.parquet", folder / "features"
    events = generate(
        USERS, DAYS, folder / "events.parquet", flags=["--funnel", str(funnel_path), "--funnel-requests", str(need)]
    )
    if not features.exists():
        subprocess.run(
            [sys.executable, "-m", "pipelines", "features", "--input", str(events), "--output", str(features)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    model = untrained_model(root / "model")
    world = _World.load(funnel_path, features, model, events)
    baseline = _baseline_exact(world, root)
    _stream_graph(world, root, events, baseline)


def _rates(world: _World, root: Path, runner: JobRunner) -> list[Run]:
    """Every rate of RATES, each on its own slice of the funnel's requests."""
    runs, offset = [], 0
    for rate in RATES:
        count = int(rate * SECONDS)
        runs.append(measure(world, root, rate, offset, count, runner))
        offset += count
        _report(runs[-1])
    return runs


def _result(name: str, world: _World, runs: list[Run], baseline: float, job: str) -> None:
    held = [r for r in runs if r.exact_share >= TARGET]
    chosen = max(held, key=lambda r: r.rate) if held else min(runs, key=lambda r: r.rate)
    met = ", ".join(str(r.rate) for r in held) or "none"
    result(
        name,
        chosen.exact_share / TARGET,
        1,
        f"exact share {chosen.exact_share:.3f} of late-stage ads at {chosen.rate} requests/s of "
        f"~{world.early_size} candidates, {job} (>= {TARGET} at: {met} req/s; without a job: {baseline:.3f})",
    )


def _stream_graph(world: _World, root: Path, events: Path, baseline: float) -> None:
    """The sets through ``solaris`` (the stream graph): on Prism, then on Flink at parallelism 2."""
    from bench.flink_parts import own_flink, own_flink_missing
    from bench.solaris_stream import seed_stream

    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    graph = seed_stream(events, world.features, world.model, root, kafka_connection().bootstrap)
    graph.flags = JOB_FLAGS
    if "prism" in RUNNERS:
        _result("solaris-exact-stream", world, _rates(world, root, graph), baseline, graph.name)
    missing = own_flink_missing()
    if missing or "flink" not in RUNNERS:
        print(f"SKIP solaris-exact-flink {missing or 'not in SOLARIS_RUNNERS'}", flush=True)
        return
    with own_flink(root / f"flink-{uuid.uuid4().hex[:8]}", slots=1, **FLINK_ENV) as cluster:
        graph.cluster, graph.flags = cluster, JOB_FLAGS + FLINK_FLAGS
        runs = _rates(world, root, graph)
    _result("solaris-exact-flink", world, runs, baseline, graph.name)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)


@dataclass
class _World:
    early: pa.Table  # early-stage rows, in request order
    late: pa.Table  # late-stage rows, same order
    gaps_ms: np.ndarray  # early -> late gap per request
    features: Path
    model: Path
    user_reps: pa.Table
    index: UserIndex
    early_size: int
    events: Path  # the world's events Parquet (the shapes of the events flowing during a run)

    @classmethod
    def load(cls, funnel_path: Path, features: Path, model: Path, events: Path) -> _World:
        from pipelines.generator.funnel import stage_rows
        from pipelines.io.parquet import read_table
        from pipelines.model.checkpoint import load_model
        from pipelines.precompute.refresh import Refresher
        from pipelines.schemas.layouts import CANDIDATE_SET
        from pipelines.similarity.build import BuildSpec, build_index
        from pipelines.similarity.user_index import UserIndex
        from pipelines.similarity.vectors import UserVectors

        funnel = read_table(str(funnel_path), CANDIDATE_SET)
        early = stage_rows(funnel, "early").sort_by("request_id")
        late = stage_rows(funnel, "late").sort_by("request_id")
        order = np.argsort(early["stage_time"].cast(pa.int64()).to_numpy(), kind="stable")
        early, late = early.take(order), late.take(order)
        gaps = late["stage_time"].cast(pa.int64()).to_numpy() - early["stage_time"].cast(pa.int64()).to_numpy()
        loaded = load_model(str(model), device="cpu")
        histories = rows_of(snapshot_histories(features), early["user_id"].to_numpy())
        reps = Refresher(loaded, loaded.model_version).refresh(histories, computed_at_ms=int(time.time() * 1000))
        dim = len(reps["embedding"][0])
        vectors = UserVectors(
            reps["user_id"].to_numpy(),
            np.asarray(reps["embedding"].to_pylist(), np.float32).reshape(-1, dim),
            np.zeros(reps.num_rows, np.int64),
            np.full(reps.num_rows, loaded.model_version, dtype=object),
        )
        index = UserIndex.from_built(build_index(vectors, BuildSpec(gpu="off")))
        size = int(np.median([len(a) for a in early["ad_ids"].to_pylist()[:100]]))
        return cls(early, late, gaps, features, model, reps, index, size, events)


def _store(world: _World, folder: Path) -> str:
    """A fresh LMDB store holding the users' representations (written as of now)."""
    from pipelines.store import open_store

    uri = f"lmdb://{folder}/store-{uuid.uuid4().hex[:6]}"
    reps = world.user_reps.set_column(
        world.user_reps.schema.get_field_index("computed_at"),
        "computed_at",
        pa.array([int(time.time() * 1000)] * world.user_reps.num_rows).cast(pa.timestamp("ms", tz="UTC")),
    )
    with open_store(uri) as store:
        store.write_batch(reps)
    return uri


def _resolver(world: _World, uri: str) -> Resolver:
    from pipelines.similarity.policy import ResolverConfig
    from pipelines.similarity.resolver import Resolver
    from pipelines.store import open_store

    return Resolver(open_store(uri), world.index, ResolverConfig())


def _baseline_exact(world: _World, root: Path) -> float:
    """The exact share of the late-stage ads of the first 50 requests with nothing precomputed."""
    uri = _store(world, root)
    resolver = _resolver(world, uri)
    paths = np.zeros(len(PATH_NAMES), np.int64)
    for i in range(min(50, world.late.num_rows)):
        got = resolver.resolve(int(world.late["user_id"][i].as_py()), world.late["ad_ids"][i].as_py())
        paths += np.bincount(got.path, minlength=len(PATH_NAMES))
    resolver.store.close()
    shutil.rmtree(uri.removeprefix("lmdb://"), ignore_errors=True)
    return float(paths[0] / max(paths.sum(), 1))


class _Watcher(threading.Thread):
    """Reads one late-stage pair of every pending set every POLL_S; records when each first appears."""

    def __init__(self, uri: str) -> None:
        from pipelines.store import open_store

        super().__init__(daemon=True)
        self.store = open_store(uri)
        self.pending: dict[int, tuple[int, int, float]] = {}  # request -> (user, ad, sent at)
        self.visible: dict[int, float] = {}
        self.lock, self.stop = threading.Lock(), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            with self.lock:
                items = list(self.pending.items())
            if not items:
                continue
            users = np.array([u for _, (u, _, _) in items], np.int64)
            ads = np.array([a for _, (_, a, _) in items], np.int64)
            got = self.store.read_arrays(users, ads, np.ones(len(items), bool))
            now = time.time()
            with self.lock:
                for (request, (_, _, sent)), found in zip(items, got.found.tolist(), strict=True):
                    if found:
                        self.visible[request] = now - sent
                        self.pending.pop(request, None)


def measure(world: _World, root: Path, rate: int, first: int, count: int, runner: JobRunner) -> Run:
    from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire
    from pipelines.io.kafka.produce import KafkaSink, delete_topics, ensure_topic

    connection = kafka_connection()
    bootstrap = connection.bootstrap
    topic = f"bench-solaris-{uuid.uuid4().hex[:8]}"
    ensure_topic(connection, topic, 2)
    uri = _store(world, root)
    log = open(root / f"{topic}.log", "wb")
    job = runner.start(topic, uri, bootstrap, log)
    sink = KafkaSink(connection, topic, linger_ms=0)
    run, watcher, resolver = Run(rate), _Watcher(uri), _resolver(world, uri)
    flow = EventFlow(world.events, EVENTS)
    try:
        _warm_up(world, sink, watcher, job, candidate_sets_to_wire)
        flow.start(runner.events_topic, bootstrap, count / rate + 5, root)
        watcher.start()
        _replay(world, run, sink, watcher, resolver, first, count, candidate_sets_to_wire)
        time.sleep(1.0)
    finally:
        watcher.stop.set()
        sink.close()
        run.flow_line = flow.stop(bootstrap)
        run.job_line = runner.stop(job)
        resolver.store.close()
        watcher.store.close()
        delete_topics(connection, [topic])
        shutil.rmtree(uri.removeprefix("lmdb://"), ignore_errors=True)
    run.never_visible = len(watcher.pending)
    run.visible_s = list(watcher.visible.values())
    return run


def _sets(world: _World, rows: list[int], now_ms: int, gaps: np.ndarray) -> pa.Table:
    table = world.early.take(pa.array(rows))
    stamp = pa.timestamp("ms", tz="UTC")
    table = table.set_column(4, "stage_time", pa.array([now_ms] * len(rows)).cast(stamp))
    return table.set_column(5, "needed_by", pa.array((now_ms + gaps).tolist()).cast(stamp))


#: Warm-up sets, of distinct users (so on Flink every subtask's worker loads its model and state first).
WARM_UP_SETS = 8


def _warm_up(world: _World, sink: KafkaSink, watcher: _Watcher, job: subprocess.Popen, encode: Encode) -> None:
    """WARM_UP_SETS sets (the funnel's last ones) with a far deadline; wait until all their pairs are in
    the store (the job is up, and each worker has loaded its model)."""
    rows = list(range(world.early.num_rows - WARM_UP_SETS, world.early.num_rows))
    table = _sets(world, rows, int(time.time() * 1000), np.full(len(rows), 600_000))
    for key, value in encode(table):
        sink.send(value, key)
    sink.flush()
    users = np.asarray(table["user_id"].to_pylist(), np.int64)
    ads = np.asarray([world.late["ad_ids"][i].as_py()[0] for i in rows], np.int64)
    deadline = time.time() + 300
    while not watcher.store.read_arrays(users, ads, np.ones(len(rows), bool)).found.all():
        if job.poll() is not None or time.time() > deadline:
            sys.exit("the solaris job did not start (see its log under out/bench/solaris)")
        time.sleep(0.1)


def _replay(
    world: _World,
    run: Run,
    sink: KafkaSink,
    watcher: _Watcher,
    resolver: Resolver,
    first: int,
    count: int,
    encode: Encode,
) -> None:
    """Send set i at start + i / rate; resolve its late stage at its own send time + gap."""
    start = time.time() + 0.5
    sends = [(start + k / run.rate, "send", first + k) for k in range(count)]
    lates = [(start + k / run.rate + world.gaps_ms[first + k] / 1000.0, "late", first + k) for k in range(count)]
    sent_at: dict[int, float] = {}
    for at, kind, i in sorted(sends + lates):
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)
        if kind == "send":
            now = time.time()
            table = _sets(world, [i], int(now * 1000), world.gaps_ms[i : i + 1])
            for key, value in encode(table):
                sink.send(value, key)
            sink.flush()
            sent_at[i] = now
            with watcher.lock:
                watcher.pending[i] = (int(world.late["user_id"][i].as_py()), world.late["ad_ids"][i].as_py()[0], now)
            run.sent += 1
            continue
        got = resolver.resolve(int(world.late["user_id"][i].as_py()), world.late["ad_ids"][i].as_py())
        run.paths += np.bincount(got.path, minlength=len(PATH_NAMES))
        run.exact_age_s += got.age_s[got.path == 0].tolist()


def _report(run: Run) -> None:
    lat = np.asarray(run.visible_s)
    p50, p99 = (float(np.percentile(lat, q)) * 1000 if len(lat) else float("nan") for q in (50, 99))
    mix = ", ".join(f"{name} {n / max(run.paths.sum(), 1):.3f}" for name, n in zip(PATH_NAMES, run.paths, strict=True))
    saved = re.search(r"\(([\d,]+) pairs computed, ([\d,]+) fresh in the store", run.job_line)
    share = "n/a"
    if saved:
        computed, fresh = (int(x.replace(",", "")) for x in saved.groups())
        share = f"{fresh / max(computed + fresh, 1):.3f} ({fresh:,} of {computed + fresh:,} pairs fresh in the store)"
    ages = np.asarray(run.exact_age_s)
    print(
        f"rate {run.rate} req/s, {run.sent} requests: set sent -> pair visible p50 {p50:.0f} ms p99 {p99:.0f} ms "
        f"({run.never_visible} never); late-stage ads: {mix}; exact age p50 "
        f"{float(np.median(ages)) * 1000 if len(ages) else float('nan'):.0f} ms; compute saved {share}\n"
        f"  job: {run.job_line}\n  {run.flow_line}",
        flush=True,
    )


if __name__ == "__main__":
    main()
