"""The user index at scale: shards merged on disk, the compressed factory against today's IVF,Flat.

5,000,000 users x 64 dims (QUICK: 200,000), synthetic: clustered unit vectors (1,000 centres,
float16-exact, as bench/similarity.py), not model output. Each factory is built the way the
index pipeline builds it, step by step: a seeded training sample, ``SHARDS`` shards added and
written as part files (in this process, one after the other, standing in for the workers),
then the finishing step in a child process of its own (:func:`finish_parts`: inverted lists
merged on disk, vectors streamed, search parameter tuned against chunked exact search), whose
peak RSS (``VmHWM``) is the figure the design bounds. Factories:

- ``IVF<n>,Flat``: what ``--factory auto`` built before at this size (float codes);
- ``auto``: ``IVF<n>,PQ32,RFlat`` from 4M users (32-byte codes, refined on the stored vectors).

For IVF,Flat the child is also run as the finisher worked before (every shard index and every
vector gathered into one process, merged in memory): the baseline of the RSS figure.

Per factory: build time (train + shards + finish), the finisher's peak RSS as a share of the raw
float32 vectors (target <= 25%), bytes per user (the index's lists + quantizer, which a search
maps; and the whole folder with ids and float16 vectors), queries/s of batched search and recall@10
against exact search (``IndexFlatIP``) on ``QUERIES`` fresh queries (a sample: exact search over
every user for every query would take longer than the build on 2 cores).
``SCALE_LEGS=compressed`` runs the compressed factory alone. ``SCALE_NLIST=1024`` builds both
with that many lists instead of auto's (8,192 at 5M): on 2 shared cores auto's k-means and
assignment at 5M take hours. RESULT lines: the compressed
index's recall@10 (target 0.9), then the finisher's peak RSS (ratio = 25% / measured share,
target 1).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pathlib import Path
from typing import Any

import numpy as np

from bench.common import QUICK, WORK, result
from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.build import (
    BuildPlan,
    BuildSpec,
    build_shard,
    finish,
    finish_parts,
    plan,
    train_empty,
    write_built,
)
from pipelines.similarity.ondisk import Part, write_part
from pipelines.similarity.user_index import UserIndex
from pipelines.similarity.vectors import UserVectors

DIM = 64
N = 200_000 if QUICK else 5_000_000
QUERIES = 300
SHARDS = 8
NLIST = int(os.environ.get("SCALE_NLIST", "0"))
TUNE_QUERIES = 200  # the finisher's exact search for tuning is a pass over every vector per 200 queries
RSS_BOUND = 0.25
RECALL_TARGET = 0.9
VERSION = "gem-bench-v1"
OUT = WORK / "similarity-scale"


def clustered(n: int, seed: int, centres: np.ndarray, noise: float = 0.5, chunk: int = 500_000) -> np.ndarray:
    """``(n, DIM)`` float32 unit vectors around ``centres``, float16-exact, made ``chunk`` rows at a time."""
    out = np.empty((n, DIM), np.float32)
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        x = centres[rng.integers(0, len(centres), m)] + noise * rng.standard_normal((m, DIM), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[start : start + m] = x.astype(np.float16)
    return out


def _spec(factory: str) -> BuildSpec:
    return BuildSpec(factory=factory, gpu="off", shards=SHARDS, recall_target=0.95, tune_queries=TUNE_QUERIES)


def _save_plan(folder: Path, build: BuildPlan, factory: str, trained: bytes) -> None:
    np.save(folder / "sample.npy", build.sample_positions)
    (folder / "trained.bin").write_bytes(trained)
    meta = {"factory": factory, "resolved": build.factory, "dim": build.dim, "count": build.count}
    (folder / "plan.json").write_text(json.dumps({**meta, "bounds": build.bounds}))


def _load_plan(folder: Path) -> tuple[BuildPlan, BuildSpec, bytes]:
    meta = json.loads((folder / "plan.json").read_text())
    bounds = [(int(lo), int(hi)) for lo, hi in meta["bounds"]]
    build = BuildPlan(meta["resolved"], meta["dim"], meta["count"], np.load(folder / "sample.npy"), bounds)
    return build, _spec(meta["factory"]), (folder / "trained.bin").read_bytes()


def child_finish(folder: Path, mode: str) -> None:
    """The finishing step alone in this process; prints its peak RSS and manifest as one JSON line."""
    build, spec, trained = _load_plan(folder)
    parts = [Part(folder / "parts", s) for s in range(len(build.bounds))]
    out = folder / ("index" if mode == "ondisk" else "gathered")
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    ids = np.arange(build.count, dtype=np.int64)
    if mode == "ondisk":
        manifest = finish_parts(build, spec, trained, parts, ids, VERSION, "bench", started, out)
    else:  # the finisher before: every shard index and every vector in this process
        indexes = [ops.faiss.read_index(str(p.index)) for p in parts]
        vectors = np.concatenate([np.load(p.vectors).astype(np.float32) for p in parts])
        users = UserVectors(ids, vectors, np.zeros(len(ids), np.int64), np.full(len(ids), VERSION, dtype=object))
        built = finish(build, spec, indexes, users, VERSION, "bench", started)
        write_built(built, out)
        manifest = built.manifest
    seconds = time.perf_counter() - started
    peak = _vm_hwm()
    print(json.dumps({"peak_rss": peak, "seconds": seconds, "params": manifest.search_params}), flush=True)


def _vm_hwm() -> int:
    """This process's peak RSS in bytes (``VmHWM``: its own address space's high-water mark;
    ``ru_maxrss`` would also count the forking parent's pages, kept across ``exec``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_child(folder: Path, mode: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--finish", str(folder), mode]
    proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _folder_bytes(folder: Path, names: tuple[str, ...] | None = None) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and (names is None or p.name in names))


