"""Fixtures for the runner tests: the project's Flink cluster (``make flink-up``), a Beam job server
standing for the whole session in front of it, and row-set comparison of Parquet outputs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from pipelines.errors import ConfigError
from pipelines.jobservers import default_flink_jar, default_spark_jar, reachable
from tests.precompute.conftest import world  # noqa: F401  (the precompute tests' generated world)

FLINK_MASTER = "127.0.0.1:8081"
#: Beam flags every Flink test passes: the local cluster, two task slots, the SDK harness in this
#: process; the submission environment (a pip freeze) is not logged, which saves seconds per job.
FLINK = ["--flink_master", FLINK_MASTER, "--parallelism", "2", "--experiments=disable_logging_submission_environment"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def flink() -> str:
    """The local Flink cluster's REST address; FAILS (never skips) when it is down or the jar is missing."""
    if not default_flink_jar():
        pytest.fail("no Flink job server jar: run `make flink-jobserver`")
    try:
        reachable(FLINK_MASTER, "--flink_master", "run `make flink-up`")
    except ConfigError as exc:
        pytest.fail(f"the local Flink cluster is down: {exc}")
    return FLINK_MASTER


@pytest.fixture(scope="session")
def spark_jar() -> str:
    found = default_spark_jar()
    if not found:
        pytest.fail("no Spark job server jar: run `make spark-jobserver`")
    return found


@pytest.fixture(scope="session")
def flink_job_endpoint(flink: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Beam Flink job server for the session (``--runner PortableRunner --job_endpoint``): one JVM
    start and one warm-up for every job, where FlinkRunner starts a job server per run."""
    port = _free_port()
    log = tmp_path_factory.mktemp("jobserver") / "jobserver.log"
    cmd = ["java", "-Xmx768m", "-jar", str(default_flink_jar()), "--flink-master", flink, "--job-host", "127.0.0.1"]
    cmd += ["--job-port", str(port), "--artifact-port", "0", "--expansion-port", "0"]
    cmd += ["--artifacts-dir", str(log.parent / "artifacts")]
    with log.open("wb") as sink:
        server = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                pytest.fail(f"the Flink job server exited ({server.returncode}): {log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the Flink job server did not answer within 120 s: {log}")
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def rows(folder: Path, kind: str, drop: tuple[str, ...] = ()) -> list[str]:
    """Every row of ``folder/kind/`` (hive-partitioned Parquet) as canonical JSON, sorted: a multiset
    of rows that ignores file layout and row order."""
    table = ds.dataset(folder / kind, format="parquet", partitioning="hive").to_table()
    table = table.drop_columns([c for c in drop if c in table.column_names])
    return sorted(json.dumps(r, sort_keys=True, default=_plain) for r in table.to_pylist())


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else repr(value)
