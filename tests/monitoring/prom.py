"""A real Prometheus server for the monitoring tests: Debian's prometheus (`make prometheus`), started by
scripts/prometheus.sh on a port and a data folder of its own, with deploy/prometheus/prometheus.yml's jobs
and rules, its targets pointed at the test's ports, scraping and evaluating every second."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.streaming.test_metrics import _free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
SCRIPT = ROOT / "scripts" / "prometheus.sh"


def server_config(targets: dict[str, list[str]], interval_s: int = 1) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with each job's targets replaced (jobs not named are dropped),
    absolute rule paths, and scrapes and rule evaluations every ``interval_s``."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update(
        scrape_interval=f"{interval_s}s", scrape_timeout=f"{interval_s}s", evaluation_interval=f"{interval_s}s"
    )
    config["rule_files"] = [str(DEPLOY / r) for r in config["rule_files"]]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    missing = set(targets) - set(jobs)
    assert not missing, f"deploy/prometheus/prometheus.yml has no scrape job {missing}"
    config["scrape_configs"] = [
        jobs[name] | {"static_configs": [{"targets": list(addresses)}]} for name, addresses in targets.items()
    ]
    return config


class Prometheus:
    """The HTTP API of a running server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """/api/v1/query: the instant vector's samples (``metric`` labels and ``value``)."""
        data = self._get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def values(self, expr: str) -> dict[str, float]:
        """Each sample's value keyed by its ``job`` label (or its whole label set)."""
        return {s["metric"].get("job", json.dumps(s["metric"])): float(s["value"][1]) for s in self.query(expr)}

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        """/api/v1/alerts: the alerts called ``name`` in ``state``."""
        return [
            a for a in self._get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name and a["state"] == state
        ]

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets")["activeTargets"])


@contextmanager
def running_prometheus(state: Path, targets: dict[str, list[str]]) -> Iterator[Prometheus]:
    """A server (scripts/prometheus.sh up) with :func:`server_config` for ``targets``; stopped at the end."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.fail("Debian's prometheus is not installed: run `make prometheus`")
    state.mkdir(parents=True, exist_ok=True)
    config, port = state / "prometheus.yml", _free_port()
    config.write_text(yaml.safe_dump(server_config(targets)))
    env = os.environ | {
        "PROMETHEUS_STATE": str(state),
        "GEM_PROMETHEUS_PORT": str(port),
        "GEM_PROMETHEUS_CONFIG": str(config),
    }
    up = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    try:
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=120)