def measure(data: np.ndarray, queries: np.ndarray, truth: np.ndarray, factory: str, gathered: bool) -> dict[str, Any]:
    folder = OUT / factory.replace(",", "_")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    spec = _spec(factory)
    started = time.perf_counter()
    build = plan(spec, len(data), DIM)
    trained = train_empty(build, spec, data[build.sample_positions])
    train_s = time.perf_counter() - started
    for shard, (lo, hi) in enumerate(build.bounds):
        index = build_shard(trained, data[lo:hi], lo, spec)
        part = write_part(index, data[lo:hi], folder / "parts", shard)
        if gathered:
            ops.faiss.write_index(index, str(part.index))
        del index
    shards_s = time.perf_counter() - started - train_s
    _save_plan(folder, build, factory, trained)
    child = _run_child(folder, "ondisk")
    build_s = time.perf_counter() - started
    before = _run_child(folder, "gather") if gathered else None
    index = UserIndex.load(folder / "index", gpu="off")
    index.search(queries[:50], 10)  # warm-up: maps the quantizer and some lists
    t0 = time.perf_counter()
    found = index.search(queries, 10)[1]
    qps = len(queries) / (time.perf_counter() - t0)
    raw = data.nbytes
    figures = {
        "factory": build.factory,
        "train_s": train_s,
        "shards_s": shards_s,
        "finish_s": child["seconds"],
        "build_s": build_s,
        "rss_share": child["peak_rss"] / raw,
        "rss_share_before": before["peak_rss"] / raw if before else None,
        "index_bytes_per_user": _folder_bytes(folder / "index", ("index.faiss", "lists.ivfdata")) / len(data),
        "folder_bytes_per_user": _folder_bytes(folder / "index") / len(data),
        "qps": qps,
        "recall": ops.recall_at_k(found, truth),
        "params": child["params"],
    }
    del index
    shutil.rmtree(folder, ignore_errors=True)  # gigabytes at full size
    return figures


