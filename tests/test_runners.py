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
        ("FlinkRunner", ["--flink_master=127.0.0.1:{port}", "--flink_job_server_jar={jar}"], "--flink_master"),
        ("FlinkRunner", ["--flink_master=localhost:8081", "--flink_submit_uber_jar"], "--flink_submit_uber_jar"),
        ("SparkRunner", [], "--spark_job_server_jar"),
        ("SparkRunner", ["--spark_job_server_jar=/no/such.jar"], "--spark_job_server_jar"),
        ("SparkRunner", ["--spark_master_url=yarn", "--spark_job_server_jar={jar}"], "--spark_master_url"),
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
    # as on a machine without `make prism`, `make flink-jobserver` and `make spark-jobserver`
    monkeypatch.setattr("pipelines.runners.default_prism", lambda: None)
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: None)
    monkeypatch.setattr("pipelines.jobservers.default_spark_jar", lambda: None)
    port = _free_port()
    with pytest.raises(ConfigError) as err:
        pipeline_options(_args(runner), [f.format(port=port, jar=__file__) for f in flags])
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
        main(["features", "--input", "x.jsonl", "--output", "o", "--runner", "NoSuchRunner"])
    assert "--runner" in capsys.readouterr().err


def test_jvm_runner_errors_name_the_make_target(monkeypatch, tmp_path) -> None:
    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: None)
    with pytest.raises(ConfigError, match="make flink-jobserver"):
        pipeline_options(_args("FlinkRunner"), ["--flink_master=localhost:8081"])
    with pytest.raises(ConfigError, match="make flink-up") as err:
        pipeline_options(
            _args("FlinkRunner"), [f"--flink_master=127.0.0.1:{_free_port()}", f"--flink_job_server_jar={jar}"]
        )
    assert err.value.flag == "--flink_master"
    monkeypatch.setattr("pipelines.jobservers.default_spark_jar", lambda: None)
    with pytest.raises(ConfigError, match="make spark-jobserver"):
        pipeline_options(_args("SparkRunner"), ["--spark_master_url=local[2]"])
    with pytest.raises(ConfigError, match="spark://") as err:
        pipeline_options(
            _args("SparkRunner"),
            [f"--spark_master_url=spark://127.0.0.1:{_free_port()}", f"--spark_job_server_jar={jar}"],
        )
    assert err.value.flag == "--spark_master_url"


@pytest.fixture(autouse=True)
def _no_flink_cluster(monkeypatch) -> None:
    """As on a machine where no Flink cluster answers (a test that needs one says what it offers)."""
    monkeypatch.setattr("pipelines.jobservers.cluster_offers", lambda master: None)


POOL = {"gem.beam.job-endpoint": "127.0.0.1:8099", "gem.beam.worker-pool": "127.0.0.1:50000"}


def test_flink_goes_through_the_clusters_job_server_and_worker_pool(monkeypatch, tmp_path) -> None:
    from pipelines.jobservers import default_options

    built = str(tmp_path / "built.jar")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: built)
    monkeypatch.setattr("pipelines.jobservers.cluster_offers", lambda master: dict(POOL))
    external = {"environment_type": "EXTERNAL", "environment_config": "127.0.0.1:50000"}
    assert default_options("FlinkRunner", {"flink_master": "localhost:8081"}) == {
        "job_endpoint": "127.0.0.1:8099",
        **external,
        "environment_cache_millis": "60000",
    }
    # LOOPBACK only when asked; a given jar means a job server of its own
    asked = default_options("FlinkRunner", {"flink_master": "localhost:8081", "environment_type": "LOOPBACK"})
    assert asked == {"job_endpoint": "127.0.0.1:8099"}
    own = default_options("FlinkRunner", {"flink_master": "flink.prod:8081", "flink_job_server_jar": built})
    assert own == {"flink_job_server_jar": built, **external, "environment_cache_millis": "60000"}


def test_a_local_flink_cluster_without_a_worker_pool_is_refused(monkeypatch, tmp_path) -> None:
    from pipelines.jobservers import default_options

    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: str(tmp_path / "built.jar"))
    monkeypatch.setattr("pipelines.jobservers.cluster_offers", lambda master: {})
    with pytest.raises(ConfigError, match="make flink-down flink-up") as err:
        default_options("FlinkRunner", {"flink_master": "127.0.0.1:8081"})
    assert err.value.flag == "--environment_type"
    # a remote one keeps Beam's default environment (a Docker container per worker)
    remote = default_options("FlinkRunner", {"flink_master": "flink.prod:8081"})
    assert remote == {"flink_job_server_jar": str(tmp_path / "built.jar")}


