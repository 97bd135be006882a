"""Transfer to downstream models: what a small ranker gains from the representations, and what it costs to serve.

(1) ``loopfm-on-kd``, the paper's measure (LoopFM, arXiv 2605.29280): on a world with a trained
GEM model, the transfer ratio TR = (AUC(variant) - AUC(ranker alone)) / (AUC(GEM) - AUC(ranker
alone)) of the ranker with LoopFM (the last 32 historical representations and the as-of
representations) on top of distillation, over TR of distillation alone (the paper reports about
2), with its 5th percentile over paired holdout resamples (goal: above 1). Two worlds, each with
its own trained model: the default one with the ranker's usual 32-event window, and one where the
signal lies further back (``generate --niche-affinity 16``) while the ranker's own window holds
only its last 8 events, as production rankers see. ``reps-instead-of-kd`` (the earlier headline:
the gain with the as-of representations over the gain with distillation, LoopFM *instead of*
KD) is printed for the default world. Baselines (the ranker alone, distillation) are trained in
the same run on the same rows.

(2) ``transfer-latency``: one 200-candidate request scored by the downstream ranker with its
store reads (LMDB, one round trip: the user-level record, the 200 pair records (~80% present) and
the user's context record, the precomputed window of the last 32 events and prefix counts written
by the same step as the representations), the fallback resolution and per-ad inputs, against
running the GEM-style model (default config, 256-token histories) live on the same request (the
history encoded once for the 200 ads, from the history index). Ratio = GEM p99 / downstream p99,
target 10. Also timed: the downstream request as before the context record (the window and counts
cut from the history index per request), and ``loopfm-serving``: the ranker that also reads the
user's last 32 historical representations (stored after the context in the same record, 4 KB
more; target attention from each of the 200 ads) against the snapshot ranker (target: at most
2x its p99) and against GEM live (target: at least 10x faster). Requests rotate over the legs so
load hits all alike.

QUICK=1: a planted-signal world (tests/model/toyworld.py) with a small trained model. Both: 200 requests
(with fewer, p99 is the slowest one, set by whatever else the machine runs).
Full: demo-sized generated worlds (20,000 users x 14 days) and the train command's defaults.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
import torch

from bench.common import QUICK, WORK, generate, result, untrained_model
from pipelines.durations import HOUR_MS
from pipelines.model import GemModel, HistoryIndex, ad_catalog, build_candidate_batch, load_model
from pipelines.model.context import decode_contexts, decode_sequences
from pipelines.model.inputs import AdLookup
from pipelines.model.train.data import load_features
from pipelines.schemas.layouts import representation_schema
from pipelines.similarity.policy import FallbackPath, ResolverConfig
from pipelines.store import LmdbConfig, LmdbStore, OnlineStore
from pipelines.transfer.asof import resolve_paths
from pipelines.transfer.compress import fit_codec, rep_block
from pipelines.transfer.context import context_inputs, request_inputs, write_user_contexts
from pipelines.transfer.data import VerticalSpec
from pipelines.transfer.downstream import DownstreamRanker, RankerConfig, inputs_from_batch, predict_ranker
from pipelines.transfer.experiment import TransferConfig, run_transfer
from pipelines.transfer.snapshots import RepFeatures
from pipelines.transfer.variants import VariantPlan

CANDIDATES = 200
SEQUENCE = 32
REQUESTS = 200
DIM = 64


def quick_world(root: Path) -> tuple[Path, Path]:
    from pipelines.model.config import GemConfig
    from pipelines.model.train.loop import TrainConfig, train_model
    from tests.model.toyworld import ToyWorld, make_world, write_features_dir

    features, model = root / "features", root / "model"
    if not (model / "model.pt").exists():
        shutil.rmtree(root, ignore_errors=True)
        histories, examples = make_world(ToyWorld(users=1500, days=6, mean_impressions=30, categories=16, seed=5))
        write_features_dir(features, histories, examples, shards=4)
        config = GemConfig(d_model=32, num_layers=2, max_len=64, block_size=32, representation_dim=DIM)
        train_model(features, model, config, TrainConfig(max_examples=6_000, max_holdout=3_000, progress=False))
    return features, model


def full_world(root: Path, seed: int = 7, niche: float = 0.0, train: bool = True) -> tuple[Path, Path]:
    """A demo-sized generated world's features and (with ``train``) its trained model, made once."""
    flags = ("--niche-affinity", str(niche)) if niche else ()
    events = generate(20_000, 14, root / f"events-20000x14-s{seed}.parquet", seed=seed, flags=flags)
    features, model = root / "features", root / "model"
    py = [sys.executable, "-m", "pipelines"]
    if not (features / "summary.json").exists():
        subprocess.run([*py, "features", "--input", str(events), "--output", str(features), "--overwrite"], check=True)
    if train and not (model / "model.pt").exists():
        subprocess.run([*py, "train", "--features", str(features), "--output", str(model), "--no-progress"], check=True)
    return features, model


