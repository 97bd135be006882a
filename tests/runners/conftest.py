"""Fixtures for the runner tests: the project's Flink cluster (``make flink-up``: its standing job
server and SDK worker pool included), and row-set comparison of Parquet outputs."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from pipelines.errors import ConfigError
from pipelines.jobservers import default_flink_jar, default_spark_jar, reachable
from tests.precompute.conftest import world  # noqa: F401  (the precompute tests' generated world)

FLINK_MASTER = "127.0.0.1:8081"
#: Beam flags every Flink test passes: the local cluster at parallelism 2 (a subtask on each of its
#: two TaskManagers); the submission environment (a pip freeze) is not logged, which saves seconds.
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


def rows(folder: Path, kind: str, drop: tuple[str, ...] = ()) -> list[str]:
    """Every row of ``folder/kind/`` (hive-partitioned Parquet) as canonical JSON, sorted: a multiset
    of rows that ignores file layout and row order."""
    table = ds.dataset(folder / kind, format="parquet", partitioning="hive").to_table()
    table = table.drop_columns([c for c in drop if c in table.column_names])
    return sorted(json.dumps(r, sort_keys=True, default=_plain) for r in table.to_pylist())


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else repr(value)
