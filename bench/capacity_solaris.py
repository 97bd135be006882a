"""The Solaris job's pairs/s per core for bench/capacity.py, measured through its CLI.

``python -m pipelines solaris`` (a subprocess: the untrained default model, the generated
world's features as histories, an LMDB store) drains a topic of early-stage candidate sets,
all sent before it starts with a far ``needed_by``, and exits when idle (``--idle-exit``). Its
CPU time (user + system, from the kernel's accounting of the waited child) includes the
start (imports, the model, the consumer) and the idle wait; two runs of different sizes,
each on a fresh topic and store, cancel those: pairs/s per core = (pairs of the large run -
pairs of the small one) / (its CPU - the small one's).
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.common import WORK, generate, kafka_connection, untrained_model

USERS, DAYS = 1_000, 7
SMALL, LARGE = 30, 150  # candidate sets (~200 ads each) per run
_LINE = re.compile(r"\(([\d,]+) pairs computed")


def _world() -> tuple[pa.Table, Path, Path]:
    """Early-stage candidate sets, the features folder (histories) and an untrained model."""
    from pipelines.generator.funnel import stage_rows
    from pipelines.io.parquet import read_table
    from pipelines.schemas.layouts import CANDIDATE_SET

    folder = WORK / "capacity-solaris" / f"world-{USERS}x{DAYS}-{LARGE}"
    funnel = folder / "funnel.parquet"
    events = generate(
        USERS, DAYS, folder / "events.parquet", flags=["--funnel", str(funnel), "--funnel-requests", str(LARGE)]
    )
    features = folder / "features"
    if not features.exists():
        cmd = [sys.executable, "-m", "pipelines", "features", "--input", str(events), "--output", str(features)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    early = stage_rows(read_table(str(funnel), CANDIDATE_SET), "early").sort_by("request_id")
    return early, features, untrained_model(folder / "model")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(early: pa.Table, features: Path, model: Path, count: int) -> tuple[int, float]:
    """(pairs computed, the job's CPU seconds) for the first ``count`` sets."""
    from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire
    from pipelines.io.kafka.produce import KafkaSink, delete_topics, ensure_topic

    connection = kafka_connection()
    topic = f"bench-capacity-solaris-{uuid.uuid4().hex[:8]}"
    store = WORK / "capacity-solaris" / topic
    ensure_topic(connection, topic, 2)
    table = early.slice(0, count)
    stamp = pa.timestamp("ms", tz="UTC")
    far = pa.array([4_102_444_800_000] * count).cast(stamp)  # 2100: never past
    table = table.set_column(table.schema.get_field_index("needed_by"), "needed_by", far)
    sink = KafkaSink(connection, topic, linger_ms=0)
    try:
        for key, value in candidate_sets_to_wire(table):
            sink.send(value, key)
        sink.flush()
    finally:
        sink.close()
    before = _children_cpu_s()
    try:
        out = subprocess.run(
            [
                sys.executable, "-m", "pipelines", "solaris", "--topic", topic, "--group", topic,
                "--histories", str(features), "--model", str(model), "--store", f"lmdb://{store}",
                "--bootstrap-servers", connection.bootstrap, "--idle-exit", "3s", "--torch-threads", "1",
            ],
            check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        ).stdout  # fmt: skip
    finally:
        delete_topics(connection, [topic])
        shutil.rmtree(store, ignore_errors=True)
    cpu = _children_cpu_s() - before
    found = _LINE.search(out)
    if found is None:
        raise RuntimeError(f"the solaris job's closing line names no pair count: {out[-300:]!r}")
    return int(found.group(1).replace(",", "")), cpu


def measure_solaris() -> dict[str, Any]:
    """The capacity figure ``solaris_pairs_per_core``."""
    early, features, model = _world()
    small_pairs, small_cpu = _run(early, features, model, SMALL)
    large_pairs, large_cpu = _run(early, features, model, LARGE)
    value = (large_pairs - small_pairs) / max(large_cpu - small_cpu, 1e-9)
    print(
        f"solaris: {small_pairs:,} pairs in {small_cpu:.1f} CPU s ({SMALL} sets), {large_pairs:,} in "
        f"{large_cpu:.1f} CPU s ({LARGE} sets): {value:,.0f} pairs/s per core",
        flush=True,
    )
    return {
        "value": round(value, 3),
        "unit": "pairs/s per core",
        "how": (
            f"python -m pipelines solaris (torch 1 thread, LMDB store, untrained default model) draining "
            f"{LARGE} vs {SMALL} early-stage sets sent beforehand; (pairs difference {large_pairs - small_pairs:,}) / "
            f"(job CPU difference {large_cpu - small_cpu:.1f} s), which cancels start-up and the idle exit"
        ),
    }
