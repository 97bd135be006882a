"""What the Flink and Spark benches need from this machine, and where a Flink job's Python work ran.

:func:`flink_missing` and :func:`spark_missing` say why an engine cannot run here (a bench then
prints ``SKIP <name> <why>`` instead of failing); :class:`HarnessCpu` samples the CPU seconds of
the SDK worker processes (the worker pool's children), or of any other set of processes (e.g. a
job's process tree, :func:`tree_pids`), while a job runs. :func:`own_flink` starts a Flink session
cluster of the caller's own (free ports, its own state folder), shaped like ``make flink-up``'s,
for a job that must not share the standing cluster (the Flink stream tests, ``stream-flat``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pipelines.jobservers import (
    JOB_ENDPOINT_KEY,
    REPO,
    WORKER_POOL_KEY,
    cluster_offers,
    default_flink_jar,
    default_spark_jar,
    versions,
)

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


FLINK_SH = REPO / "scripts" / "flink.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flink_home() -> Path:
    """The Flink home that ``make flink-up`` assembled (it may be missing: see :func:`own_flink_missing`)."""
    return REPO / ".cache" / "flink" / f"flink-{versions().get('FLINK_MINOR', '1.19')}.0"


def own_flink_missing() -> str | None:
    """Why :func:`own_flink` cannot start a cluster here, or None."""
    if not (flink_home() / ".assembled").is_file():
        return f"no Flink home at {flink_home()} (make flink-up)"
    if not default_flink_jar():
        return "no Flink job server jar (make flink-jobserver)"
    return None


@dataclass(frozen=True)
class OwnFlink:
    """A Flink session cluster of the caller's own: its environment for ``scripts/flink.sh``, its
    state folder (config, pid files, logs, checkpoints) and its REST address."""

    env: dict[str, str]
    state: Path
    rest: str

    def sh(self, command: str) -> None:
        done = subprocess.run(["bash", str(FLINK_SH), command], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/flink.sh {command} failed: {done.stderr[-3000:]}")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://{self.rest}{path}", timeout=5) as answer:
            return json.load(answer)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"http://{self.rest}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer)

    def cancel(self, jid: str) -> None:
        request = urllib.request.Request(f"http://{self.rest}/jobs/{jid}?mode=cancel", method="PATCH")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def runner_flags(self, parallelism: int = 2, checkpoint_ms: int = 2000) -> list[str]:
        """The flags that run a ``pipelines`` command's job on this cluster."""
        return [
            "--runner=FlinkRunner",
            f"--flink_master={self.rest}",
            f"--parallelism={parallelism}",
            f"--checkpointing_interval={checkpoint_ms}",
            "--experiments=disable_logging_submission_environment",
        ]

    def running_job(self) -> str | None:
        """The id of a RUNNING job, if any."""
        running = [j["jid"] for j in self.get("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        return str(running[0]) if running else None

    def taskmanager_pid(self) -> int:
        return int(self._pids("flink-gem-taskexecutor.pid")[0])

    def _pids(self, name: str) -> list[str]:
        path = self.state / "run" / name
        return path.read_text().split() if path.is_file() else []

    def diagnosis(self, log_lines: int = 40) -> str:
        """What a stuck job looks like from the cluster: each job's vertices with the records they
        read and wrote, its checkpoint counts and latest failure, and the last warnings and errors
        of the TaskManagers' and the worker pool's logs (a failed test's message shows it)."""
        parts = []
        for job in self.get("/jobs/overview")["jobs"]:
            jid = job["jid"]
            detail = self.get(f"/jobs/{jid}")
            parts.append(f"job {jid} {job['state']} for {job['duration'] / 1000:.0f} s")
            for vertex in detail.get("vertices", []):
                m = vertex.get("metrics", {})
                parts.append(
                    f"  {vertex['status']:<9} read {m.get('read-records', '?'):>7} wrote"
                    f" {m.get('write-records', '?'):>7}  {vertex['name'][:110]}"
                )
            checkpoints = self.get(f"/jobs/{jid}/checkpoints")
            parts.append(f"  checkpoints {checkpoints.get('counts')}")
            failed = (checkpoints.get("latest") or {}).get("failed")
            if failed:
                parts.append(f"  latest failed checkpoint: {failed.get('failure_message')}")
        for path in sorted((self.state / "log").glob("*")):
            if path.suffix in (".log", ".out") and ("taskexecutor" in path.name or "worker-pool" in path.name):
                lines = path.read_text(errors="replace").splitlines()
                noted = [line for line in lines if any(w in line for w in ("WARN", "ERROR", "Exception", "Error"))]
                parts.append(f"--- {path.name}: last {log_lines} of {len(noted)} warnings/errors")
                parts.extend(line[:400] for line in noted[-log_lines:])
        return "\n".join(parts)

    def work_pids(self) -> list[str]:
        """The processes that do a job's work: the TaskManagers, the SDK worker pool and every
        process below it (the SDK workers)."""
        return sorted(
            p for p, name in self.processes().items() if name in ("taskexecutor", "worker-pool", "sdk-worker")
        )

    def processes(self) -> dict[str, str]:
        """Every process of the cluster by pid, named after its pid file (standalonesession,
        taskexecutor, jobserver, worker-pool), and the worker pool's SDK workers (sdk-worker)."""
        named = {
            pid: f.stem.replace("flink-gem-", "")
            for f in (self.state / "run").glob("*.pid")
            for pid in f.read_text().split()
        }
        pool = [p for p, name in named.items() if name == "worker-pool"]
        for pid in tree_pids(int(pool[0])) if pool else []:
            named.setdefault(pid, "sdk-worker")
        return named


@contextmanager
def own_flink(state: Path, slots: int = 1, **env: str) -> Iterator[OwnFlink]:
    """A cluster of two TaskManagers of ``slots`` slots each, an SDK worker pool and a standing job
    server on free ports, its files under ``state``; ``env``: more scripts/flink.sh settings (no
    warm-up jobs unless ``FLINK_WARM_JOBS`` is given: its users run jobs of their own). Stopped
    (by pid) on exit."""
    port = free_port()
    full = os.environ | {
        "FLINK_STATE": str(state),
        "GEM_FLINK_HOME": str(flink_home()),
        "FLINK_REST_PORT": str(port),
        "FLINK_RPC_PORT": str(free_port()),
        "FLINK_JOB_PORT": str(free_port()),
        "FLINK_POOL_PORT": str(free_port()),
        "FLINK_SLOTS": str(slots),
        "FLINK_WARM_JOBS": "0",
        **env,
    }
    cluster = OwnFlink(full, state, f"127.0.0.1:{port}")
    try:
        cluster.sh("up")
        yield cluster
    finally:
        cluster.sh("down")


def cpu_seconds(pids: list[str]) -> dict[str, float]:
    """The CPU seconds (user + system) each of ``pids`` has used so far (a process gone is left out)."""
    found = {pid: _cpu_seconds(pid) for pid in pids}
    return {pid: s for pid, s in found.items() if s is not None}


def cpu_used(before: dict[str, float], after: dict[str, float]) -> float:
    """The CPU seconds used between two :func:`cpu_seconds` readings: a process new in ``after``
    counts whole, one gone from it counts nothing past ``before``."""
    return sum(s - before.get(pid, 0.0) for pid, s in after.items())


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


def stop_job(job: subprocess.Popen[Any], cluster: OwnFlink | None) -> None:
    """End a ``pipelines`` job started in a session of its own: on Flink, cancel it on the cluster first
    (its slots are free again on return); then SIGTERM, SIGKILL after 20 s."""
    if cluster is not None:
        deadline = time.time() + 60
        while (jid := cluster.running_job()) and time.time() < deadline:
            cluster.cancel(jid)
            time.sleep(1)
    if job.poll() is not None:
        return
    os.killpg(job.pid, signal.SIGTERM)
    try:
        job.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
