"""solaris-efficiency: pairs/s of the stream graph at saturation against batch precompute's plain loop.

The world of ``bench/solaris.py`` (QUICK: 1,000 users; full: 3,000; an untrained model of the
default GemConfig), its early-stage candidate sets (~200 ads each) with their deadlines lifted
(``--deadline-grace 3650d``), and a fresh LMDB store per run:

- **graph**: the 3 x SETS sets on a topic, all there before the job starts, through ``stream
  --candidates-topic`` on Prism (its keyed state seeded as ``bench/solaris.py`` does), until
  ``--idle-exit``. A run's rate is its steady one, read from the job's /metrics between the times
  10% and 90% of its pairs were computed (:class:`GraphRun`), so its start-up and idle wait lie
  outside;
- **loop**: the same 3 x SETS sets in one process, 8 at a time, as the graph's pairs step computes
  them (:func:`pipelines.streaming.pairs.write_pairs`: skip-if-fresh read, the model's
  shared-history path, the store write) on the features snapshot's histories.

Each runs REPEATS times (3; QUICK 1), a graph run then a loop run, and the medians are taken.

Pairs are distinct (user, ad) pairs: what each run computes into its fresh store (a pair asked
again is found fresh and skipped, in both). ``RESULT solaris-efficiency ratio=<graph pairs/s /
loop pairs/s> target=0.8``. Both at one torch thread. SOLARIS_SETS overrides SETS;
SOLARIS_STAGE=retrieval computes the funnel's ~1,000-ad sets instead (the second size,
``RESULT solaris-efficiency-1000``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# bench/kafka.py would shadow the kafka-python package: this folder must not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import QUICK, WORK, generate, kafka_connection, result, untrained_model  # noqa: E402
from bench.flink_parts import free_port  # noqa: E402
from bench.solaris_stream import StreamGraphRunner, rows_of, seed_stream, snapshot_histories  # noqa: E402

USERS, DAYS = (1_000, 7) if QUICK else (3_000, 7)
SETS = int(os.environ.get("SOLARIS_SETS", 200 if QUICK else 500))
#: The funnel stage whose sets are computed: early (~200 ads) or retrieval (1,000, the second size: its
#: world has at least 4,000 users, so that the generator draws 1,000 ads).
STAGE = os.environ.get("SOLARIS_STAGE", "early")
if STAGE == "retrieval":
    USERS = max(USERS, 4_000)
TARGET = 0.8
#: Runs of each (medians taken).
REPEATS = 1 if QUICK else 3


def main() -> None:
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    bootstrap = kafka_connection().bootstrap
    root = WORK / "solaris-efficiency"
    events, funnel, features = funnel_world(USERS, DAYS, 3 * SETS, root)
    model = untrained_model(root / "model")
    sets = early_sets(funnel, STAGE).slice(0, 3 * SETS)
    graph = seed_stream(events, features, model, root, bootstrap)
    graph_rates, loop_rates = [], []
    for _ in range(REPEATS):  # in turn, so that a drift of this shared machine's speed hits both alike
        graph_rates.append(graph_run(graph, sets, root, bootstrap).steady)
        loop = loop_run(sets, features, model, graph.catalog, root)
        shutil.rmtree(loop.store.removeprefix("lmdb://"), ignore_errors=True)
        loop_rates.append(loop.pairs / loop.seconds)
    graph_rate, loop_rate = statistics.median(graph_rates), statistics.median(loop_rates)
    print(
        f"graph (Prism), steady: {', '.join(f'{r:,.0f}' for r in graph_rates)} pairs/s; "
        f"loop: {', '.join(f'{r:,.0f}' for r in loop_rates)} pairs/s ({loop.pairs:,} pairs per run)",
        flush=True,
    )
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    result(
        "solaris-efficiency" if STAGE == "early" else "solaris-efficiency-1000",
        graph_rate / loop_rate,
        TARGET,
        f"stream graph on Prism {graph_rate:,.0f} pairs/s at saturation vs the plain loop {loop_rate:,.0f} "
        f"pairs/s ({3 * SETS} sets of ~{sets['ad_ids'].combine_chunks().value_lengths().to_numpy().mean():.0f} ads)",
    )


def funnel_world(users: int, days: int, requests: int, root: Path) -> tuple[Path, Path, Path]:
    """(events Parquet, funnel Parquet, features snapshot) of a generated world, made once under ``root``."""
    folder = root / f"world-{users}x{days}-{requests}"
    funnel, features = folder / "funnel.parquet", folder / "features"
    flags = ["--funnel", str(funnel), "--funnel-requests", str(requests)]
    events = generate(users, days, folder / "events.parquet", flags=flags)
    if not features.exists():
        cmd = [sys.executable, "-m", "pipelines", "features", "--input", str(events), "--output", str(features)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return events, funnel, features


def early_sets(funnel: Path, stage: str = "early") -> pa.Table:
    """The funnel's candidate sets of ``stage`` (early: ~200 ads; retrieval: ~1,000), by request id."""
    from pipelines.generator.funnel import stage_rows
    from pipelines.io.parquet import read_table
    from pipelines.schemas.layouts import CANDIDATE_SET

    return stage_rows(read_table(str(funnel), CANDIDATE_SET), stage).sort_by("request_id")


