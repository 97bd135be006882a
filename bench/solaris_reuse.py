"""solaris-reuse: the compute the user-side encoding cache saves, at equal outputs.

The world and sets of ``bench/solaris_efficiency.py`` (QUICK: 600 sets of 1,000 users; full:
1,500 sets of 3,000 users; early-stage sets of ~200 ads, or with SOLARIS_STAGE=retrieval the
~1,000-ad ones), computed by the plain in-process loop (8 sets a batch, deadlines lifted, rank
tiers, skip-if-fresh, the store write) in one process, ROUNDS times each way, alternating:

- **off**: ``--encoding-cache 0``, every set (and every rank tier) encodes its history;
- **on**: the default cache (1,024 users, 1 minute).

Both stores must hold the same pairs, equal within float16 (the cache is exact: a hit is the
same encoding), or the bench exits without a figure. ``RESULT solaris-reuse ratio=<median off
seconds / median on seconds> target=1`` (the speed-up; compute saved = 1 - 1/ratio), with the
cache's hit share. The exact share of a deadline-bound run follows from equal outputs that
arrive no later.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import QUICK, WORK, result, untrained_model  # noqa: E402
from bench.solaris_efficiency import DAYS, STAGE, USERS, LoopRun, early_sets, funnel_world, loop_run, set_keys  # noqa: E402
from bench.solaris_stream import write_ad_catalog  # noqa: E402

SETS = int(os.environ.get("SOLARIS_SETS", 600 if QUICK else 1_500))
ROUNDS = 3


def main() -> None:
    from pipelines.settings import ENCODING_CACHE

    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    root = WORK / "solaris-efficiency"
    _, funnel, features = funnel_world(USERS, DAYS, SETS, root)
    model = untrained_model(root / "model")
    sets = early_sets(funnel, STAGE)
    catalog = write_ad_catalog(features, root / "reuse-ad-catalog.parquet")
    runs: dict[int, list[LoopRun]] = {0: [], ENCODING_CACHE.default: []}
    for _ in range(ROUNDS):
        for size, done in runs.items():
            done.append(loop_run(sets, features, model, catalog, root, encoding_cache=size))
            print(f"cache {size:>5}: {done[-1].pairs:,} pairs in {done[-1].seconds:.2f} s", flush=True)
    off, on = runs[0], runs[ENCODING_CACHE.default]
    difference = _max_difference(sets, off[0].store, on[0].store)
    for run in off + on:
        shutil.rmtree(run.store.removeprefix("lmdb://"), ignore_errors=True)
    if difference > 1e-2:
        sys.exit(f"the cached run's pairs differ from the plain run's by up to {difference:.3g}: no figure")
    off_s, on_s = statistics.median(r.seconds for r in off), statistics.median(r.seconds for r in on)
    hit_share = on[0].hits / max(1, on[0].hits + on[0].misses)
    ads = sets["ad_ids"].combine_chunks().value_lengths().to_numpy().mean()
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    result(
        "solaris-reuse" if STAGE == "early" else "solaris-reuse-1000",
        off_s / on_s,
        1.0,
        f"median {off_s:.2f} s without the encoding cache vs {on_s:.2f} s with it ({1 - on_s / off_s:.1%} of "
        f"the compute saved); {on[0].hits:,} of {on[0].hits + on[0].misses:,} history encodings reused "
        f"({hit_share:.0%}; rank tiers included); {len(sets):,} sets of ~{ads:.0f} ads; pairs equal within "
        f"{difference:.1e}",
    )


def _max_difference(sets: pa.Table, first: str, second: str) -> float:
    """The largest difference between the two stores' pair embeddings and scores over ``sets``' pairs."""
    from pipelines.store import open_store

    users, ads = set_keys(sets)
    read = []
    for uri in (first, second):
        with open_store(uri) as store:
            got = store.read_arrays(users, ads, np.ones(len(users), bool))
        if not got.found.all():
            sys.exit(f"{uri} lacks {int((~got.found).sum()):,} pairs: no figure")
        read.append(got)
    return float(
        max(
            np.abs(read[0].embedding.astype(np.float32) - read[1].embedding.astype(np.float32)).max(),
            np.abs(read[0].p_click - read[1].p_click).max(),
        )
    )


if __name__ == "__main__":
    main()
