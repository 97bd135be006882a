"""The features pipeline on every engine, one run each: DirectRunner, Flink at parallelism 1 and 2,
Spark local[2], against the same history build in Polars.

Events: 2M generated (QUICK: ~200k), the Parquet file bench/features.py uses. Each Beam run is a
``python -m pipelines features`` process; its rate counts the summary's ``seconds`` (pipeline
construction to outputs checked: on Flink and Spark that includes starting the job server, staging,
translation and submission). Before the big runs, a tiny job on Flink (~1k events) measures the
fixed cost of a job, and the Flink REST API gives each job's time on the cluster and its slowest
operators, so the report says where Flink's time goes. Flink jobs are plain ``--runner FlinkRunner``
runs: the cluster's standing job server submits them and its SDK worker pool runs the Python work
(``--environment_type EXTERNAL``; BENCH_FLINK_ENV=LOOPBACK runs it in the submitting process).

Prints events/s of each, then ``RESULT flink-scaling ratio=<(rate p2 / rate p1) / 2> target=0.8``
and ``RESULT flink-vs-direct ratio=<rate p2 / rate direct> target=1.0``. An engine whose parts are
missing (``make flink-up`` not run, no Spark job server jar: ``make spark-jobserver``) is skipped
with a ``SKIP <name> <why>`` line, and what was measured is still reported; BENCH_SPARK=0 skips Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import QUICK, ROOT, WORK, generate, result, timed
from bench.features import polars_baseline
from bench.flink_parts import flink_missing, spark_missing

FLINK_REST = "http://127.0.0.1:8081"
FAST = "--experiments=disable_logging_submission_environment"
SHARDS = 16


def flink_env() -> list[str]:
    """Beam flags for the Flink runs: the cluster's worker pool (the default), or LOOPBACK."""
    if os.environ.get("BENCH_FLINK_ENV", "EXTERNAL").upper() == "LOOPBACK":
        return ["--environment_type=LOOPBACK"]
    return []


def features(events: str, out: Path, runner: Sequence[str]) -> dict[str, Any]:
    """One ``features`` process; its summary (``seconds`` = construction to checked outputs)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines", "features", "--input", events, "--output", str(out)]
    cmd += ["--num-shards", str(SHARDS), *runner]
    done, wall = timed(
        lambda: subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    )
    stdout = done.stdout
    summary, _ = json.JSONDecoder().raw_decode(stdout[stdout.index("{") :])  # the command prints its summary
    summary["process_seconds"] = round(wall, 1)
    return summary


def _get(path: str) -> Any:
    with urllib.request.urlopen(f"{FLINK_REST}{path}", timeout=10) as response:
        return json.load(response)


def flink_job_since(started_ms: int) -> dict[str, Any] | None:
    """The cluster's view of the job submitted after ``started_ms``: duration and slowest operators."""
    jobs = [j for j in _get("/jobs/overview")["jobs"] if j["start-time"] >= started_ms]
    if not jobs:
        return None
    job = _get(f"/jobs/{max(jobs, key=lambda j: j['start-time'])['jid']}")
    vertices = sorted(job["vertices"], key=lambda v: -v["duration"])
    return {
        "cluster_s": job["duration"] / 1000,
        "submitted_after_s": (job["start-time"] - started_ms) / 1000,
        "operators": [(v["duration"] / 1000, v["parallelism"], v["name"][:90]) for v in vertices[:4]],
    }


def flink_run(events: str, out: Path, parallelism: int, env: list[str]) -> tuple[dict[str, Any], dict | None]:
    started = int(time.time() * 1000)
    flink = ["--runner", "FlinkRunner", "--flink_master", "127.0.0.1:8081", f"--parallelism={parallelism}"]
    summary = features(events, out, [*flink, *env, FAST])
    return summary, flink_job_since(started)


def _report(name: str, n: int, summary: dict[str, Any], job: dict | None = None) -> float:
    rate = n / summary["seconds"]
    process = summary["process_seconds"]
    print(f"{name:<22} {summary['seconds']:8.1f} s  {rate / 1e3:8.1f} k events/s  (process {process} s)", flush=True)
    if job:
        print(
            f"{'':<22} on the cluster {job['cluster_s']:.1f} s; submitted {job['submitted_after_s']:.1f} s after the "
            f"process started; client-side rest {summary['seconds'] - job['cluster_s']:.1f} s"
        )
        for seconds, par, op in job["operators"]:
            print(f"{'':<24} {seconds:7.1f} s  x{par}  {op}")
    return rate


def main() -> None:
    users = 4_000 if QUICK else 40_000
    events = str(generate(users, 14, WORK / f"features-{users}u" / "events.parquet"))
    tiny = str(generate(20, 14, WORK / "features-20u" / "events.parquet"))
    out = WORK / "runners-out"
    n, polars_s = timed(lambda: polars_baseline(events, str(out / "polars")))
    print(f"{'polars':<22} {polars_s:8.1f} s  {n / polars_s / 1e3:8.1f} k events/s  ({n} events)", flush=True)
    direct = features(events, out / "direct", ["--runner", "DirectRunner"])
    assert direct["events_valid"] + direct["duplicates"] == n, "Beam lost or invented events"
    direct_rate = _report("direct (in_memory)", n, direct)
    missing = flink_missing()
    if missing:
        print(f"SKIP flink-scaling {missing}")
        print(f"SKIP flink-vs-direct {missing}")
    else:
        _flink(events, tiny, n, out, direct, direct_rate, polars_s)
    why = "BENCH_SPARK=0" if os.environ.get("BENCH_SPARK", "1") == "0" else spark_missing()
    if why:
        print(f"SKIP runners-spark {why}")
    else:
        spark = features(events, out / "spark", ["--runner", "SparkRunner", "--spark_master_url", "local[2]", FAST])
        _report("spark local[2]", n, spark)


def _flink(
    events: str, tiny: str, n: int, out: Path, direct: dict[str, Any], direct_rate: float, polars_s: float
) -> None:
    env = flink_env()
    small, small_job = flink_run(tiny, out / "flink-tiny", 2, env)
    _report(f"flink p2, {small['records_in']} events", small["records_in"], small, small_job)
    p1, job1 = flink_run(events, out / "flink-p1", 1, env)
    rate1 = _report("flink p1", n, p1, job1)
    p2, job2 = flink_run(events, out / "flink-p2", 2, env)
    rate2 = _report("flink p2", n, p2, job2)
    for summary in (p1, p2):
        assert (summary["histories"], summary["events_valid"]) == (direct["histories"], direct["events_valid"])
    print(f"fixed cost of a Flink job (tiny input, first job: cold workers): {small['seconds']:.1f} s")
    cluster = [n / job["cluster_s"] if job else float("nan") for job in (job1, job2)]
    print(
        f"on the cluster only (no submission): p1 {cluster[0] / 1e3:.1f}k ev/s, p2 {cluster[1] / 1e3:.1f}k ev/s, "
        f"scaling {cluster[1] / cluster[0] / 2:.2f}"
    )
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    result(
        "flink-scaling",
        rate2 / rate1 / 2,
        0.8,
        f"p1 {rate1 / 1e3:.1f}k ev/s, p2 {rate2 / 1e3:.1f}k ev/s on {n}; load average {load}",
    )
    result(
        "flink-vs-direct",
        rate2 / direct_rate,
        1.0,
        f"flink p2 {rate2 / 1e3:.1f}k ev/s vs direct {direct_rate / 1e3:.1f}k ev/s (polars {n / polars_s / 1e3:.0f}k); "
        f"load average {load}",
    )


if __name__ == "__main__":
    main()