def stage_of(sets: pa.Table) -> str:
    """The funnel stage of ``sets`` (all of one stage)."""
    from pipelines.schemas.enums import FUNNEL_STAGES

    return FUNNEL_STAGES[int(sets["stage"][0].as_py())]


def set_keys(sets: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(user_id, ad_id)`` of every pair of ``sets``, set by set."""
    ads = sets["ad_ids"].combine_chunks()
    return np.repeat(sets["user_id"].to_numpy(), ads.value_lengths().to_numpy()), ads.flatten().to_numpy()


def _pairs(sets: pa.Table) -> int:
    """Distinct (user, ad) pairs of ``sets``: what a run into a fresh store computes (a pair asked
    again is found fresh, or repeated in its batch, and not computed again)."""
    return len(np.unique(np.stack(set_keys(sets), axis=1), axis=0))


@dataclass
class GraphRun:
    """One ``stream --candidates-topic`` run: its distinct pairs and its steady pairs/s, the pairs computed
    between the times :data:`STEADY` of them were, from the job's /metrics
    (``gem_pairs_total{outcome="computed"}``, read every :data:`POLL_S`). The start-up and the idle exit,
    which move by a second or more from run to run, lie outside it."""

    pairs: int
    computed: list[tuple[float, float]]  # (seconds, pairs computed so far) from the job's /metrics

    @property
    def steady(self) -> float:
        return steady_pairs_rate(self.computed, self.pairs)


#: The share of a run's pairs computed at the start and at the end of its steady window.
STEADY = (0.1, 0.9)
POLL_S = 0.2


def graph_run(
    graph: StreamGraphRunner, sets: pa.Table, root: Path, bootstrap: str, flags: Sequence[str] = ()
) -> GraphRun:
    """One ``stream --candidates-topic`` run over ``sets`` (on their topic before it starts) until its
    idle exit; ``flags``: more ``stream`` flags."""
    from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire
    from pipelines.io.kafka.produce import KafkaSink, delete_topics, ensure_topic

    connection = kafka_connection()
    topic = f"bench-solaris-eff-{uuid.uuid4().hex[:8]}"
    ensure_topic(connection, topic, 2)
    sink = KafkaSink(connection, topic, linger_ms=5)
    sink.send_many(candidate_sets_to_wire(sets))
    sink.flush()
    sink.close()
    store = f"lmdb://{root}/store-{uuid.uuid4().hex[:6]}"
    port = free_port()
    cmd = [
        sys.executable, "-m", "pipelines", "stream", "--topic", graph.events_topic, "--group", graph.group,
        "--output", str(graph.output), "--candidates-topic", topic, "--model", str(graph.model), "--store", store,
        "--ad-catalog", str(graph.catalog), "--stage", stage_of(sets), "--deadline-grace", "3650d",
        "--idle-exit", "2", "--device", "cpu", "--bootstrap-servers", bootstrap, "--metrics-port", str(port), *flags,
    ]  # fmt: skip
    started = time.perf_counter()
    with open(root / f"{topic}.log", "wb") as log:
        job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        computed = _poll_computed(job, port)
    seconds = time.perf_counter() - started
    if job.returncode:
        sys.exit(f"the graph's job failed (exit {job.returncode}): see {root / f'{topic}.log'}")
    delete_topics(connection, [topic])
    _check_all_written(store, sets)
    shutil.rmtree(store.removeprefix("lmdb://"), ignore_errors=True)
    pairs = _pairs(sets)
    print(f"graph: {sets.num_rows} sets, {pairs:,} pairs in {seconds:.1f} s (start-up included)", flush=True)
    return GraphRun(pairs, computed)


def _poll_computed(job: subprocess.Popen[bytes], port: int) -> list[tuple[float, float]]:
    """(seconds, pairs computed so far) from the job's /metrics every POLL_S until it exits."""
    from bench.solaris_stream import pair_outcomes

    samples: list[tuple[float, float]] = []
    while job.poll() is None:
        counts = pair_outcomes(port)
        if counts is not None:
            samples.append((time.perf_counter(), counts["computed"]))
        time.sleep(POLL_S)
    return samples


def steady_pairs_rate(samples: Sequence[tuple[float, float]], pairs: int) -> float:
    """Pairs/s between the times the counter in ``samples`` (seconds, count) crossed :data:`STEADY` of
    ``pairs`` (interpolated between samples); refused when the samples do not span that window."""
    low, high = (share * pairs for share in STEADY)
    inside = [count for _, count in samples if low <= count <= high]
    if not samples or samples[-1][1] < high or len(inside) < 3:
        raise SystemExit(f"too few /metrics samples in the steady window of {pairs:,} pairs: {len(inside)}")
    times, counts = np.array([t for t, _ in samples]), np.array([c for _, c in samples])
    return (high - low) / float(np.interp(high, counts, times) - np.interp(low, counts, times))


def _check_all_written(uri: str, sets: pa.Table) -> None:
    """Exit if a pair of ``sets`` is missing from the store: a rate of pairs not computed means nothing."""
    from pipelines.store import open_store

    users, ads = set_keys(sets)
    with open_store(uri) as store:
        found = store.read_arrays(users, ads, np.ones(len(users), bool)).found
    if not found.all():
        sys.exit(f"the graph wrote {int(found.sum()):,} of {len(found):,} pairs: no rate to report")


@dataclass
class LoopRun:
    """One run of the plain loop: distinct pairs, seconds, the encoding cache's hits and misses, and its store."""

    pairs: int
    seconds: float
    hits: int
    misses: int
    store: str


def loop_run(
    sets: pa.Table, features: Path, model: Path, catalog: Path, root: Path, encoding_cache: int = 0
) -> LoopRun:
    """The graph's pairs computation over ``sets``, 8 at a time, in this process, with the graph's ad
    catalog and deadlines lifted, into a fresh LMDB store (the caller removes it); ``encoding_cache``
    users' encodings kept (0: none, batch precompute's plain loop)."""
    import torch

    from pipelines.model.checkpoint import load_model
    from pipelines.model.encoding import EncodingCache
    from pipelines.precompute.refresh import Refresher
    from pipelines.settings import ENCODING_MAX_AGE
    from pipelines.store import open_store
    from pipelines.streaming.pair_work import pair_keys
    from pipelines.streaming.pairs import RECEIVED, candidate_work, load_ad_catalog, write_pairs
    from pipelines.streaming.state import OFFSET, PARTITION

    torch.set_num_threads(1)
    loaded = load_model(str(model), device="cpu")
    histories = snapshot_histories(features)
    cache = EncodingCache.of(encoding_cache, ENCODING_MAX_AGE.seconds)
    refresher = Refresher(loaded, loaded.model_version, catalog=load_ad_catalog(str(catalog)), encoding_cache=cache)
    uri = f"lmdb://{root}/store-loop-{uuid.uuid4().hex[:6]}"
    n = sets.num_rows  # the keyed step's columns, so that the graph's own conversion serves
    work = candidate_work(
        sets.append_column(PARTITION, pa.array(np.zeros(n, np.int32)))
        .append_column(OFFSET, pa.array(np.arange(n, dtype=np.int64)))
        .append_column(RECEIVED, pa.array(np.zeros(n)))
    )
    with open_store(uri) as store:
        started = time.perf_counter()
        for i in range(0, len(work), 8):
            batch = work[i : i + 8]
            write_pairs(refresher, store, loaded.model_version, rows_of(histories, pair_keys(batch)[0]), batch, 3600.0)
        seconds = time.perf_counter() - started
    hits, misses = (cache.hits, cache.misses) if cache else (0, 0)
    return LoopRun(_pairs(sets), seconds, hits, misses, uri)


if __name__ == "__main__":
    main()
