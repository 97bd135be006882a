"""Features pipeline (Beam, local runner) vs the same history build directly in Polars.

Both read the same generated Parquet events and write histories and training
examples as Parquet; events/s for each, ratio = Beam / Polars (target 0.7).
Each is run REPEAT times alternately (the machine is shared and noisy); the
best run of each counts, and every run is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import polars as pl

from bench.common import QUICK, WORK, generate, result, timed
from pipelines.features.histories import build_histories
from pipelines.features.pipeline import FeaturesConfig, run_features
from pipelines.io.parquet import write_table
from pipelines.runners import pipeline_options, runner_for
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE

REPEAT = 1 if QUICK else 3


def polars_baseline(events_path: str, out: str) -> int:
    events = pl.read_parquet(events_path).to_arrow()
    build = build_histories(events)
    write_table(build.histories, f"{out}/histories.parquet", HISTORY)
    write_table(build.examples, f"{out}/training_examples.parquet", TRAINING_EXAMPLE)
    return events.num_rows


def beam_run(events_path: str, out: str, mode: str, workers: int, shards: int) -> dict:
    args = argparse.Namespace(runner="DirectRunner", direct_running_mode=mode, direct_num_workers=workers)
    config = FeaturesConfig(inputs=[events_path], output=out, num_shards=shards, overwrite=True)
    return run_features(config, pipeline_options(args), runner_for(args))


def main() -> None:
    users = 4_000 if QUICK else 40_000
    events_path = str(generate(users, 14, WORK / f"features-{users}u" / "events.parquet"))
    mode = os.environ.get("BENCH_RUNNING_MODE", "in_memory")
    workers = int(os.environ.get("BENCH_WORKERS", "1"))
    shards = int(os.environ.get("BENCH_SHARDS", "16"))
    polars_times, beam_times = [], []
    for attempt in range(REPEAT):
        shutil.rmtree(WORK / "features-out", ignore_errors=True)
        n, polars_s = timed(lambda: polars_baseline(events_path, str(WORK / "features-out" / "polars")))
        summary, beam_s = timed(
            lambda: beam_run(events_path, str(WORK / "features-out" / "beam"), mode, workers, shards)
        )
        assert summary["events_valid"] + summary["duplicates"] == n, "Beam lost or invented events"
        polars_times.append(polars_s)
        beam_times.append(beam_s)
        print(f"run {attempt + 1}/{REPEAT}: polars {polars_s:.2f} s  beam {beam_s:.2f} s", flush=True)
    polars_rate, beam_rate = n / min(polars_times), n / min(beam_times)
    print(f"events: {n}  users: {summary['histories']}  training examples: {summary['training_examples']}")
    print(f"polars baseline (best of {REPEAT}): {min(polars_times):.2f} s  {polars_rate / 1e3:.0f} k events/s")
    print(
        f"beam ({mode}, {workers} worker(s), {shards} shards, best of {REPEAT}): "
        f"{min(beam_times):.2f} s  {beam_rate / 1e3:.0f} k events/s"
    )
    result(
        "features",
        beam_rate / polars_rate,
        0.7,
        f"beam {beam_rate / 1e3:.0f}k ev/s vs polars {polars_rate / 1e3:.0f}k ev/s on {n} events",
    )


if __name__ == "__main__":
    main()
