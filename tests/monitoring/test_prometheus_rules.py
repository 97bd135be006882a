"""deploy/prometheus passes promtool: the scrape config, the rules, and the rules' unit tests
(deploy/prometheus/tests/*.yml), through scripts/prometheus.sh check as `make prometheus-check` runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.prom import DEPLOY, ROOT, SCRIPT, server_config

pytestmark = pytest.mark.integration


def _check(**env: str) -> subprocess.CompletedProcess[str]:
    if not shutil.which("promtool"):
        pytest.fail("Debian's prometheus (promtool) is not installed: run `make prometheus`")
    return subprocess.run(
        ["bash", str(SCRIPT), "check"], env=os.environ | env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )


def test_config_rules_and_rule_tests_pass_promtool() -> None:
    done = _check()
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "is valid prometheus config file syntax" in out
    rules = yaml.safe_load((DEPLOY / "rules" / "gem.yml").read_text())
    assert f"SUCCESS: {sum(len(g['rules']) for g in rules['groups'])} rules found" in out
    assert out.count("SUCCESS") >= 3 and "FAILED" not in out


def test_a_broken_config_fails_the_check(tmp_path: Path) -> None:
    config = server_config({"stream": ["127.0.0.1:1"]})
    config["scrape_configs"][0]["scrape_interval"] = "soon"
    (tmp_path / "p.yml").write_text(yaml.safe_dump(config))
    done = _check(GEM_PROMETHEUS_CONFIG=str(tmp_path / "p.yml"))
    assert done.returncode != 0 and "soon" in done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = yaml.safe_load((DEPLOY / "rules" / "gem.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "tests" / "gem_test.yml").read_text())
    tested = {
        a["alertname"]
        for t in tests["tests"]
        for a in t.get("alert_rule_test", [])
        if a.get("exp_alerts")  # a test that sees it fire
    }
    assert alerts == tested, f"alerts never seen firing in a unit test: {alerts - tested}"
    assert {"JobDown", "ConsumerLagGrowing", "ConsumerLagOld", "FreshnessP99OverBudget"} <= alerts
    assert {"DeadLetterRate", "SolarisExactShareLow"} <= alerts
