"""Render the sizing page (docs/operations/capacity.md) from the measured per-unit costs.

``make capacity`` (:func:`main`; ``--check`` from the tests) reads bench/capacity.json, which
bench/capacity.py writes, and writes the page; ``--check`` exits 1 when the committed page differs
from what the committed measurements give. :func:`render` is pure: measurements in, Markdown out.

Every sized figure is a formula over one or more measured inputs (``M:``) and stated assumptions
(``A:``); the page prints the formula beside each figure. All of it is a linear extrapolation of
single-process measurements on this machine: no cross-node cost (network, replication traffic,
coordination) is in it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "bench" / "capacity.json"
PAGE = ROOT / "docs" / "operations" / "capacity.md"
USER_COUNTS = (10_000_000, 100_000_000, 3_600_000_000)

#: Stated assumptions (A:), the workload and the hardware the figures are sized for.
ASSUMPTIONS: dict[str, tuple[float, str]] = {
    "events_per_user_day": (50, "engagement events per daily user per day"),
    "history_length": (4_096, "events kept per user history (--max-history default)"),
    "pairs_per_user_day": (
        200,
        "(user, ad) pairs precomputed per user per day (one request's candidates, daily refresh)",
    ),
    "solaris_pairs_per_user_day": (20, "pairs computed live by Solaris per user per day"),
    "requests_per_user_day": (20, "ranking requests per user per day, each one resolver call and one index search"),
    "peak_to_mean": (3, "peak over mean rate for the streaming and serving stages"),
    "features_window_h": (4, "hours in which the daily features batch must finish"),
    "precompute_window_h": (6, "hours in which the daily precompute must finish"),
    "replay_window_h": (4, "hours to replay one day of events (backfill)"),
    "event_retention_days": (7, "days of event Parquet kept"),
    "store_replicas": (2, "copies of every store record (master + replica)"),
    "store_node_gb": (100, "usable memory per store node, GB"),
    "index_shard_gb": (64, "memory per index shard (one serving host's share), GB"),
    "host_cores": (64, "cores per host"),
    "host_memory_gb": (512, "memory per host, GB"),
}
AUTO_COMPRESSED_FROM = 4_000_000  # pipelines.similarity.faiss_ops.AUTO_COMPRESSED_FROM
FLAT, COMPRESSED = "IVF1024,Flat", "IVF1024,PQ32,RFlat"


@dataclass(frozen=True)
class Cell:
    """One sized figure: its value, unit and the formula with its inputs."""

    value: float
    unit: str
    formula: str


def _m(measured: dict[str, Any], *path: str) -> float:
    node: Any = measured
    for key in path:
        node = node[key]
    return float(node["value"])


def _factory(users: int) -> str:
    return COMPRESSED if users >= AUTO_COMPRESSED_FROM else FLAT


def size(measured: dict[str, Any], users: int) -> dict[str, Cell]:
    """Every sized figure for ``users`` daily users (pure)."""
    a = {k: v for k, (v, _) in ASSUMPTIONS.items()}
    events_day = users * a["events_per_user_day"]
    peak_events_s = events_day / 86_400 * a["peak_to_mean"]
    requests_s = users * a["requests_per_user_day"] / 86_400 * a["peak_to_mean"]
    factory = _factory(users)
    hist = _m(measured, "history_bytes_per_user", str(int(a["history_length"])))
    record = _m(
        measured,
        "store_bytes_per_record",
        "redis_float16" if "redis_float16" in measured["store_bytes_per_record"] else "float16",
    )
    index_bytes = _m(measured, "index_bytes_per_user", factory)
    stream_cores = peak_events_s / _m(measured, "stream_events_per_core")
    index_gb = users * index_bytes / 1e9
    store_gb = users * (1 + a["pairs_per_user_day"]) * record * a["store_replicas"] / 1e9
    cells = {
        "features cores": Cell(
            events_day / (_m(measured, "features_events_per_core") * a["features_window_h"] * 3600),
            "cores",
            "U x A:events/day / (M:features events/s/core x A:window)",
        ),
        "replay cores": Cell(
            events_day / (_m(measured, "replay_events_per_core") * a["replay_window_h"] * 3600),
            "cores",
            "U x A:events/day / (M:replay events/s/core x A:replay window)",
        ),
        "stream cores": Cell(stream_cores, "cores", "U x A:events/day / 86400 x A:peak / M:stream events/s/core"),
        "precompute cores": Cell(
            users
            * a["pairs_per_user_day"]
            / (_m(measured, "precompute_pairs_per_core") * a["precompute_window_h"] * 3600),
            "cores",
            "U x A:pairs/day / (M:precompute pairs/s/core x A:window)",
        ),
        "solaris cores": Cell(
            users
            * a["solaris_pairs_per_user_day"]
            / 86_400
            * a["peak_to_mean"]
            / _m(measured, "solaris_pairs_per_core"),
            "cores",
            "U x A:live pairs/day / 86400 x A:peak / M:solaris pairs/s/core",
        ),
        "resolver cores": Cell(
            requests_s / _m(measured, "resolver_requests_per_core"),
            "cores",
            "U x A:requests/day / 86400 x A:peak / M:resolver requests/s/core",
        ),
        "index search cores": Cell(
            requests_s / _m(measured, "index_queries_per_core", factory),
            "cores",
            f"U x A:requests/day / 86400 x A:peak / M:{factory} queries/s/core",
        ),
        "store memory": Cell(store_gb, "GB", "U x (1 + A:pairs/day) x M:Redis bytes/record x A:replicas"),
        "store nodes": Cell(math.ceil(store_gb / a["store_node_gb"]), "nodes", "store memory / A:GB per node"),
        "index memory": Cell(index_gb, "GB", f"U x M:{factory} bytes/user (auto: compressed from 4M users)"),
        "index shards": Cell(math.ceil(index_gb / a["index_shard_gb"]), "shards", "index memory / A:GB per shard"),
        "history state disk": Cell(
            users * hist / 1e9, "GB", f"U x M:history bytes/user at {int(a['history_length'])} events"
        ),
        "event Parquet disk": Cell(
            events_day * _m(measured, "parquet_bytes_per_event") * a["event_retention_days"] / 1e9,
            "GB",
            "U x A:events/day x M:Parquet bytes/event x A:retention days",
        ),
        "Kafka partitions": Cell(
            math.ceil(stream_cores), "partitions", "stream cores, rounded up: one consuming core per partition"
        ),
    }
    return cells


#: What exhausts one host, per stage: (cell, host limit in the cell's unit, what the limit is).
HOST_LIMITS: dict[str, tuple[str, Callable[[dict[str, float]], float], str]] = {
    "features": ("features cores", lambda a: a["host_cores"], "cores"),
    "stream": ("stream cores", lambda a: a["host_cores"], "cores"),
    "precompute": ("precompute cores", lambda a: a["host_cores"], "cores"),
    "solaris": ("solaris cores", lambda a: a["host_cores"], "cores"),
    "resolver": ("resolver cores", lambda a: a["host_cores"], "cores"),
    "index search": ("index search cores", lambda a: a["host_cores"], "cores"),
    "online store": ("store memory", lambda a: a["host_memory_gb"], "memory"),
    "index": ("index memory", lambda a: a["host_memory_gb"], "memory"),
}


def breaks_first(measured: dict[str, Any]) -> list[tuple[str, float, str]]:
    """Per stage, the daily users at which it outgrows one host (linear in users), smallest first,
    with the per-user cost that decides it."""
    a = {k: v for k, (v, _) in ASSUMPTIONS.items()}
    probe = 100_000_000
    cells = size(measured, probe)
    out = []
    for stage, (cell, limit, what) in HOST_LIMITS.items():
        per_user = cells[cell].value / probe
        cost = per_user * (1e9 if what == "memory" else 1e6)
        why = f"{what}: {cost:,.0f} B" if what == "memory" else f"{what}: {cost:.3g} cores"
        why += f" per {'user' if what == 'memory' else 'million users'} ({cells[cell].formula})"
        out.append((stage, limit(a) / per_user if per_user else math.inf, why))
    return sorted(out, key=lambda row: row[1])


COUNTS = ("nodes", "shards", "partitions")


def _fmt(x: float, unit: str = "") -> str:
    if unit in COUNTS:
        return f"{int(x):,}"
    if x >= 1e9:
        return f"{x / 1e9:.1f}G"
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 10_000:
        return f"{x / 1e3:.0f}k"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _users(n: int) -> str:
    return f"{n / 1e9:g}B" if n >= 1e9 else f"{n / 1e6:g}M"


def _inputs(measured: dict[str, Any]) -> list[str]:
    rows = ["| input | value | unit | how it was measured |", "|---|---|---|---|"]

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and "value" in node:
            rows.append(f"| {prefix} | {_fmt(node['value'])} | {node['unit']} | {node['how']} |")
        elif isinstance(node, dict):
            for key, child in node.items():
                walk(f"{prefix} {key}".strip(), child)

    for key, node in measured.items():
        if isinstance(node, dict):
            walk(key.replace("_", " "), node)
    return rows


def render(measured: dict[str, Any]) -> str:
    """The sizing page for :data:`USER_COUNTS` from ``measured`` (the capacity.json content)."""
    load = measured.get("load_average_start", [])
    sized = {u: size(measured, u) for u in USER_COUNTS}
    names = list(sized[USER_COUNTS[0]])
    lines = [
        "# Capacity",
        "",
        "<!-- generated by `make capacity` from bench/capacity.json: edit bench/capacity_model.py, not this page -->",
        "",
        "How many cores, how much memory and disk, how many store nodes, index shards and Kafka",
        "partitions the pipelines need for a given number of daily users, computed from per-unit costs",
        f"measured by `bench/capacity.py` on {measured['date']} ({measured['machine']}; load average",
        f"{' / '.join(str(x) for x in load)} at the start). Every figure below is a formula over measured",
        "inputs (M:) and stated assumptions (A:), shown beside it. **All of it is extrapolated**: linear",
        "in users from single-process measurements at small sizes, with no cross-node cost (network,",
        "replication traffic, coordination) in it; inputs marked NOT MEASURED HERE come from other runs.",
        "Which knob scales each stage: [scaling out](scaling.md).",
        "",
        "## Sizing",
        "",
        "| figure | " + " | ".join(_users(u) for u in USER_COUNTS) + " | unit | formula |",
        "|---|" + "---|" * len(USER_COUNTS) + "---|---|",
    ]
    for name in names:
        cells = [sized[u][name] for u in USER_COUNTS]
        lines.append(
            f"| {name} | "
            + " | ".join(_fmt(c.value, c.unit) for c in cells)
            + f" | {cells[0].unit} | {cells[-1].formula} |"
        )
    order = breaks_first(measured)
    first, at, what = order[0]
    lines += [
        "",
        "## What breaks first",
        "",
        f"Growing users with everything else fixed, **{first}** is the first stage to outgrow one host "
        f"(A: {ASSUMPTIONS['host_cores'][0]:.0f} cores, {ASSUMPTIONS['host_memory_gb'][0]:.0f} GB), at about "
        f"{_fmt(at)} daily users, on {what}. Every stage scales out by adding",
        'workers (cores), store nodes (hash slots) or index shards, so "breaks" means it must be spread over',
        "hosts from there on. Users at which each stage outgrows one host:",
        "",
        "| stage | users at one host | limit, per-user cost (formula) |",
        "|---|---|---|",
        *[f"| {stage} | {_fmt(users)} | {limit} |" for stage, users, limit in order],
        "",
        "## Assumptions (A:)",
        "",
        "| assumption | value | meaning |",
        "|---|---|---|",
        *[f"| {k} | {v:g} | {text} |" for k, (v, text) in ASSUMPTIONS.items()],
        "",
        "## Measured inputs (M:)",
        "",
        f"Sizes: {measured.get('sizes', '')}.",
        "",
        *_inputs(measured),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import json

    page = render(json.loads(MEASURED.read_text()))
    if "--check" in argv:
        if PAGE.read_text() != page:
            print(f"{PAGE} differs from what {MEASURED} gives: run make capacity", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0
