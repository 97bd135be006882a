"""Dataflow without a cloud: ``--runner DataflowRunner --dry_run=True`` builds each batch pipeline's job
graph offline (no network, no credentials) and the command writes it to ``OUTPUT/dataflow_job/``.

The job-graph tests need apache-beam[gcp] (the ``dataflow`` extra, part of ``dev``): they fail,
naming the fix, without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.cli import main
from tests.precompute.conftest import World
from tests.similarity.data import T0_MS, clustered, rep_table, write_representations

pytestmark = pytest.mark.integration
IMAGE = "us-docker.pkg.dev/my-project/gem/gem-pipelines:0.1.0"
GCP = ["--project", "my-project", "--region", "us-central1", "--temp_location", "gs://my-bucket/tmp"]
DATAFLOW = ["--runner", "DataflowRunner", *GCP, "--dry_run=True", "--sdk_container_image", IMAGE]


@pytest.fixture(scope="module")
def gcp_extra() -> None:
    try:
        import apache_beam.runners.dataflow.internal.apiclient  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"apache-beam[gcp] is not installed ({exc}): run `make setup` (dev includes the dataflow extra)")


def _job(out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert "nothing was submitted" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["dataflow_job"]  # no outputs, no summary.json
    assert (out / "dataflow_job" / "pipeline.pb").stat().st_size > 1000
    job = json.loads((out / "dataflow_job" / "job.json").read_text())
    assert (job["type"], job["project"], job["region"]) == ("JOB_TYPE_BATCH", "my-project", "us-central1")
    assert job["sdk_container_images"] == [IMAGE]
    assert job["options"]["sdk_container_image"] == IMAGE
    return job


def _names(job: dict[str, Any]) -> set[str]:
    return {t["name"] for t in job["transforms"]}


def test_features_job_graph(gcp_extra: None, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "features"
    assert (
        main(["features", "--input", str(world.events), "--output", str(out), *DATAFLOW, "--job_name=gem-features"])
        == 0
    )
    job = _job(out, capsys)
    assert job["name"] == "gem-features"
    assert {"ReadEvents", "BuildHistories", "WriteDeadLetters", "WriteSummary"} <= _names(job)


@pytest.mark.parametrize("flag", ["--s3_secret_access_key=hunter2", "--s3_session_token=hunter2"])
def test_a_credential_flag_is_refused_before_anything_is_written(
    gcp_extra: None, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """Beam's only secret-named options would put the credential into the job's options (sent to every
    worker, shown in the job's graph): refused, naming the environment variable to use instead."""
    out = tmp_path / "features"
    assert main(["features", "--input", str(world.events), "--output", str(out), *DATAFLOW, flag]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag.split('=')[0]}:" in err and "in the environment" in err and "hunter2" not in err, err
    assert not out.exists()


def test_precompute_job_graph(
    gcp_extra: None, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "precompute"
    base = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    assert main([*base, "--model", str(world.model), "--output", str(out), "--device", "cpu", *DATAFLOW]) == 0
    names = _names(_job(out, capsys))
    assert any("RunInference" in n for n in names), sorted(names)


def test_index_job_graph(gcp_extra: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vectors = clustered(300, 8, seed=3)
    reps = write_representations(
        tmp_path / "reps", [rep_table(list(range(300)), [None] * 300, vectors, computed_at_ms=T0_MS)]
    )
    out = tmp_path / "index"
    assert main(["index", "--representations", str(reps), "--output", str(out), "--shards", "2", *DATAFLOW]) == 0
    assert {"TrainQuantizer", "AddShards", "FinishIndex"} <= _names(_job(out, capsys))
    assert not list(out.glob("*.faiss"))


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--runner", "DataflowRunner", *GCP, "--dry_run=False"], "--dry_run"),
        (["--runner", "DirectRunner", "--dry_run=True"], "--dry_run"),
    ],
)
def test_dry_run_misuse_names_the_flag(flags: list[str], flag: str, tmp_path: Path, capsys) -> None:
    assert main(["features", "--input", "x.jsonl", "--output", str(tmp_path / "o"), *flags]) == 2
    assert flag in capsys.readouterr().err


def test_redaction() -> None:
    """The job file's options pass the project's one redaction rule (pipelines.redact)."""
    from pipelines.redact import redact_fields

    found = redact_fields(
        {"redis_url": "redis://:pw@h:6379/0", "api_token": "t", "x": ["a://u:p@h"], "password": None, "token_budget": 9}
    )
    assert found == {
        "redis_url": "redis://:***@h:6379/0",
        "api_token": "***",
        "x": ["a://u:***@h"],
    } | {"password": None, "token_budget": 9}
