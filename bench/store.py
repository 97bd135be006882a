"""Online store: read latency of one 200-candidate request and write throughput, LMDB vs one Redis
node vs a Redis Cluster (a hash tag per user, and a slot per key), in one run.

Every backend gets the same records (user-level + pair representations, 64 float16
dims, written in batches of 10,000 as precompute would) and the same requests: one
``read_for_request`` of 200 candidate ads (about half stored) plus the user-level
record, decoded into arrays with ages and staleness: what the resolver pays. Stores take
turns request by request, so the machine's other load falls on all alike.

Three RESULT lines:
- ``store``: a 5 ms p99 bound / the embedded store's p99 (target 1);
- ``store-cluster``: a 2 ms p99 bound / the cluster's p99 (hash-tag layout; target 1), with
  its write throughput against the single Redis node's;
- ``store-cluster-layout``: the per-pair-slot layout's read p99 / the hash-tag layout's
  (target 1: one slot per user is at least as fast as a slot per key).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa

from bench.common import QUICK, ROOT, WORK, result
from pipelines.schemas.layouts import representation_schema
from pipelines.store import (
    LmdbConfig,
    LmdbStore,
    OnlineStore,
    RedisClusterStore,
    RedisConfig,
    RedisStore,
    StoreUnavailableError,
    default_redis_cluster_url,
    default_redis_url,
    open_store,
    record_nbytes,
)

P99_BOUND_MS = 5.0
CLUSTER_P99_BOUND_MS = 2.0
DIM = 64
CANDIDATES = 200
BATCH = 10_000


def batches(users: int, ads_per_user: int, seed: int = 5) -> list[pa.Table]:
    """User-level + pair records: user u holds ads (u * 7 + j * 13) % 5000 for j < ads_per_user."""
    rng = np.random.default_rng(seed)
    per_user = ads_per_user + 1
    user_id = np.repeat(np.arange(users, dtype=np.int64), per_user)
    slot = np.tile(np.arange(per_user, dtype=np.int64), users)
    ad_id = (user_id * 7 + (slot - 1) * 13) % 5000
    now_ms = int(time.time() * 1000)
    out = []
    for start in range(0, len(user_id), BATCH):
        n = min(BATCH, len(user_id) - start)
        emb = rng.normal(size=n * DIM).astype(np.float16)
        times = pa.array(np.full(n, now_ms), pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        out.append(
            pa.Table.from_arrays(
                [
                    pa.array(user_id[start : start + n]),
                    pa.array(ad_id[start : start + n], mask=slot[start : start + n] == 0),
                    pa.FixedSizeListArray.from_arrays(pa.array(emb, pa.float16()), DIM),
                    pa.nulls(n, pa.float32()),
                    pa.array(rng.random(n, dtype=np.float32)),
                    pa.array(rng.random(n, dtype=np.float32) / 10),
                    pa.array(["gem-bench-v1"] * n),
                    times,
                    times,
                ],
                schema=representation_schema(DIM),
            )
        )
    return out


def requests(users: int, ads_per_user: int, count: int, seed: int = 9) -> list[tuple[int, np.ndarray]]:
    """(user, 200 ads): about half of them stored for that user, the rest not."""
    rng = np.random.default_rng(seed)
    out = []
    for user in rng.integers(0, users, size=count).tolist():
        held = (user * 7 + np.arange(ads_per_user) * 13) % 5000
        k = min(len(held), CANDIDATES // 2)
        ads = np.concatenate([rng.choice(held, k, replace=False), rng.integers(5000, 10**9, CANDIDATES - k)])
        out.append((user, rng.permutation(ads)))
    return out


def write_all(store: OnlineStore, tables: list[pa.Table]) -> float:
    start = time.perf_counter()
    written = sum(store.write_batch(t).written for t in tables)
    seconds = time.perf_counter() - start
    assert written == sum(t.num_rows for t in tables), "store skipped records"
    return written / seconds


def read_latencies(
    stores: dict[str, OnlineStore], reqs: list[tuple[int, np.ndarray]], neighbors: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per store, (wall ms, thread CPU ms) of each request; stores take turns request by request,
    so load from other processes on the machine falls on both alike."""
    for store in stores.values():
        for user, ads in reqs[:50]:  # warm-up: page cache, connection, version cache
            store.read_for_request(user, ads)
    out = {name: (np.empty(len(reqs)), np.empty(len(reqs))) for name in stores}
    found = dict.fromkeys(stores, 0)
    for i, (user, ads) in enumerate(reqs):
        near = [(user + d) % 1000 for d in range(1, neighbors + 1)]
        for name, store in stores.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            got = store.read_for_request(user, ads, near)
            out[name][1][i] = (time.thread_time() - cpu) * 1000
            out[name][0][i] = (time.perf_counter() - wall) * 1000
            found[name] += int(got.pairs.found.sum())
    for name, count in found.items():
        assert count >= len(reqs) * CANDIDATES // 4, f"{name}: only {count} pairs found: wrong keys?"
    return out


