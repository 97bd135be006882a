"""What the Flink and Spark benches need from this machine, and where a Flink job's Python work ran.

:func:`flink_missing` and :func:`spark_missing` say why an engine cannot run here (a bench then
prints ``SKIP <name> <why>`` instead of failing); :class:`HarnessCpu` samples the CPU seconds of
the SDK worker processes (the worker pool's children), or of any other set of processes (e.g. a
job's process tree, :func:`tree_pids`), while a job runs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pipelines.jobservers import JOB_ENDPOINT_KEY, WORKER_POOL_KEY, cluster_offers, default_spark_jar

FLINK_MASTER = "127.0.0.1:8081"
TICKS = os.sysconf("SC_CLK_TCK")


def flink_missing(master: str = FLINK_MASTER) -> str | None:
    """Why a plain FlinkRunner job cannot run through the local cluster's job server and pool, or None."""
    offers = cluster_offers(master)
    if offers is None:
        return f"the local Flink cluster does not answer at {master} (make flink-up)"
    missing = [k for k in (JOB_ENDPOINT_KEY, WORKER_POOL_KEY) if not offers.get(k)]
    if missing:
        return f"the Flink cluster at {master} offers no {' or '.join(missing)} (make flink-down flink-up)"
    return None


def spark_missing() -> str | None:
    return None if default_spark_jar() else "no Spark job server jar (make spark-jobserver)"


def _cpu_seconds(pid: str) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _ppid(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except OSError:
        return "?"


def harness_pids() -> list[str]:
    """The SDK worker processes on this machine (a worker pool starts each as ``python -c ... SdkHarness(``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"SdkHarness(" in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:
                continue
    return found


def tree_pids(root: int) -> list[str]:
    """``root`` and every process below it (by parent pid), as /proc names."""
    parents = {entry.name: _ppid(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    tree, grew = {str(root)}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return sorted(tree & (parents.keys() | {str(root)}))


class HarnessCpu:
    """Samples, every ``interval_s`` while the ``with`` block runs, the CPU seconds of each process
    ``pids()`` names (default: the SDK worker processes) that was not there when it began (its last
    sample: a process gone at the job's end loses at most one interval)."""

    def __init__(self, interval_s: float = 0.25, pids: Callable[[], list[str]] = harness_pids) -> None:
        self.interval_s = interval_s
        self.pids = pids
        self.seconds: dict[str, float] = {}
        self.parents: dict[str, str] = {}
        self._before: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> HarnessCpu:
        self._before = set(self.pids())
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    def _read(self) -> None:
        for pid in self.pids():
            if pid in self._before:
                continue
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                self.seconds[pid] = max(cpu, self.seconds.get(pid, 0.0))
                self.parents.setdefault(pid, _ppid(pid))

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self.interval_s)

    def lines(self) -> list[str]:
        return [f"pid {p} (parent {self.parents[p]}): {s:.1f} CPU s" for p, s in sorted(self.seconds.items())]
