"""Solaris' pairs/s per core for bench/capacity.py, measured through the stream graph's CLI.

``python -m pipelines solaris`` is ``stream --candidates-topic``: the graph on Prism (the untrained
default model, an LMDB store) drains a topic of early-stage candidate sets, all sent before it
starts with their deadlines lifted, and exits when idle (``--idle-exit``). Its keyed state is
seeded once by streaming the world's events (:func:`bench.solaris_stream.seed_stream`). Its CPU
time (user + system, from the kernel's accounting of the waited child: Prism's included) holds
the start (imports, the model, the runner) and the idle wait; two runs of different sizes, each
on a fresh topic and store, cancel those: pairs/s per core = (distinct pairs of the large run -
those of the small one) / (its CPU - the small one's). Every pair is checked in the store.
"""

from __future__ import annotations

import resource
from typing import Any

from bench.common import WORK, kafka_connection, untrained_model

USERS, DAYS = 1_000, 7
SMALL, LARGE = 30, 150  # candidate sets (~200 ads each) per run


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_solaris() -> dict[str, Any]:
    """The capacity figure ``solaris_pairs_per_core``."""
    from bench.solaris_efficiency import early_sets, funnel_world, graph_run
    from bench.solaris_stream import seed_stream

    root = WORK / "capacity-solaris"
    bootstrap = kafka_connection().bootstrap
    events, funnel, features = funnel_world(USERS, DAYS, LARGE, root)
    sets = early_sets(funnel)
    graph = seed_stream(events, features, untrained_model(root / "model"), root, bootstrap)
    runs = []
    for count in (SMALL, LARGE):
        before = _children_cpu_s()
        pairs = graph_run(graph, sets.slice(0, count), root, bootstrap).pairs
        runs.append((pairs, _children_cpu_s() - before))
    (small_pairs, small_cpu), (large_pairs, large_cpu) = runs
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
            f"python -m pipelines solaris (the stream graph on Prism, torch 1 thread, LMDB store, untrained default "
            f"model) draining {LARGE} vs {SMALL} early-stage sets sent beforehand; (distinct pairs difference "
            f"{large_pairs - small_pairs:,}) / (job CPU difference, Prism's included, {large_cpu - small_cpu:.1f} s), "
            "which cancels start-up and the idle exit"
        ),
    }
