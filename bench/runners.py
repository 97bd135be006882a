"""The features pipeline on every engine: DirectRunner, Flink at parallelism 1 and 2, Spark
local[2], against the same history build in Polars.

Events: 2M generated (QUICK: ~200k), the Parquet file bench/features.py uses, and a tenth of it.
Each Beam run is a ``python -m pipelines features`` process; its time is the summary's ``seconds``
(pipeline construction to outputs checked: on Flink that includes submission, translation, task
deployment and the SDK workers' start). The steady-state rate excludes that fixed cost: each engine
runs both sizes, and its rate is the added events over the added seconds,
``(n_big - n_small) / (s_big - s_small)``; whole-run rates are printed beside it. Before the runs, a
tiny job on Flink (~1k events) warms the workers and shows the fixed cost of a job; the Flink REST
API gives each job's time on the cluster and its slowest operators, so the report says where Flink's
time goes. Flink jobs are plain ``--runner FlinkRunner`` runs: the cluster's standing job server
submits them and its SDK worker pool runs the Python work (``--environment_type EXTERNAL``;
BENCH_FLINK_ENV=LOOPBACK runs it in the submitting process).

Prints events/s of each, then ``RESULT flink-scaling ratio=<(steady p2 / steady p1) / 2> target=0.8``
and ``RESULT flink-vs-direct ratio=<steady p2 / steady direct> target=1.0``. An engine whose parts
are missing (``make flink-up`` not run, no Spark job server jar: ``make spark-jobserver``) is skipped
with a ``SKIP <name> <why>`` line, and what was measured is still reported; BENCH_SPARK=0 skips Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import QUICK, ROOT, WORK, generate, result, timed
from bench.features import polars_baseline
from bench.flink_parts import flink_missing, spark_missing

FLINK_REST = "http://127.0.0.1:8081"
FAST = "--experiments=disable_logging_submission_environment"
SHARDS = 16
REPEATS = 1 if QUICK else 3  # Flink runs per size and parallelism: the fixed cost is noisy


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


@dataclass(frozen=True)
class Sized:
    """One engine's runs at two input sizes: (events, seconds) each."""

    small: tuple[int, float]
    big: tuple[int, float]

    @property
    def steady(self) -> float:
        """Events per second of the added input: the fixed cost of a job cancels out."""
        return steady_rate(self.small, self.big)


def steady_rate(small: tuple[int, float], big: tuple[int, float]) -> float:
    """``(n_big - n_small) / (s_big - s_small)``; refused when the bigger run was not slower."""
    (n0, s0), (n1, s1) = small, big
    if n1 <= n0 or s1 <= s0:
        raise ValueError(f"the bigger input must take longer: {n0} events in {s0} s, {n1} in {s1} s")
    return (n1 - n0) / (s1 - s0)


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


def _sized(name: str, runs: dict[str, tuple[int, list[float]]]) -> Sized | None:
    """The median seconds of each size's runs; None (with a line saying why) when the fixed cost's
    noise exceeds the added input's work, as it can on QUICK's small inputs."""
    sized = Sized(*((n, statistics.median(seconds)) for n, seconds in (runs["small"], runs["big"])))
    try:
        steady = sized.steady
    except ValueError as e:
        print(f"{name:<22} steady rate not measured: {e}")
        return None
    print(f"{name:<22} steady {steady / 1e3:8.1f} k events/s  (whole run {sized.big[0] / sized.big[1] / 1e3:.1f}k)")
    return sized