def transfer_report(features: Path, model: Path, out: Path, vm_window: int = 32) -> dict:
    if QUICK:
        spec = VerticalSpec(max_train=2_500, max_validation=1_000, max_holdout=2_000)
        plan = VariantPlan(
            seeds=(0, 1), temperatures=(1.0, 2.0), distill_weights=(0.25, 0.5), ranker=RankerConfig(epochs=3)
        )
    else:
        spec = VerticalSpec(max_train=12_000, max_validation=4_000, max_holdout=8_000)
        plan = VariantPlan(seeds=(0, 1), ranker=RankerConfig(epochs=4))
    plan = replace(plan, progress=False, vm_window=vm_window)
    config = TransferConfig(str(features), str(model), str(out), vertical=spec, plan=plan, use_beam=not QUICK)
    return run_transfer(config)


def fill_store(
    store: OnlineStore, index: HistoryIndex, requests: list[tuple[int, np.ndarray]], now_ms: int, sequence: int = 0
) -> None:
    """User-level records, ~80% of each request's pairs and the users' contexts (followed by
    ``sequence`` historical representations when positive), computed an hour ago."""
    rng = np.random.default_rng(3)
    users, ads = [], []
    for user, ad_ids in requests:
        keep = rng.random(len(ad_ids)) < 0.8
        users += [user] * (1 + int(keep.sum()))
        ads += [None, *ad_ids[keep].tolist()]
    n = len(users)
    emb = rng.normal(size=n * DIM).astype(np.float16)
    times = pa.array(np.full(n, now_ms - HOUR_MS), pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    store.write_batch(
        pa.Table.from_arrays(
            [
                pa.array(users, pa.int64()),
                pa.array(ads, pa.int64()),
                pa.FixedSizeListArray.from_arrays(pa.array(emb, pa.float16()), DIM),
                pa.nulls(n, pa.float32()),
                pa.array(rng.random(n, dtype=np.float32)),
                pa.array(rng.random(n, dtype=np.float32) / 10),
                pa.array(["bench-transfer"] * n),
                times,
                times,
            ],
            schema=representation_schema(DIM),
        )
    )
    with_context = np.unique([u for u, _ in requests])
    seqs = rng.normal(size=(len(with_context), sequence, DIM)).astype(np.float32) if sequence else None
    write_user_contexts(store, index, with_context, now_ms - HOUR_MS, model_version="bench", sequences=seqs)


def request_table(user: int, ad_ids: np.ndarray, at_ms: int) -> pa.Table:
    return pa.table(
        {
            "user_id": pa.array([user], pa.int64()),
            "surface": pa.array([0], pa.int8()),
            "request_time": pa.array([at_ms], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "ad_ids": pa.array([ad_ids.tolist()], pa.list_(pa.int64())),
        }
    )


def downstream_request(
    store: OnlineStore,
    ranker: DownstreamRanker,
    index: HistoryIndex | None,
    catalog: AdLookup,
    req: pa.Table,
    policy: ResolverConfig,
    sequence: int = 0,
) -> np.ndarray:
    """Score one request: one store round trip (pairs, user-level record and, without ``index``, the
    user's context record), the fallbacks, the inputs, one ranker forward. With ``index``: the window
    and counts cut from the history index instead (the path before the context record). With
    ``sequence``: the context record also holds that many historical representations, read too."""
    user, ads = int(req.column("user_id")[0].as_py()), np.asarray(req.column("ad_ids")[0].as_py(), np.int64)
    read = store.read_for_request(user, ads, with_context=index is None)
    n = len(ads)
    user_vec = np.nan_to_num(read.user.embedding)[0]
    path = resolve_paths(
        policy,
        pair_found=read.pairs.found,
        pair_age_s=read.pairs.age_s,
        user_found=np.repeat(read.user.found, n),
        user_age_s=np.repeat(read.user.age_s, n),
    )
    pair = np.nan_to_num(read.pairs.embedding)
    pair[path == FallbackPath.SAME_USER] = user_vec  # the user-level rep fills the pair slot
    feats = RepFeatures(np.tile(user_vec, (n, 1)), pair, path, np.repeat(read.user.age_s, n), read.pairs.age_s)
    seq = None
    if index is None:
        assert read.context is not None
        shape = (sequence, DIM)
        context = decode_contexts([read.context.payload], sequence=shape)[0] if read.context.found else None
        if sequence:
            found = read.context.found
            seq = decode_sequences([read.context.payload], *shape) if found else np.zeros((1, *shape), np.float32)
        at_ms = int(req.column("request_time").cast(pa.int64())[0].as_py())
        x = context_inputs(context, ads, catalog, surface=int(req.column("surface")[0].as_py()), request_ms=at_ms)
    else:
        x = request_inputs(index, req, catalog)  # the user's last 32 events cut once for the 200 ads
    return predict_ranker(ranker, x, rep_block(feats, fit_codec("float16", feats)), seq)


def latency(features: Path, root: Path) -> dict[str, float]:
    histories, _ = load_features(features)
    index = HistoryIndex(histories)
    catalog = ad_catalog(index)
    lookup = AdLookup.from_table(catalog)  # prepared once, as a server would
    gem: GemModel = load_model(untrained_model(root / "gem-default"), device="cpu")
    torch.manual_seed(0)
    rep_dim = 2 * DIM + 5 + 2
    probe = request_table(int(index.user_ids[0]), catalog.column("item_id").to_numpy()[:2], 0)
    x_probe = inputs_from_batch(build_candidate_batch(index, probe, max_len=32, catalog=catalog))
    ranker = DownstreamRanker(RankerConfig(), dense_dim=x_probe.dense.shape[1], rep_dim=rep_dim).eval()
    seq_ranker = DownstreamRanker(RankerConfig(), x_probe.dense.shape[1], rep_dim=rep_dim, seq_dim=DIM).eval()
    rng = np.random.default_rng(0)
    has = np.flatnonzero(np.diff(index.offsets) > 0)
    now_ms = int(time.time() * 1000)
    ad_pool = catalog.column("item_id").to_numpy()
    requests = [
        (int(index.user_ids[rng.choice(has)]), rng.choice(ad_pool, CANDIDATES, replace=len(ad_pool) < CANDIDATES))
        for _ in range(REQUESTS)
    ]
    for name in ("store", "store-seq"):
        shutil.rmtree(root / name, ignore_errors=True)
    policy = ResolverConfig(max_age_s=6 * 3600, fallback_max_age_s=7 * 86400)
    legs = ["downstream", "downstream_index", "downstream_seq", "gem"]
    times: dict[str, list[float]] = {name: [] for name in legs}
    with LmdbStore(LmdbConfig(str(root / "store"))) as store, LmdbStore(LmdbConfig(str(root / "store-seq"))) as seqs:
        fill_store(store, index, requests, now_ms)
        fill_store(seqs, index, requests, now_ms, sequence=SEQUENCE)
        for i, (user, ads) in enumerate([requests[0], *requests]):  # the first one warms up, unrecorded
            req = request_table(user, ads, now_ms)
            for name in legs[i % len(legs) :] + legs[: i % len(legs)]:
                start = time.perf_counter()
                if name == "gem":
                    gem.represent(build_candidate_batch(index, req, max_len=gem.config.max_len, catalog=catalog))
                elif name == "downstream_seq":
                    downstream_request(seqs, seq_ranker, None, lookup, req, policy, sequence=SEQUENCE)
                else:
                    downstream_request(
                        store, ranker, index if name == "downstream_index" else None, lookup, req, policy
                    )
                if i:
                    times[name].append(time.perf_counter() - start)
    return {
        f"{k}_{q}": float(np.quantile(v, p)) * 1000 for k, v in times.items() for q, p in (("p50", 0.5), ("p99", 0.99))
    }


def print_loopfm(report: dict, world: str) -> None:
    loop = report["loopfm"]
    print(
        f"[{world}] FM gain {loop['fm_gain']:+.4f} [{loop['fm_gain_p05']:+.4f}, {loop['fm_gain_p95']:+.4f}] "
        f"(GEM AUC {report['gem_live']['auc']:.4f}); sequence reader: {report['sequence_reader'].get('mode')}"
    )
    for paper, tr in loop["transfer_ratio"].items():
        v = report["variants"][tr["variant"]]
        print(
            f"[{world}] TR {paper:<19} {tr['tr']:6.2f} [{tr['tr_p05']:6.2f}, {tr['tr_p95']:6.2f}]  "
            f"({tr['variant']}: AUC {v['auc']:.4f}, gain {v['auc_gain']:+.4f})"
        )
    result(
        "loopfm-on-kd",
        float(report["loopfm_on_kd"]),
        2,
        f"world={world} TR(KD + LoopFM) / TR(KD), p05 {report['loopfm_on_kd_p05']:.2f} "
        f"(TR KD {loop['transfer_ratio']['kd']['tr']:.2f}, KD + LoopFM "
        f"{loop['transfer_ratio'].get('kd_loopfm', loop['transfer_ratio']['kd_loopfm_snapshot'])['tr']:.2f})",
    )


def print_latency(lat: dict[str, float]) -> None:
    print(
        "200-candidate request: downstream (one store read with the context record + fallbacks + ranker) "
        f"p50 {lat['downstream_p50']:.2f} ms p99 {lat['downstream_p99']:.2f} ms; "
        f"before (window and counts cut from the history index) p50 {lat['downstream_index_p50']:.2f} ms "
        f"p99 {lat['downstream_index_p99']:.2f} ms; GEM live p50 {lat['gem_p50']:.2f} ms p99 {lat['gem_p99']:.2f} ms"
    )


def latency_results(lat: dict[str, float]) -> None:
    result(
        "transfer-latency",
        lat["gem_p99"] / lat["downstream_p99"],
        10,
        f"GEM live p99 {lat['gem_p99']:.2f} ms / downstream p99 {lat['downstream_p99']:.2f} ms (200 candidates; "
        f"before the context record: {lat['gem_p99'] / lat['downstream_index_p99']:.2f}x; at p50: "
        f"{lat['gem_p50'] / lat['downstream_p50']:.2f}x, before {lat['gem_p50'] / lat['downstream_index_p50']:.2f}x)",
    )
    result(
        "loopfm-serving",
        2 * lat["downstream_p99"] / lat["downstream_seq_p99"],
        1,
        f"ranker with a {SEQUENCE}-long representation sequence p99 {lat['downstream_seq_p99']:.2f} ms vs the "
        f"snapshot ranker {lat['downstream_p99']:.2f} ms (bound 2x; "
        f"{lat['downstream_seq_p99'] / lat['downstream_p99']:.2f}x); GEM live is "
        f"{lat['gem_p99'] / lat['downstream_seq_p99']:.1f}x slower (target >= 10x)",
    )


def main() -> None:
    torch.set_num_threads(1)
    root = WORK / ("transfer-quick" if QUICK else "transfer")
    root.mkdir(parents=True, exist_ok=True)
    if QUICK:
        short = transfer_report(*quick_world(root), root / "report-window4", vm_window=4)
    else:
        niche = WORK / "transfer-niche"
        short = transfer_report(*full_world(niche, seed=13, niche=16.0), niche / "report", vm_window=8)
    print_loopfm(short, "niche-window8" if not QUICK else "planted-window4")
    features, model = quick_world(root) if QUICK else full_world(root)
    lat = latency(features, root)
    print_latency(lat)
    report = transfer_report(features, model, root / "report")
    print_loopfm(report, "default-window32" if not QUICK else "planted-window32")
    v = report["variants"]
    for name in ("distilled", "reps", "reps_int8", "reps_pca16", "reps_distilled", "reps_similar", "seq", "seq_reps"):
        print(
            f"{name:<15} AUC {v[name]['auc']:.4f} gain {v[name]['auc_gain']:+.4f} "
            f"[{v[name]['auc_gain_p05']:+.4f}, {v[name]['auc_gain_p95']:+.4f}]"
        )
    print(report["verdict"])
    print(f"holdout rows per fallback path: main {report['paths']['main']}; similar {report['paths']['similar']}")
    result(
        "reps-instead-of-kd",
        float(report["reps_instead_of_kd"]),
        1,
        f"gain with the as-of representations / gain with distillation (LoopFM instead of KD; p05 "
        f"{report['reps_instead_of_kd_p05']:.2f}; alone AUC {v['alone']['auc']:.4f})",
    )
    latency_results(lat)


if __name__ == "__main__":
    main()