def ensure_redis(url: str) -> None:
    probe = RedisStore(RedisConfig(url))
    try:
        probe.ping()
    except StoreUnavailableError:
        print("redis not reachable: starting it with scripts/redis.sh up", flush=True)
        subprocess.run(["bash", str(ROOT / "scripts" / "redis.sh"), "up"], check=True)
    finally:
        probe.close()


def ensure_redis_cluster(uri: str) -> None:
    try:
        open_store(uri).close()
    except StoreUnavailableError:
        print("redis cluster not reachable: starting it with scripts/redis-cluster.sh up", flush=True)
        subprocess.run(["bash", str(ROOT / "scripts" / "redis-cluster.sh"), "up"], check=True)


def open_stores(lmdb_dir: str) -> dict[str, OnlineStore]:
    """The four stores, each under a fresh namespace: lmdb, redis (one node), cluster (a hash tag per
    user), cluster-pair (a slot per key)."""
    url, cluster = default_redis_url(), default_redis_cluster_url()
    ensure_redis(url)
    ensure_redis_cluster(cluster)
    tag = uuid.uuid4().hex[:8]
    return {
        "lmdb": LmdbStore(LmdbConfig(lmdb_dir)),
        "redis": RedisStore(RedisConfig(url, f"bench:{tag}:")),
        "cluster": open_store(f"{cluster}?namespace=bench:{tag}:&layout=user"),
        "cluster-pair": open_store(f"{cluster}?namespace=bench:{tag}p:&layout=pair"),
    }