def main() -> None:
    users = 4_000 if QUICK else 40_000
    sizes = {
        "small": str(generate(users // 10, 14, WORK / f"features-{users // 10}u" / "events.parquet")),
        "big": str(generate(users, 14, WORK / f"features-{users}u" / "events.parquet")),
    }
    tiny = str(generate(20, 14, WORK / "features-20u" / "events.parquet"))
    out = WORK / "runners-out"
    n, polars_s = timed(lambda: polars_baseline(sizes["big"], str(out / "polars")))
    print(f"{'polars':<22} {polars_s:8.1f} s  {n / polars_s / 1e3:8.1f} k events/s  ({n} events)", flush=True)
    direct: dict[str, dict[str, Any]] = {}
    for size, path in sizes.items():
        direct[size] = features(path, out / f"direct-{size}", ["--runner", "DirectRunner"])
        _report(f"direct {size}", direct[size]["records_in"], direct[size])
    assert direct["big"]["events_valid"] + direct["big"]["duplicates"] == n, "Beam lost or invented events"
    direct_sized = _sized("direct (in_memory)", {k: (v["records_in"], [v["seconds"]]) for k, v in direct.items()})
    missing = flink_missing()
    if missing:
        print(f"SKIP flink-scaling {missing}")
        print(f"SKIP flink-vs-direct {missing}")
    else:
        _flink(sizes, tiny, out, direct, direct_sized, n / polars_s)
    why = "BENCH_SPARK=0" if os.environ.get("BENCH_SPARK", "1") == "0" else spark_missing()
    if why:
        print(f"SKIP runners-spark {why}")
    else:
        spark = features(
            sizes["big"], out / "spark", ["--runner", "SparkRunner", "--spark_master_url", "local[2]", FAST]
        )
        _report("spark local[2]", n, spark)


def _flink(
    sizes: dict[str, str],
    tiny: str,
    out: Path,
    direct: dict[str, dict[str, Any]],
    direct_sized: Sized | None,
    polars: float,
) -> None:
    env = flink_env()
    small, small_job = flink_run(tiny, out / "flink-tiny", 2, env)
    _report(f"flink p2, {small['records_in']} events", small["records_in"], small, small_job)
    print(f"fixed cost of a Flink job (tiny input, first job: cold workers): {small['seconds']:.1f} s")
    sized = {}
    for parallelism in (1, 2):
        runs: dict[str, tuple[int, list[float]]] = {}
        on_cluster: dict[str, tuple[int, list[float]]] = {}
        for size, path in sizes.items():
            for _ in range(REPEATS):
                summary, job = flink_run(path, out / f"flink-p{parallelism}-{size}", parallelism, env)
                expected = direct[size]
                assert (summary["histories"], summary["events_valid"]) == (
                    expected["histories"],
                    expected["events_valid"],
                )
                _report(f"flink p{parallelism} {size}", summary["records_in"], summary, job)
                runs.setdefault(size, (summary["records_in"], []))[1].append(summary["seconds"])
                if job:
                    on_cluster.setdefault(size, (summary["records_in"], []))[1].append(job["cluster_s"])
        sized[parallelism] = _sized(f"flink p{parallelism}", runs)
        if len(on_cluster) == 2:
            _sized("  on the cluster's clock", on_cluster)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    p1, p2 = sized[1], sized[2]
    if p1 is None or p2 is None or direct_sized is None:
        print("SKIP flink-scaling the steady rates were not measured (inputs too small for the fixed cost's noise)")
        print(f"SKIP flink-vs-direct the steady rates were not measured; load average {load}")
        return
    n = p2.big[0]
    whole = f"whole run p2 {n / p2.big[1] / 1e3:.1f}k, p1 {n / p1.big[1] / 1e3:.1f}k"
    result(
        "flink-scaling",
        p2.steady / p1.steady / 2,
        0.8,
        f"steady p1 {p1.steady / 1e3:.1f}k ev/s, p2 {p2.steady / 1e3:.1f}k ev/s ({whole}; median of {REPEATS} runs "
        f"per size) on {n}; load average {load}",
    )
    result(
        "flink-vs-direct",
        p2.steady / direct_sized.steady,
        1.0,
        f"steady flink p2 {p2.steady / 1e3:.1f}k ev/s vs direct {direct_sized.steady / 1e3:.1f}k ev/s "
        f"(whole run {n / direct_sized.big[1] / 1e3:.1f}k; polars {polars / 1e3:.0f}k); load average {load}",
    )


if __name__ == "__main__":
    main()