def report(rows: list[dict[str, Any]], exact_qps: float) -> None:
    print(
        f"{'factory':<22}{'train s':>9}{'shards s':>10}{'finish s':>10}{'build s':>9}{'finisher RSS':>14}"
        f"{'index B/user':>14}{'folder B/user':>15}{'q/s':>9}{'R@10':>7}  params"
    )
    for r in rows:
        rss = f"{r['rss_share']:.1%}"
        print(
            f"{r['factory']:<22}{r['train_s']:>9.1f}{r['shards_s']:>10.1f}{r['finish_s']:>10.1f}{r['build_s']:>9.1f}"
            f"{rss:>14}{r['index_bytes_per_user']:>14.1f}{r['folder_bytes_per_user']:>15.1f}{r['qps']:>9.0f}"
            f"{r['recall']:>7.3f}  {r['params']}"
        )
        if r["rss_share_before"] is not None:
            print(f"{'  gathered (before)':<22}{'':>9}{'':>10}{'':>10}{'':>9}{r['rss_share_before']:>14.1%}")
    print(f"exact search (IndexFlatIP, in memory): {exact_qps:.0f} q/s")


def main() -> None:
    load = os.getloadavg()
    print(
        f"similarity-scale: {N:,} x {DIM} synthetic clustered vectors (not model output), {SHARDS} shards, "
        f"{QUERIES} fresh queries; faiss {ops.faiss.__version__}; load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}",
        flush=True,
    )
    centres = np.random.default_rng(0).normal(size=(1_000, DIM)).astype(np.float32)
    data, queries = clustered(N, 1, centres), clustered(QUERIES, 2, centres)
    t0 = time.perf_counter()
    truth = ops.exact_search(data, queries, 10, "ip")[1]
    exact_qps = QUERIES / (time.perf_counter() - t0)
    auto = ops.resolve_factory("auto", N, DIM)  # QUICK: below the compressed threshold, so named here
    compressed = auto if N >= ops.AUTO_COMPRESSED_FROM else auto.replace(",Flat", ",PQ32,RFlat")
    if NLIST:  # fewer lists than auto's: training and adding cost O(n x nlist), minutes at full size
        compressed = f"IVF{NLIST}," + compressed.split(",", 1)[1]
    flat = compressed.split(",")[0] + ",Flat"
    if os.environ.get("SCALE_LEGS") == "compressed":  # the compressed leg alone (a rerun after a change)
        pq_row = measure(data, queries, truth, compressed, gathered=False)
        report([pq_row], exact_qps)
        result("similarity-scale-recall", pq_row["recall"], RECALL_TARGET, f"{pq_row['factory']} alone")
        result("similarity-scale", RSS_BOUND / pq_row["rss_share"], 1.0, f"{pq_row['rss_share']:.1%} alone")
        return
    rows = [measure(data, queries, truth, flat, gathered=True)]
    rows.append(measure(data, queries, truth, compressed, gathered=False))
    report(rows, exact_qps)
    end = os.getloadavg()
    flat_row, pq_row = rows
    print(f"load average at the end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")
    result(
        "similarity-scale-recall",
        pq_row["recall"],
        RECALL_TARGET,
        f"recall@10 of {pq_row['factory']} vs exact on {QUERIES} queries at {N:,} x {DIM} "
        f"({pq_row['qps']:.0f} q/s, {pq_row['index_bytes_per_user']:.0f} B/user; {flat_row['factory']}: "
        f"{flat_row['recall']:.3f}, {flat_row['qps']:.0f} q/s, {flat_row['index_bytes_per_user']:.0f} B/user)",
    )
    result(
        "similarity-scale",
        RSS_BOUND / pq_row["rss_share"],
        1.0,
        f"bound 25% over the finisher's peak RSS share of the raw vectors: {pq_row['rss_share']:.1%} "
        f"({pq_row['factory']}, on disk); {flat_row['factory']} on disk {flat_row['rss_share']:.1%}, "
        f"gathered as before {flat_row['rss_share_before']:.1%}; {N:,} x {DIM}",
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--finish":
        child_finish(Path(sys.argv[2]), sys.argv[3])
    else:
        main()
