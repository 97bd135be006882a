"""The features pipeline on Spark 3.5 (``local[2]`` inside Beam's Spark job server, the jar built by
``make spark-jobserver``) writes what the local runner writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.cli import main
from tests.precompute.conftest import World
from tests.runners.conftest import rows

pytestmark = pytest.mark.integration


def test_features_on_spark_equals_local(spark_jar: str, world: World, tmp_path: Path) -> None:
    out = tmp_path / "spark"
    spark = ["--runner", "SparkRunner", "--spark_master_url", "local[2]"]
    spark += ["--experiments=disable_logging_submission_environment"]
    assert main(["features", "--input", str(world.events), "--num-shards", "4", "--output", str(out), *spark]) == 0
    for kind in ("histories", "training_examples", "dead_letters"):
        assert rows(out, kind) == rows(world.features, kind), kind
    summary, local = (json.loads((d / "summary.json").read_text()) for d in (out, world.features))
    run_only = ("seconds", "max_event_time_ms")  # the run's duration and its clock's bound, not the data's
    assert {k: v for k, v in summary.items() if k not in run_only} == {
        k: v for k, v in local.items() if k not in run_only
    }
