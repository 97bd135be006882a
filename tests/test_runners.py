"""Runner misconfiguration fails at construction, naming the flag and the fix."""

from __future__ import annotations

import argparse
import socket

import pytest

from pipelines.errors import ConfigError
from pipelines.runners import pipeline_options, runner_for


def _args(runner: str, workers: int = 1) -> argparse.Namespace:
    return argparse.Namespace(runner=runner, direct_running_mode=None, direct_num_workers=workers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("runner", "flags", "flag"),
    [
        ("FlinkRunner", [], "--flink_job_server_jar"),
        ("FlinkRunner", ["--flink_master=[local]", "--flink_job_server_jar=/no/such.jar"], "--flink_job_server_jar"),
        ("FlinkRunner", ["--flink_master=127.0.0.1:{port}"], "--flink_master"),
        ("PortableRunner", [], "--job_endpoint"),
        ("PortableRunner", ["--job_endpoint=127.0.0.1:{port}"], "--job_endpoint"),
        ("PrismRunner", [], "--prism_location"),
        ("DataflowRunner", ["--region=us-central1", "--temp_location=gs://b/t"], "--project"),
        ("DataflowRunner", ["--project=p", "--temp_location=gs://b/t"], "--region"),
        ("DataflowRunner", ["--project=p", "--region=r"], "--temp_location"),
        ("DataflowRunner", ["--project=p", "--region=r", "--temp_location=/tmp/x"], "--temp_location"),
    ],
)
def test_misconfigured_runner_names_the_flag(runner: str, flags: list[str], flag: str, monkeypatch) -> None:
    monkeypatch.setattr("pipelines.runners.default_prism", lambda: None)  # as on a machine without `make prism`
    port = _free_port()
    with pytest.raises(ConfigError) as err:
        pipeline_options(_args(runner), [f.format(port=port) for f in flags])
    assert err.value.flag == flag
    assert "Fix:" in str(err.value)


def test_local_runner_is_in_process_and_network_free() -> None:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    assert isinstance(runner_for(_args("DirectRunner")), FnApiRunner)
    options = pipeline_options(_args("DirectRunner")).get_all_options()
    assert options["direct_running_mode"] == "in_memory"


def test_bad_worker_count() -> None:
    with pytest.raises(ConfigError, match="--direct_num_workers"):
        pipeline_options(_args("DirectRunner", workers=0))


def test_unknown_runner_is_rejected_by_the_cli(capsys) -> None:
    from pipelines.cli import main

    with pytest.raises(SystemExit):
        main(["features", "--input", "x.jsonl", "--output", "o", "--runner", "SparkRunner"])
    assert "--runner" in capsys.readouterr().err
