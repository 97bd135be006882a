"""Flink's own metrics reach Prometheus: the local cluster (`make flink-up`) runs the Prometheus reporter
of its distribution (deploy/flink/config.yaml.in), and a real Prometheus scrapes it through the "flink"
job of deploy/prometheus/prometheus.yml, targets as written there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.errors import ConfigError
from pipelines.jobservers import reachable
from tests.monitoring.prom import DEPLOY, running_prometheus
from tests.streaming.test_metrics import wait_for

pytestmark = pytest.mark.integration

FLINK_MASTER = "127.0.0.1:8081"


def _flink_targets() -> list[str]:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "flink"]
    return [t for static in job["static_configs"] for t in static["targets"]]


def test_prometheus_scrapes_flink(tmp_path: Path) -> None:
    try:
        reachable(FLINK_MASTER, "--flink_master", "run `make flink-up`")
    except ConfigError as exc:
        pytest.fail(f"the local Flink cluster is down: {exc}")
    targets = _flink_targets()
    with running_prometheus(tmp_path / "prometheus", {"flink": targets}) as prometheus:

        def scraped() -> dict[str, str] | None:
            health = {t["scrapeUrl"]: t["health"] for t in prometheus.targets()}
            return health if health and all(h == "up" for h in health.values()) else None

        what = "Flink scraped (a cluster started without the reporter: make flink-down flink-up)"
        health = wait_for(scraped, 120, what)
        assert len(health) == len(targets) == 3, health  # one JobManager, two TaskManagers
        managers = wait_for(
            lambda: prometheus.values('flink_jobmanager_numRegisteredTaskManagers{job="flink"}'),
            60,
            "JobManager metric",
        )
        assert managers == {"flink": 2.0}
        heap = prometheus.values('sum by (job) (flink_taskmanager_Status_JVM_Memory_Heap_Used{job="flink"})')
        assert heap["flink"] > 0
        assert not prometheus.alerts("JobDown", state="pending") and not prometheus.alerts("JobDown")
