"""first-sight: what a fresh streaming job pays for a user's row in the flush files, at U vs 10U users.

A shard's flush files hold U users (QUICK 2,000, full 5,000) and then 10U, as the stream leaves
them: many flush files compacted into sorted merged files, plus TAIL newer flush files of the same
size at both sizes (a stream's recent files hold its recent bundles' events). For each size,
two ways of answering "what did the files hold for this user" (``pipelines.streaming.keyed.FirstSight``):

- **whole shard** (the baseline, still used for shards up to ``WHOLE_SHARD_BYTES``): load the
  shard once, then look the user up; the cost of the first sight is the load, and the worker
  holds the whole shard in memory;
- **per user** (``pipelines.streaming.state.history_of``): read only the Parquet row groups that
  can hold the user.

It prints each one's cost for the first user and per user over SAMPLE users, and the memory the
whole shard holds. ``RESULT first-sight-flat ratio=<per-user cost at U / at 10U> target=0.85``:
a first sight in a shard ten times bigger should cost about the same.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import QUICK, WORK, result  # noqa: E402
from pipelines.streaming.keyed import FirstSight  # noqa: E402
from pipelines.streaming.state import compact_shard, flush_path, history_of, merge_shard, write_flush  # noqa: E402
from tests.features.factories import event, events_table  # noqa: E402

USERS = 2_000 if QUICK else 5_000
EVENTS_PER_USER, FLUSHES, SAMPLE, MAX_HISTORY = 8, 24, 200, 256
TAIL, TAIL_EVENTS = 3, 300
TARGET = 0.85


def build(out: str, users: int, rng: np.random.Generator) -> None:
    """A shard of ``users`` users written as FLUSHES flush files and compacted (the stream's way),
    then TAIL newer flush files of TAIL_EVENTS events each, not yet merged: the same at both sizes,
    as a stream's recent files hold the events of its recent bundles, whatever the state's size."""
    owners = rng.integers(0, users, users * EVENTS_PER_USER + TAIL * TAIL_EVENTS)
    times = np.sort(rng.integers(0, 10**9, len(owners)))
    base = np.array_split(np.arange(users * EVENTS_PER_USER), FLUSHES)
    tail = np.array_split(np.arange(users * EVENTS_PER_USER, len(owners)), TAIL)
    state = None
    for k, part in enumerate(base + tail):
        table = events_table([event(f"e{i}", int(owners[i]), int(times[i])) for i in part.tolist()])
        merged = merge_shard(table, state, max_history=MAX_HISTORY)
        write_flush(merged.changed, flush_path(out, 0, clock_ns=k + 1))
        state = merged.state
        if k < FLUSHES:
            compact_shard(out, 0)


def measure(out: str, users: int, rng: np.random.Generator) -> dict[str, float]:
    asked = rng.integers(0, users, SAMPLE).tolist()
    started = time.perf_counter()
    whole = FirstSight(whole_bytes=1 << 62)
    whole.row_of(out, 0, asked[0])
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    for user in asked:
        whole.row_of(out, 0, user)
    lookup_s = (time.perf_counter() - started) / SAMPLE
    held = sum(t.nbytes for t in whole._shards[(out, 0)]._chunks)  # type: ignore[attr-defined]
    started = time.perf_counter()
    rows = [history_of(out, 0, user) for user in asked]
    per_user_s = (time.perf_counter() - started) / SAMPLE
    assert all(r.num_rows == 1 for r in rows)
    assert pa.concat_tables(rows).equals(pa.concat_tables([whole.row_of(out, 0, u) for u in asked]))
    return {"load_s": load_s, "lookup_s": lookup_s, "held_mb": held / 2**20, "per_user_s": per_user_s}


def main() -> None:
    print(f"first-sight: load average {os.getloadavg()}", flush=True)
    rng = np.random.default_rng(11)
    figures = {}
    for users in (USERS, 10 * USERS):
        out = str(WORK / "first_sight" / f"u{users}")
        shutil.rmtree(out, ignore_errors=True)
        build(out, users, rng)
        m = figures[users] = measure(out, users, rng)
        print(
            f"{users:,} users: whole shard: load {m['load_s'] * 1e3:.1f} ms, then {m['lookup_s'] * 1e6:.0f} us "
            f"per user, {m['held_mb']:.1f} MiB held; per user: {m['per_user_s'] * 1e3:.2f} ms",
            flush=True,
        )
        shutil.rmtree(out)
    small, big = figures[USERS], figures[10 * USERS]
    ratio = small["per_user_s"] / big["per_user_s"]
    result(
        "first-sight-flat",
        ratio,
        TARGET,
        f"(per-user read {small['per_user_s'] * 1e3:.2f} ms at {USERS:,} users vs {big['per_user_s'] * 1e3:.2f} ms "
        f"at {10 * USERS:,}; whole-shard load {small['load_s']:.2f} s vs {big['load_s']:.2f} s, "
        f"{small['held_mb']:.0f} vs {big['held_mb']:.0f} MiB held) load {os.getloadavg()}",
    )


if __name__ == "__main__":
    main()