def test_embedded_flink_and_local_spark_run_loopback(monkeypatch, tmp_path) -> None:
    from pipelines.jobservers import default_options

    built = str(tmp_path / "built.jar")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: built)
    monkeypatch.setattr("pipelines.jobservers.default_spark_jar", lambda: built)
    loopback = {"environment_type": "LOOPBACK"}
    assert default_options("FlinkRunner", {"flink_master": "[local]"})["environment_type"] == "LOOPBACK"
    assert default_options("FlinkRunner", {}) == {"flink_job_server_jar": built, **loopback}  # Beam's [auto]
    assert default_options("FlinkRunner", {"flink_master": "flink.prod:8081"}) == {"flink_job_server_jar": built}
    assert default_options("SparkRunner", {"spark_master_url": "local[2]"}) == {
        "spark_job_server_jar": built,
        **loopback,
    }
    assert default_options("SparkRunner", {"spark_master_url": "spark://10.0.0.5:7077"}) == {
        "spark_job_server_jar": built
    }
    assert default_options("PrismRunner", {}) == {}


def test_paths_a_remote_clusters_workers_cannot_see_are_refused(monkeypatch) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.jobservers import check_worker_paths

    offers = {**POOL, "gem.beam.shared-paths": "/mnt/shared, s3://ignored"}
    monkeypatch.setattr("pipelines.jobservers.cluster_offers", lambda master: offers)
    remote = PipelineOptions(["--flink_master=flink.prod:8081", "--environment_type=EXTERNAL"])
    check_worker_paths(remote, {"--input": ["s3://bucket/events.parquet"], "--output": ["/mnt/shared/out"]})
    with pytest.raises(ConfigError, match="do not see") as err:
        check_worker_paths(remote, {"--input": ["/mnt/shared/in"], "--output": ["/home/me/out"]})
    assert err.value.flag == "--output"
    with pytest.raises(ConfigError, match="/mnt/shared"):  # a prefix, not a string prefix
        check_worker_paths(remote, {"--output": ["/mnt/sharedother/out"]})
    # workers on this host, or the work in this process, see this machine's disk
    check_worker_paths(PipelineOptions(["--flink_master=127.0.0.1:8081"]), {"--output": ["/home/me/out"]})
    loopback = PipelineOptions(["--flink_master=flink.prod:8081", "--environment_type=LOOPBACK"])
    check_worker_paths(loopback, {"--output": ["/home/me/out"]})


def test_a_cluster_runners_relative_paths_become_absolute(tmp_path, monkeypatch) -> None:
    from pathlib import Path

    from pipelines.runners import absolute_paths, worker_paths

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(runner="FlinkRunner", input=["a.parquet", "s3://b/c"], output="out", model=Path("m"))
    absolute_paths(args)
    assert (args.input, args.output, args.model) == (
        [str(tmp_path / "a.parquet"), "s3://b/c"],
        str(tmp_path / "out"),
        tmp_path / "m",
    )
    assert worker_paths(args)["--model"] == [str(tmp_path / "m")]
    local = argparse.Namespace(runner="DirectRunner", output="out")
    absolute_paths(local)
    assert local.output == "out"


def test_given_jar_and_environment_reach_beam_as_given(monkeypatch, tmp_path) -> None:
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions

    jar = tmp_path / "mine.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: "/built.jar")
    options = pipeline_options(
        _args("FlinkRunner"), ["--flink_master=[local]", f"--flink_job_server_jar={jar}", "--environment_type=EXTERNAL"]
    )
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar == str(jar)
    assert options.view_as(PortableOptions).environment_type == "EXTERNAL"


def test_flink_options_pass_through(monkeypatch, tmp_path) -> None:
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions

    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: str(jar))
    options = pipeline_options(
        _args("FlinkRunner"), ["--flink_master=[local]", "--parallelism=2", "--checkpointing_interval=5000"]
    )
    flink = options.view_as(FlinkRunnerOptions)
    assert (flink.parallelism, flink.flink_job_server_jar) == (2, str(jar))
    # Flink's options unknown to Python reach the job server, which describes them at submission.
    assert options.get_all_options(retain_unknown_options=True)["checkpointing_interval"] == "5000"
    assert options.view_as(PortableOptions).environment_type == "LOOPBACK"


def test_the_default_jars_follow_deploy_versions_env() -> None:
    from pipelines.jobservers import flink_jar_name, spark_jar_name, versions

    pinned = versions()
    assert flink_jar_name() == (
        f"beam-runners-flink-{pinned['FLINK_MINOR']}-job-server-{pinned['BEAM_FLINK_RUNNER_VERSION']}.jar"
    )
    assert spark_jar_name() == f"beam-runners-spark-3-job-server-{pinned['BEAM_SPARK_RUNNER_VERSION']}.jar"


def test_portable_jobs_outlive_beams_five_minute_job_server_timeout(monkeypatch, tmp_path) -> None:
    """Beam puts --job_server_timeout on a job's state stream: 300 s would end any longer job (seen on Prism)."""
    from apache_beam.options.pipeline_options import PortableOptions

    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr("pipelines.jobservers.default_flink_jar", lambda: str(jar))
    options = pipeline_options(_args("FlinkRunner"), ["--flink_master=[local]"])
    assert options.view_as(PortableOptions).job_server_timeout >= 30 * 86_400
    given = pipeline_options(_args("FlinkRunner"), ["--flink_master=[local]", "--job_server_timeout=60"])
    assert given.view_as(PortableOptions).job_server_timeout == 60
