"""Beam's JVM job servers (Flink, Spark): the jars this project builds, and the checks before a run.

Maven Central serves no ``beam-runners-<engine>-job-server`` jar, so ``make flink-jobserver``
and ``make spark-jobserver`` shade one each from Beam's runner artifacts into ``.cache/jars/``,
named after the runner version in ``deploy/versions.env``. Without ``--flink_job_server_jar``
Beam 2.77 would download a job server at run time (for Flink 2.2, which the local 1.19 cluster
cannot run), so :func:`default_options` adds the built jar unless the flag is
given; :func:`validate_flink` and :func:`validate_spark` stop before any work when the jar is
missing or the master does not answer, naming the make target or the flag that fixes it.

A Flink cluster says what it offers Beam in its own configuration, which :func:`cluster_offers`
reads from its REST API (``/jobmanager/config``): ``gem.beam.job-endpoint`` (a standing job
server, which then submits the job: no job server JVM started per job),
``gem.beam.worker-pool`` (the SDK worker pool the TaskManagers' harnesses ask for workers:
``--environment_type EXTERNAL``) and ``gem.beam.shared-paths`` (the path prefixes its workers
see as the submitter does). ``make flink-up`` starts and advertises both
(deploy/flink/config.yaml.in); so does the Kubernetes manifest (deploy/flink/flinkdeployment.yaml).
LOOPBACK (the Python work in the submitting process) only when asked, or for an embedded
``[local]`` Flink or a ``local[N]`` Spark; :func:`check_worker_paths` refuses inputs and outputs
that a cluster's workers cannot see, before any work.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    PipelineOptions,
    SparkRunnerOptions,
)

from pipelines.errors import ConfigError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
VERSIONS = REPO / "deploy" / "versions.env"
JARS = REPO / ".cache" / "jars"
#: Beam's names for an embedded Flink (a MiniCluster inside the job server's JVM).
EMBEDDED_FLINK = ("[local]", "[auto]")
LOCAL_SPARK = re.compile(r"^local(\[.+\])?$")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
#: Keys of a Flink cluster's configuration that say what it offers Beam (see the module's doc).
JOB_ENDPOINT_KEY = "gem.beam.job-endpoint"
WORKER_POOL_KEY = "gem.beam.worker-pool"
SHARED_PATHS_KEY = "gem.beam.shared-paths"
#: With a worker pool: keep each TaskManager's SDK worker for the whole job (Flink runs a batch
#: job's stages one after another; without a cache each stage would start a new worker process).
POOL_OPTIONS = {"environment_cache_millis": "60000"}
#: The job servers' own options (FlinkPipelineOptions, SparkPipelineOptions of the 2.62 runners),
#: which the SDK learns from the job server at submission: they pass through as given.
FLINK_OPTIONS = (
    "checkpointing_interval", "checkpointing_mode", "checkpoint_timeout_millis", "min_pause_between_checkpoints",
    "num_concurrent_checkpoints", "fail_on_checkpointing_errors", "finish_bundle_before_checkpointing",
    "unaligned_checkpoint_enabled", "force_unaligned_checkpoint_enabled", "shutdown_sources_after_idle_ms",
    "number_of_execution_retries", "job_check_interval_in_secs", "attached_mode", "execution_retry_delay",
    "object_reuse", "operator_chaining", "state_backend_factory", "state_backend", "state_backend_storage_path",
    "disable_metrics", "retain_externalized_checkpoints_on_cancellation", "max_bundle_size", "max_bundle_time_mills",
    "latency_tracking_interval", "auto_watermark_interval", "execution_mode_for_batch", "savepoint_path",
    "allow_non_restored_state", "report_checkpoint_duration", "re_iterable_group_by_key_result", "faster_copy",
    "flink_conf_dir", "file_input_split_max_size_m_b", "enable_stable_input_drain",
)  # fmt: skip
SPARK_OPTIONS = (
    "batch_interval_millis", "min_read_time_millis", "max_records_per_batch", "read_time_percentage",
    "checkpoint_duration_millis", "bundle_size", "uses_provided_spark_context", "streaming_timeout_ms",
)  # fmt: skip


def versions(path: Path = VERSIONS) -> dict[str, str]:
    """``deploy/versions.env`` as a dict (KEY=value lines; # comments); empty when absent."""
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def _first_file(candidates: Sequence[str | Path]) -> str | None:
    return next((str(c) for c in candidates if c and Path(c).is_file()), None)


def flink_jar_name() -> str:
    found = versions()
    return (
        f"beam-runners-flink-{found.get('FLINK_MINOR', '1.19')}-job-server-"
        f"{found.get('BEAM_FLINK_RUNNER_VERSION', '2.62.0')}.jar"
    )


def spark_jar_name() -> str:
    found = versions()
    return f"beam-runners-spark-3-job-server-{found.get('BEAM_SPARK_RUNNER_VERSION', '2.62.0')}.jar"


def default_flink_jar() -> str | None:
    """The Flink job server built by ``make flink-jobserver`` (or ``$GEM_FLINK_JOB_SERVER_JAR``), if any."""
    return _first_file([os.environ.get("GEM_FLINK_JOB_SERVER_JAR", ""), JARS / flink_jar_name()])


def default_spark_jar() -> str | None:
    """The Spark job server built by ``make spark-jobserver`` (or ``$GEM_SPARK_JOB_SERVER_JAR``), if any."""
    return _first_file([os.environ.get("GEM_SPARK_JOB_SERVER_JAR", ""), JARS / spark_jar_name()])


def is_local_address(address: str) -> bool:
    host = re.sub(r"^https?://", "", address.strip()).rsplit(":", 1)[0].strip("[]")
    return host in LOCAL_HOSTS or host.startswith("127.")


def rest_url(master: str) -> str:
    return master if re.match(r"^https?://", master) else f"http://{master}"


def cluster_offers(master: str) -> dict[str, str] | None:
    """The ``gem.beam.*`` entries of the configuration of the Flink cluster whose REST API is
    ``master``; None when it does not answer (:func:`validate_flink` then names the fix)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{rest_url(master)}/jobmanager/config", timeout=5) as answer:
            entries = json.load(answer)
    except (OSError, ValueError):
        return None
    return {e["key"]: str(e["value"]) for e in entries if str(e.get("key", "")).startswith("gem.beam.")}


def default_options(runner: str, given: Mapping[str, str | None]) -> dict[str, str]:
    """Project defaults for FlinkRunner/SparkRunner (added only where ``given`` lacks them): a Flink
    cluster's standing job server and worker pool when it offers them (:func:`cluster_offers`),
    else the built job server jar; LOOPBACK for an embedded Flink or a ``local[N]`` Spark."""
    if runner == "FlinkRunner":
        return _flink_defaults(given)
    if runner != "SparkRunner":
        return {}
    jar = default_spark_jar()
    master = given.get("spark_master_url") or "local[4]"
    found = {"spark_job_server_jar": jar} if jar else {}
    local = bool(LOCAL_SPARK.match(master)) or is_local_address(master)
    if local and "environment_type" not in given:
        found["environment_type"] = "LOOPBACK"
    return found


def _flink_defaults(given: Mapping[str, str | None]) -> dict[str, str]:
    jar = default_flink_jar()
    master = given.get("flink_master") or "[auto]"
    found = {"flink_job_server_jar": jar} if jar else {}
    if master in EMBEDDED_FLINK:
        return found | ({} if "environment_type" in given else {"environment_type": "LOOPBACK"})
    offers = cluster_offers(master)
    if offers is None:  # validate_flink names the fix
        return found
    if offers.get(JOB_ENDPOINT_KEY) and "flink_job_server_jar" not in given:
        found = {"job_endpoint": offers[JOB_ENDPOINT_KEY]}
    if "environment_type" in given:
        return found
    if offers.get(WORKER_POOL_KEY):
        pool = {"environment_type": "EXTERNAL", "environment_config": offers[WORKER_POOL_KEY]}
        return found | pool | {k: v for k, v in POOL_OPTIONS.items() if k not in given}
    if is_local_address(master):
        raise ConfigError(
            "--environment_type",
            f"the Flink cluster at {master} offers no SDK worker pool ({WORKER_POOL_KEY} in its configuration)",
            "restart it with `make flink-down flink-up`, or pass --environment_type EXTERNAL "
            "--environment_config HOST:PORT of a worker pool (LOOPBACK runs the Python work in this process)",
        )
    return found  # a remote cluster that offers no pool: Beam's default (a Docker container per worker)


def check_worker_paths(options: PipelineOptions, paths: Mapping[str, Sequence[str]]) -> None:
    """Refuse, before any work, an input or output (``{flag: [paths]}``) that the workers of a
    Flink cluster cannot see as the submitter does. Object-store and other URIs (``s3://``, ...) are
    seen by every worker; a local path is seen by the workers of a cluster on this host, and by a
    remote cluster's only under one of the prefixes it offers in ``gem.beam.shared-paths`` (a
    filesystem mounted at the same place on every machine). Relative paths were made absolute
    against the submitter's directory by the CLI (the workers run in another one). LOOPBACK runs
    the work here, so it sees what the submitter sees."""
    from apache_beam.options.pipeline_options import PortableOptions

    flink = options.view_as(FlinkRunnerOptions)
    master = flink.flink_master or "[auto]"
    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    if master in EMBEDDED_FLINK or is_local_address(master) or environment == "LOOPBACK":
        return
    local = [(flag, p) for flag, values in paths.items() for p in values if p and "://" not in p]
    if not local:
        return
    offered = (cluster_offers(master) or {}).get(SHARED_PATHS_KEY, "")
    prefixes = [f"{s.strip().rstrip('/')}/" for s in offered.split(",") if s.strip().strip("/")]
    for flag, path in local:
        if not any(os.path.abspath(path).startswith(prefix) for prefix in prefixes):
            raise ConfigError(
                flag,
                f"{path!r} is on this machine's disk, which the workers of the Flink cluster at {master} do not see",
                "use object storage (s3://BUCKET/...) or a path under a filesystem the cluster shares "
                f"({SHARED_PATHS_KEY} in its configuration: {offered or 'none'})",
            )


def runner_options(runner: str) -> tuple[str, ...]:
    """Options a JVM runner's job server adds to the Python SDK's at submission (Beam spelling)."""
    if runner == "FlinkRunner":
        return FLINK_OPTIONS
    if runner == "SparkRunner":
        return SPARK_OPTIONS
    if runner == "PortableRunner":
        return FLINK_OPTIONS + SPARK_OPTIONS
    return ()


def reachable(address: str, flag: str, fix: str) -> None:
    """Connect to ``host:port`` (an ``http://`` or ``spark://`` prefix is allowed) or raise ConfigError."""
    bare = re.sub(r"^[a-z]+://", "", address.strip()).split("/", 1)[0]
    host, _, port = bare.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=3):
            return
    except (OSError, ValueError) as exc:
        raise ConfigError(flag, f"{address!r} is not reachable ({exc})", fix) from exc


def _need_jar(value: str | None, flag: str, target: str) -> None:
    fix = f"build it with `make {target}` (into .cache/jars/) or pass {flag} PATH"
    if not value:
        raise ConfigError(flag, "no job server jar, and Beam would download one at run time", fix)
    if not Path(value).is_file():
        raise ConfigError(flag, f"{value!r} is not a file", fix)


def validate_flink(options: PipelineOptions) -> None:
    """The job server (a jar, or a standing one) is there and a cluster master (unless embedded) answers."""
    from apache_beam.options.pipeline_options import PortableOptions

    flink = options.view_as(FlinkRunnerOptions)
    if flink.flink_submit_uber_jar:
        raise ConfigError(
            "--flink_submit_uber_jar",
            "submits a jar that Beam downloads at run time",
            "leave it out: the job server built by `make flink-jobserver` submits to --flink_master",
        )
    endpoint = options.view_as(PortableOptions).job_endpoint
    if endpoint:
        reachable(endpoint, "--job_endpoint", "start the cluster's job server (`make flink-up`) or drop the flag")
    else:
        _need_jar(flink.flink_job_server_jar, "--flink_job_server_jar", "flink-jobserver")
    master = flink.flink_master or "[auto]"
    if master not in EMBEDDED_FLINK:
        fix = "start the local cluster with `make flink-up`" if is_local_address(master) else "start that cluster"
        reachable(master, "--flink_master", f"{fix}, or pass --flink_master HOST:8081 of a running one")


def validate_spark(options: PipelineOptions) -> None:
    """The job server jar exists and a ``spark://`` master answers (``local[N]`` runs in the job server)."""
    spark = options.view_as(SparkRunnerOptions)
    if spark.spark_submit_uber_jar:
        raise ConfigError(
            "--spark_submit_uber_jar",
            "submits a jar that Beam downloads at run time",
            "leave it out: the job server built by `make spark-jobserver` runs the job",
        )
    _need_jar(spark.spark_job_server_jar, "--spark_job_server_jar", "spark-jobserver")
    master = spark.spark_master_url or "local[4]"
    if not LOCAL_SPARK.match(master):
        if not master.startswith("spark://"):
            raise ConfigError(
                "--spark_master_url", f"got {master!r}", "pass local[N] or spark://HOST:7077 of a running cluster"
            )
        reachable(master, "--spark_master_url", "start the Spark master or pass the right spark://HOST:PORT")


def cancel_flink_job(master: str, job_name: str) -> list[str]:
    """Cancel the unfinished jobs named ``job_name`` on the Flink cluster whose REST API is ``master``
    (``host:port``); returns their ids. Needed because cancelling through Beam's portable job
    server (2.62) stops the submission, not the job, which would keep running on the cluster."""
    import json
    import urllib.request

    base = rest_url(master)
    with urllib.request.urlopen(f"{base}/jobs/overview", timeout=10) as answer:
        jobs = json.load(answer)["jobs"]
    ended = ("FINISHED", "CANCELED", "FAILED")
    found = [j["jid"] for j in jobs if j["name"] == job_name and j["state"] not in ended]
    for jid in found:
        request = urllib.request.Request(f"{base}/jobs/{jid}?mode=cancel", method="PATCH")
        with urllib.request.urlopen(request, timeout=10):
            pass
    return found
