"""The fixed cost of a Flink job: a 200-user ``features`` job, submit to done, on the local cluster
(``make flink-up``: its standing job server submits, its SDK worker pool runs the Python work)
against the DirectRunner on the same input.

Each run is a ``python -m pipelines features`` process timed from its start to its exit (the
submitter's Python start and imports included: what a user waits for). One Flink job first warms
the cluster (class loading, the first worker processes; reported apart), then REPEATS (3; QUICK: 1)
of each are measured and the medians compared. For each Flink job the report lists the CPU seconds
of the SDK worker processes it used (children of the worker pool) against the submitter's own.

Prints ``RESULT flink-fixed-cost ratio=<direct s / Flink s> target=0.2``, with the Flink seconds
(target <= 10 s on a 2-core machine) in the text; ``SKIP flink-fixed-cost <why>`` when the cluster,
its job server or its pool is missing.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import QUICK, ROOT, WORK, generate, result
from bench.flink_parts import FLINK_MASTER, HarnessCpu, flink_missing

NAME = "flink-fixed-cost"
USERS = 200
REPEATS = 1 if QUICK else 3
FLINK = ["--runner", "FlinkRunner", "--flink_master", FLINK_MASTER, "--parallelism", "2"]
FAST = "--experiments=disable_logging_submission_environment"


def run(events: str, out: Path, runner: Sequence[str]) -> dict[str, Any]:
    """One ``features`` process: its wall seconds (start to exit), its own CPU seconds, its summary."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines", "features", "--input", events, "--output", str(out), *runner]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{") :])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "submitter_cpu": cpu, "summary": summary}


def flink_run(events: str, out: Path) -> dict[str, Any]:
    with HarnessCpu() as harness:
        found = run(events, out, [*FLINK, FAST])
    found["harness"] = harness
    return found


def _line(name: str, found: dict[str, Any]) -> None:
    print(
        f"{name:<18} {found['wall']:6.1f} s submit to done (pipeline {found['summary']['seconds']:.1f} s); "
        f"submitter CPU {found['submitter_cpu']:.1f} s",
        flush=True,
    )
    if "harness" in found:
        for line in found["harness"].lines() or ["no SDK worker process seen"]:
            print(f"{'':<20} SDK worker {line}")


def main() -> None:
    missing = flink_missing()
    if missing:
        print(f"SKIP {NAME} {missing}")
        return
    events = str(generate(USERS, 14, WORK / f"features-{USERS}u" / "events.parquet"))
    out = WORK / "flink-fixed-cost"
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    _line("flink warm-up", flink_run(events, out / "warm"))
    flinks, directs = [], []
    for i in range(REPEATS):
        directs.append(run(events, out / f"direct-{i}", ["--runner", "DirectRunner"]))
        _line(f"direct #{i + 1}", directs[-1])
        flinks.append(flink_run(events, out / f"flink-{i}"))
        _line(f"flink p2 #{i + 1}", flinks[-1])
    for found in flinks:
        assert found["summary"]["histories"] == directs[0]["summary"]["histories"], "Flink and direct differ"
    flink_s = statistics.median(f["wall"] for f in flinks)
    direct_s = statistics.median(d["wall"] for d in directs)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    result(
        NAME,
        direct_s / flink_s,
        0.2,
        f"flink p2 {flink_s:.1f} s (target <= 10 s) vs direct {direct_s:.1f} s, {USERS} users, "
        f"median of {REPEATS}, submit to done; load average {load}",
    )


if __name__ == "__main__":
    main()
