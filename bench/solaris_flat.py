"""solaris-flat: the stream graph's worker memory and pairs/s with a state of U users vs 10U users.

One world of ``bench/solaris.py``'s kind with 10 x U users (7 days; QUICK U = 300, full U =
1,000) and a funnel big enough that its users 1..U get SETS early-stage candidate sets (~200 ads,
deadlines lifted). The same sets run through ``stream --candidates-topic`` on Prism over two stream
states (``bench.solaris_stream.seed_stream``): one seeded with the events of users 1..U only, one
with every user's. So the active users, their histories and their sets are the same, and only the
users the state holds differ (10U, nine in ten never asked for). Pairs/s is the rate in steady
state, from the job's /metrics between 10% and 90% of a run's pairs (the median of 3 runs; QUICK 1),
the two states' runs taken in turn (:func:`steady_rates`); the worker RSS
is each state's job processes' peak resident memory over its runs (on Prism the SDK workers run in
the job's process), sampled every 0.1 s.

``RESULT solaris-flat ratio=<min(pairs/s 10U / pairs/s U, RSS U / RSS 10U)> target=0.85``: what a
state ten times bigger costs per set, in speed and in memory.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
from pathlib import Path

import pyarrow as pa

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from bench.common import QUICK, WORK, kafka_connection, result, untrained_model  # noqa: E402
from bench.solaris_efficiency import early_sets, funnel_world, graph_run  # noqa: E402
from bench.solaris_stream import StreamGraphRunner, seed_stream  # noqa: E402

USERS, DAYS = (300, 7) if QUICK else (1_000, 7)
#: Early sets of users 1..U per run: as many as the world holds, so that a run's steady window is tens of
#: seconds (the sets of one user share many ads: 7,200 sets are ~210k distinct pairs).
SETS = int(os.environ.get("SOLARIS_SETS", 250 if QUICK else 7_200))
#: Funnel requests of the 10U world; users 1..U get about a fifth of its early sets.
REQUESTS = 4_000 if QUICK else 36_000
TARGET = 0.85
#: Runs of each state (medians taken).
REPEATS = 1 if QUICK else 3


class PeakRss(threading.Thread):
    """The peak VmRSS (bytes) of every process whose command line holds ``marker``, sampled every 0.1 s."""

    def __init__(self, marker: str) -> None:
        super().__init__(daemon=True)
        self.marker, self.peak, self.stop = marker, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self.peak = max(self.peak, _rss_of(pid, self.marker))


def _rss_of(pid: str, marker: str) -> int:
    try:
        if marker not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(states: list[Path], features: Path, sets: pa.Table, root: Path, bootstrap: str) -> list[tuple[float, int]]:
    """(pairs/s, peak worker RSS in bytes) of the graph over ``sets`` on a stream state seeded with each of
    ``states``' events, their runs taken in turn."""
    model = untrained_model(root / "model")
    graphs = [seed_stream(events, features, model, root, bootstrap) for events in states]
    peaks = [PeakRss(f"--output\0{graph.output}\0--candidates-topic") for graph in graphs]
    for peak in peaks:
        peak.start()
    rates = steady_rates(graphs, sets, root, bootstrap)
    for peak in peaks:
        peak.stop.set()
    return [(rate, peak.peak) for rate, peak in zip(rates, peaks, strict=True)]


def steady_rates(graphs: list[StreamGraphRunner], sets: pa.Table, root: Path, bootstrap: str) -> list[float]:
    """Each graph's steady pairs/s over ``sets``, the median of its runs' (``GraphRun.steady``): REPEATS
    rounds, each running every graph in turn, so that a drift of this shared machine's speed stays out of
    their comparison."""
    runs: list[list[float]] = [[] for _ in graphs]
    for _ in range(REPEATS):
        for graph, done in zip(graphs, runs, strict=True):
            done.append(graph_run(graph, sets, root, bootstrap).steady)
    for graph, done in zip(graphs, runs, strict=True):
        print(f"{graph.output.name}: steady pairs/s per run {', '.join(f'{rate:,.0f}' for rate in done)}", flush=True)
    return [statistics.median(done) for done in runs]


def active_world(events: Path, funnel: Path, users: int) -> tuple[Path, pa.Table]:
    """The events of users 1..``users`` only (written beside ``events``), and SETS of their early sets."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    active = events.with_name(f"events-users-1-{users}.parquet")
    if not active.exists():
        table = pq.read_table(events)
        pq.write_table(table.filter(pc.less_equal(table["user_id"], users)), active)
    sets = early_sets(funnel)
    sets = sets.filter(pc.less_equal(sets["user_id"], users))
    if sets.num_rows < SETS:
        raise SystemExit(f"only {sets.num_rows} early sets of users 1..{users}; raise REQUESTS")
    return active, sets.slice(0, SETS)


def main() -> None:
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    bootstrap = kafka_connection().bootstrap
    root = WORK / "solaris-flat"
    events, funnel, features = funnel_world(10 * USERS, DAYS, REQUESTS, root)
    active, sets = active_world(events, funnel, USERS)
    measured = measure([active, events], features, sets, root, bootstrap)
    for state, (rate, peak) in zip((USERS, 10 * USERS), measured, strict=True):
        print(f"state of {state:,} users: {rate:,.0f} pairs/s, worker RSS peak {peak / 2**20:,.0f} MiB", flush=True)
    rates, peaks = [rate for rate, _ in measured], [peak for _, peak in measured]
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    speed, memory = rates[1] / rates[0], peaks[0] / max(peaks[1], 1)
    result(
        "solaris-flat",
        min(speed, memory),
        TARGET,
        f"stream graph on Prism, the same {SETS} sets of ~200 ads of users 1..{USERS:,}: state of {USERS:,} users "
        f"{rates[0]:,.0f} pairs/s and {peaks[0] / 2**20:,.0f} MiB; of {10 * USERS:,} users {rates[1]:,.0f} pairs/s "
        f"and {peaks[1] / 2**20:,.0f} MiB (speed {speed:.3f}, memory {memory:.3f})",
    )


if __name__ == "__main__":
    main()