def main() -> None:
    users, ads_per_user, n_requests = (2_000, 100, 1_000) if QUICK else (10_000, 100, 5_000)
    tables = batches(users, ads_per_user)
    records = sum(t.num_rows for t in tables)
    reqs = requests(users, ads_per_user, n_requests)
    lmdb_dir = WORK / "store-lmdb"
    shutil.rmtree(lmdb_dir, ignore_errors=True)
    stores = open_stores(str(lmdb_dir))
    figures: dict[str, dict[str, float]] = {}
    try:
        for name, store in stores.items():
            figures[name] = {"write": write_all(store, tables)}
        narrow = read_latencies(stores, reqs)
        wide = read_latencies(stores, reqs[: max(100, n_requests // 10)], neighbors=10)
        for name, f in figures.items():
            (wall, cpu), wide_wall = narrow[name], wide[name][0]
            f.update(p50=float(np.percentile(wall, 50)), p99=float(np.percentile(wall, 99)))
            f.update(wide_p99=float(np.percentile(wide_wall, 99)), cpu_p99=float(np.percentile(cpu, 99)))
            print(
                f"{name:12s}: write {f['write'] / 1e3:6.1f} k records/s | one request of {CANDIDATES} "
                f"candidates + user: wall p50 {f['p50']:.3f} ms  p99 {f['p99']:.3f} ms "
                f"(this thread's CPU: p50 {np.percentile(cpu, 50):.3f}  p99 {np.percentile(cpu, 99):.3f}) "
                f"| with 10 neighbours ({CANDIDATES * 11 + 1} keys): p50 {np.percentile(wide_wall, 50):.2f} "
                f"p99 {f['wide_p99']:.2f} ms",
                flush=True,
            )
        print_sizes(stores, records)
    finally:
        for name, store in stores.items():
            if name != "lmdb":
                store.clear()
            store.close()
        shutil.rmtree(lmdb_dir, ignore_errors=True)
    report(figures, records, n_requests)


def report(figures: dict[str, dict[str, float]], records: int, n_requests: int) -> None:
    lm, rd, cl, cp = (figures[name] for name in ("lmdb", "redis", "cluster", "cluster-pair"))
    size = f"{records} records x {DIM} dims, {n_requests} requests of {CANDIDATES}"
    result(
        "store",
        P99_BOUND_MS / lm["p99"],
        1,
        f"{P99_BOUND_MS:g} ms bound / embedded p99; lmdb p50 {lm['p50']:.3f} p99 {lm['p99']:.3f} ms, "
        f"write {lm['write'] / 1e3:.0f}k rec/s; redis p50 {rd['p50']:.3f} p99 {rd['p99']:.3f} ms "
        f"(ratio {P99_BOUND_MS / rd['p99']:.2f}), write {rd['write'] / 1e3:.0f}k rec/s; {size}",
    )
    result(
        "store-cluster",
        CLUSTER_P99_BOUND_MS / cl["p99"],
        1,
        f"{CLUSTER_P99_BOUND_MS:g} ms bound / 6-node cluster p99 (hash tag per user); cluster p50 {cl['p50']:.3f} "
        f"p99 {cl['p99']:.3f} ms vs one node p99 {rd['p99']:.3f} ms (the reading thread's CPU p99: cluster "
        f"{cl['cpu_p99']:.3f}, one node {rd['cpu_p99']:.3f} ms); with 10 neighbours p99 {cl['wide_p99']:.2f} ms "
        f"vs {rd['wide_p99']:.2f}; write {cl['write'] / 1e3:.1f}k rec/s (every replica acknowledged) vs one node "
        f"{rd['write'] / 1e3:.1f}k: x{cl['write'] / rd['write']:.2f}; {size}",
    )
    result(
        "store-cluster-layout",
        cp["p99"] / cl["p99"],
        1,
        f"per-pair-slot p99 / hash-tag p99; pair p50 {cp['p50']:.3f} p99 {cp['p99']:.3f} ms, with 10 neighbours "
        f"p99 {cp['wide_p99']:.2f} ms, write {cp['write'] / 1e3:.1f}k rec/s; hash tag p50 {cl['p50']:.3f} "
        f"p99 {cl['p99']:.3f} ms, with 10 neighbours p99 {cl['wide_p99']:.2f} ms, write {cl['write'] / 1e3:.1f}k rec/s",
    )


def print_sizes(stores: dict[str, OnlineStore], records: int) -> None:
    value = record_nbytes("float16", DIM)
    print(
        f"record: {value} B value (float16 x {DIM}; int8: {record_nbytes('int8', DIM)} B) + 16 B key (8 for user-level)"
    )
    lmdb_store = stores["lmdb"]
    if isinstance(lmdb_store, LmdbStore):
        size = os.path.getsize(os.path.join(lmdb_store.config.path, "data.mdb"))
        print(f"lmdb: {size / records:.0f} B per record on disk ({size / 2**20:.0f} MiB for {records})")
    for name in ("redis", "cluster", "cluster-pair"):
        store = stores[name]
        if isinstance(store, RedisStore | RedisClusterStore):
            print(f"{name}: {store.memory_per_record():.0f} B per record in memory (MEMORY USAGE, sampled)")


if __name__ == "__main__":
    main()
