"""solaris-flat: the stream graph's worker memory and pairs/s with a state of U users vs 10U users.

Two worlds of ``bench/solaris.py``'s kind (U and 10 x U users, 7 days; QUICK U = 300, full
U = 1,000), each streamed into its own stream output (``bench.solaris_stream.seed_stream``).
The same number of early-stage candidate sets (~200 ads, deadlines lifted) goes through
``stream --candidates-topic`` on Prism at two sizes, as in ``bench/solaris_efficiency.py``:
pairs/s is the rate of the added pairs; the worker RSS is the job process's peak resident
memory in the bigger run (on Prism the SDK workers run in that process), sampled every 0.1 s.
Both with ``--encoding-cache 0`` (see NO_REUSE).

``RESULT solaris-flat ratio=<min(pairs/s 10U / pairs/s U, RSS U / RSS 10U)> target=0.85``: what a
state ten times bigger costs per set, in speed and in memory.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from bench.common import QUICK, WORK, kafka_connection, result, untrained_model  # noqa: E402
from bench.runners import steady_rate  # noqa: E402
from bench.solaris_efficiency import early_sets, funnel_world, graph_run  # noqa: E402
from bench.solaris_stream import seed_stream  # noqa: E402

USERS, DAYS = (300, 7) if QUICK else (1_000, 7)
SETS = int(os.environ.get("SOLARIS_SETS", 100 if QUICK else 300))
TARGET = 0.85
#: The user-side encoding cache is off in both runs: a world of fewer users repeats users across its
#: sets more often, and the cache would credit it with reuse, not with a smaller state.
NO_REUSE = ("--encoding-cache", "0")


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


def measure(users: int, root: Path, bootstrap: str) -> tuple[float, int]:
    """(pairs/s, peak worker RSS in bytes) of the graph with a state of ``users`` users."""
    events, funnel, features = funnel_world(users, DAYS, 3 * SETS, root)
    sets = early_sets(funnel)
    graph = seed_stream(events, features, untrained_model(root / "model"), root, bootstrap)
    small = graph_run(graph, sets.slice(0, SETS), root, bootstrap, NO_REUSE)
    peak = PeakRss("--candidates-topic\0bench-solaris-eff-")
    peak.start()
    big = graph_run(graph, sets.slice(0, 3 * SETS), root, bootstrap, NO_REUSE)
    peak.stop.set()
    rate = steady_rate(small, big)
    print(f"{users:,} users: {rate:,.0f} pairs/s, worker RSS peak {peak.peak / 2**20:,.0f} MiB", flush=True)
    return rate, peak.peak


def main() -> None:
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    bootstrap = kafka_connection().bootstrap
    root = WORK / "solaris-flat"
    (rate_u, rss_u), (rate_10u, rss_10u) = (measure(n, root, bootstrap) for n in (USERS, 10 * USERS))
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    speed, memory = rate_10u / rate_u, rss_u / max(rss_10u, 1)
    result(
        "solaris-flat",
        min(speed, memory),
        TARGET,
        f"stream graph on Prism, {3 * SETS} sets of ~200 ads: {USERS:,} users {rate_u:,.0f} pairs/s and "
        f"{rss_u / 2**20:,.0f} MiB; {10 * USERS:,} users {rate_10u:,.0f} pairs/s and {rss_10u / 2**20:,.0f} MiB "
        f"(speed {speed:.3f}, memory {memory:.3f})",
    )


if __name__ == "__main__":
    main()
