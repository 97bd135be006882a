"""Precompute throughput: Beam RunInference vs a plain Python loop; token-budget vs fixed-count batching;
the refresh process's FLOP/s.

Same world, same model, same requests. (1) The Beam pipeline (local runner) against
the same model called in a plain loop over the same inputs (target ≥ 0.8: Beam's
overhead at most 20%). (2) In the plain loop, batches formed by a token budget
against batches of a fixed request count sized so the worst batch fits the same
token budget (the memory bound a fixed count must respect on a skewed length mix);
target ≥ 1.5. (3) The streaming refresh's inference (:class:`Refresher`: a flush of
users with their recent candidate sets, and one candidate set as Solaris computes it):
achieved FLOP/s (torch's counter) against this machine's fp32 matmul peak, with target
attention run once per shared history (the default) and on each row's copy of it (the
reference path), alternated; printed, no RESULT line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

from bench.common import QUICK, WORK, flops_of, matmul_peak, result, timed, untrained_model
from pipelines.cli import main as cli
from pipelines.model import GemBatch, GemModel, HistoryIndex, ad_catalog, load_model
from pipelines.precompute.batching import batch_tokens
from pipelines.precompute.handler import GemModelHandler
from pipelines.precompute.pipeline import PrecomputeConfig, run_precompute
from pipelines.precompute.refresh import RecentCandidates, Refresher
from pipelines.precompute.requests import request_elements
from pipelines.runners import pipeline_options, runner_for

BUDGET = 32_768
REPEAT = 1 if QUICK else 3
#: Users in the refresh bench's flush, and timed rounds of each refresh workload.
FLUSH_USERS, REFRESH_ROUNDS = (100, 3) if QUICK else (400, 7)


def world(root: Path, users: int, requests: int) -> None:
    """Generated events and features (reused across runs) and a fresh untrained model of the current code."""
    untrained_model(root / "model")
    if (root / "features" / "summary.json").exists():
        return
    cli(
        [
            "generate",
            "--users",
            str(users),
            "--days",
            "14",
            "--seed",
            "21",
            "--output",
            str(root / "events.parquet"),
            "--candidates-output",
            str(root / "candidates.parquet"),
            "--requests",
            str(requests),
        ]
    )
    cli(["features", "--input", str(root / "events.parquet"), "--output", str(root / "features"), "--overwrite"])


def elements(root: Path, max_len: int) -> list[GemBatch]:
    histories = ds.dataset(root / "features" / "histories", format="parquet", partitioning="hive").to_table()
    index = HistoryIndex(histories)
    return [
        b
        for _, b in request_elements(
            index, pq.read_table(root / "candidates.parquet"), max_len=max_len, catalog=ad_catalog(index)
        )
    ]


def by_tokens(batches: list[GemBatch], budget: int) -> list[list[GemBatch]]:
    groups: list[list[GemBatch]] = []
    current: list[GemBatch] = []
    size = 0
    for b in batches:
        if current and size + batch_tokens(b) > budget:
            groups.append(current)
            current, size = [], 0
        current.append(b)
        size += batch_tokens(b)
    return [*groups, current] if current else groups


def by_count(batches: list[GemBatch], n: int) -> list[list[GemBatch]]:
    return [batches[i : i + n] for i in range(0, len(batches), n)]


def loop(model: GemModel, groups: list[list[GemBatch]]) -> int:
    """Pairs represented by the handler over ``groups``, one inference call per group (no Beam)."""
    handler = GemModelHandler("unused")
    # Each result's inference is (representations, request_ms): see GemModelHandler.run_inference.
    return sum(cast(tuple, r.inference)[0].user_id.size for g in groups for r in handler.run_inference(g, model))


def refresh_workloads(root: Path, refresher: Refresher) -> dict[str, Callable[[], pa.Table]]:
    """The refresh process's two calls: a flush of users (user rows and their latest candidate
    sets' pairs) and Solaris' one candidate set (the request closest to 200 ads)."""
    histories = ds.dataset(root / "features" / "histories", format="parquet", partitioning="hive").to_table()
    candidates = pq.read_table(root / "candidates.parquet")
    flush = histories.slice(0, FLUSH_USERS)
    sizes = pc.list_value_length(candidates.column("ad_ids")).to_numpy()
    row = int(np.argmin(np.abs(sizes - 200)))
    request = candidates.slice(row, 1)
    user = histories.filter(pc.equal(histories.column("user_id"), request.column("user_id")[0]))
    return {
        f"flush of {flush.num_rows} users": lambda: refresher.refresh(flush, computed_at_ms=0),
        f"candidate set of {sizes[row]} ads": lambda: refresher.pairs(user, request, computed_at_ms=0),
    }


def bench_refresh(root: Path, model: GemModel) -> None:
    """Achieved FLOP/s of the refresh workloads vs the fp32 matmul peak, per target-attention path
    (each path's own FLOPs: the shared one does less work for the same output)."""
    peak = matmul_peak(torch.device("cpu"))
    model.requires_grad_(
        False
    )  # the FLOP counter's module hooks fail on parameters that need grad under inference_mode
    candidates = RecentCandidates.from_table(pq.read_table(root / "candidates.parquet"), ttl_s=1e9)
    refresher = Refresher(model, model.model_version, candidates=candidates)
    paths = {"shared": True, "reference": False}
    for name, call in refresh_workloads(root, refresher).items():
        flops: dict[str, int] = {}
        seconds: dict[str, list[float]] = {p: [] for p in paths}
        for path, flag in paths.items():
            model.shared_target_attention = flag
            table, flops[path] = flops_of(call)
        for _ in range(REFRESH_ROUNDS):  # alternated: load on a shared machine comes and goes
            for path, flag in paths.items():
                model.shared_target_attention = flag
                seconds[path].append(timed(call)[1])
        model.shared_target_attention = True
        for path in paths:
            s = np.array(seconds[path])
            med = float(np.median(s))
            print(
                f"refresh, {name} ({table.num_rows} rows), {path} target attention: {med * 1e3:.1f} ms "
                f"(median of {len(s)}, {s.min() * 1e3:.1f}-{s.max() * 1e3:.1f}), {flops[path] / 1e9:.2f} GFLOP, "
                f"{flops[path] / med / 1e9:.2f} GFLOP/s = {flops[path] / med / peak:.1%} of peak"
            )
    print(f"fp32 matmul peak (torch.mm 2048^2, {torch.get_num_threads()} thread(s)): {peak / 1e9:.1f} GFLOP/s")


def main() -> None:
    # One thread by default (as bench/model.py): on a few shared cores a second OpenMP thread
    # mostly spin-waits against other work; the Beam run is in this process and uses the same setting.
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    users, requests = (1_500, 150) if QUICK else (6_000, 2_400)
    root = WORK / f"precompute-{users}u-{requests}r"
    world(root, users, requests)
    model = load_model(root / "model", device="cpu")
    batches = elements(root, model.config.max_len)
    pairs = sum(b.num_rows for b in batches)
    tokens = np.array([batch_tokens(b) for b in batches])
    print(
        f"requests {len(batches)}  pairs {pairs}  tokens per request p50={np.median(tokens):.0f} "
        f"p99={np.percentile(tokens, 99):.0f} max={tokens.max()}"
    )
    bench_refresh(root, model)
    if os.environ.get("BENCH_ONLY") == "refresh":
        return
    loop(model, by_tokens(batches[:20], BUDGET))  # warm-up
    fixed = max(1, BUDGET // int(tokens.max()))
    args = argparse.Namespace(runner="DirectRunner", direct_running_mode=None, direct_num_workers=None)
    out = root / "beam-out"
    config = PrecomputeConfig(
        features=str(root / "features"),
        candidates=[str(root / "candidates.parquet")],
        model=str(root / "model"),
        output=str(out),
        token_budget=BUDGET,
        device="cpu",
    )

    def beam_run() -> dict:
        shutil.rmtree(out, ignore_errors=True)
        return run_precompute(config, pipeline_options(args), runner_for(args))

    # Alternate the three REPEAT times; medians, with the spread: load on a shared machine comes and goes.
    runs: dict[str, list[float]] = {"tokens": [], "beam": [], "count": []}
    for _ in range(REPEAT):
        n_tok, seconds = timed(lambda: loop(model, by_tokens(batches, BUDGET)))
        runs["tokens"].append(seconds)
        summary, seconds = timed(beam_run)
        runs["beam"].append(seconds)
        n_cnt, seconds = timed(lambda: loop(model, by_count(batches, fixed)))
        runs["count"].append(seconds)
    assert n_tok == n_cnt == pairs == summary["pairs_in"]
    tok_s, beam_s, cnt_s = (float(np.median(runs[k])) for k in ("tokens", "beam", "count"))
    # the ratios pair each round's runs (taken minutes apart at most), then take the median
    beam_ratio = float(np.median(np.array(runs["tokens"]) / np.array(runs["beam"])))
    batching_ratio = float(np.median(np.array(runs["count"]) / np.array(runs["tokens"])))

    def spread(key: str) -> str:
        return f"(median of {len(runs[key])}: {min(runs[key]):.2f}-{max(runs[key]):.2f} s)"

    print(
        f"plain loop, token budget {BUDGET}: {tok_s:.2f} s {spread('tokens')}  {pairs / tok_s:.0f} pairs/s  "
        f"{tokens.sum() / tok_s:.0f} tokens/s  {len(batches) / tok_s:.1f} requests/s"
    )
    print(
        f"plain loop, fixed count {fixed} request(s)/batch: {cnt_s:.2f} s {spread('count')}  "
        f"{pairs / cnt_s:.0f} pairs/s"
    )
    print(
        f"beam RunInference (local runner): {beam_s:.2f} s {spread('beam')}  {pairs / beam_s:.0f} pairs/s "
        f"(includes pipeline start, joins and Parquet writes)"
    )
    result(
        "precompute-batching",
        batching_ratio,
        1.5,
        f"token-budget {pairs / tok_s:.0f} pairs/s vs fixed-count({fixed}) {pairs / cnt_s:.0f} pairs/s",
    )
    result(
        "precompute",
        beam_ratio,
        0.8,
        f"beam {pairs / beam_s:.0f} pairs/s vs plain loop {pairs / tok_s:.0f} pairs/s on {pairs} pairs "
        f"(ratio per round {', '.join(f'{t / b:.3f}' for t, b in zip(runs['tokens'], runs['beam'], strict=True))})",
    )


if __name__ == "__main__":
    main()
