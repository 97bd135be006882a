"""One user's events in bulk, and the peak memory of building their history in a child process.

Shared by ``tests/features/test_memory.py`` and ``bench/features_memory.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.schemas.layouts import EVENT

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CHUNK = 1_000_000
#: impressions, clicks, likes, conversions in these proportions
TYPES = np.array([0, 0, 0, 0, 1, 2, 9], dtype=np.int8)


def one_user_events(start: int, n: int, user_id: int = 42, seed: int = 0) -> pa.Table:
    """``n`` valid EVENT rows of one user, 10 ms apart from ``T0 + 10 * start``, ids ``e<start>``..."""
    rng = np.random.default_rng(seed + start)
    i = np.arange(start, start + n)
    is_ad = rng.integers(0, 2, n).astype(bool)
    columns = {
        "event_id": pa.array(np.char.add("e", i.astype(str))),
        "user_id": np.full(n, user_id),
        "item_id": rng.integers(0, 50, n),
        "is_ad": is_ad,
        "advertiser_id": pa.array(rng.integers(0, 5, n), mask=~is_ad),
        "item_category": rng.integers(0, 5, n).astype(np.int32),
        "surface": rng.integers(0, 3, n).astype(np.int8),
        "event_type": rng.choice(TYPES, n),
        "event_time": pa.array(T0 + i * 10, pa.timestamp("ms", tz="UTC")),
        "value": pa.nulls(n, pa.float32()),
        "device": rng.integers(0, 3, n).astype(np.int8),
    }
    return pa.table(columns, schema=EVENT.schema)


def write_one_user(path: Path, n: int) -> Path:
    """``n`` events of one user as Parquet, written a million rows at a time."""
    with pq.ParquetWriter(path, EVENT.schema) as writer:
        for start in range(0, n, CHUNK):
            writer.write_table(one_user_events(start, min(CHUNK, n - start)))
    return path


_CHILD = """
import json, os, resource, sys
import pyarrow.parquet as pq
from pipelines.features.histories import stream_histories
source = pq.ParquetFile(sys.argv[1])
read_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
build = stream_histories(source.iter_batches(batch_size=1 << 16), max_history=int(sys.argv[2]))
examples = sum(table.num_rows for table in build.examples)
print(json.dumps({
    "events": source.metadata.num_rows, "file_bytes": os.path.getsize(sys.argv[1]), "read_kb": read_kb,
    "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "examples": examples, "evicted": build.evicted,
}))
"""


def build_peak(path: Path, max_history: int = 4096, threads: int = 2) -> dict:
    """Build the histories of ``path`` in a fresh child; its peak RSS (``ru_maxrss``, KiB) and counts.

    The child's Polars pool has ``threads`` threads, so the figure does not grow with the cores of
    the machine that runs it.
    """
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(max_history)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(done.stdout)


_COMMAND = """
import json, resource, sys
from pipelines.cli import main
code = main(["features", "--input", sys.argv[1], "--output", sys.argv[2], "--num-shards", "1"])
print(json.dumps({"code": code, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def command_peak(path: Path, output: Path, threads: int = 2) -> dict:
    """Run the whole ``features`` command (local runner, one shard) on ``path`` in a fresh child;
    its exit code and peak RSS (KiB)."""
    env = {**os.environ, "POLARS_MAX_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", _COMMAND, str(path), str(output)], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
