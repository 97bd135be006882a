"""Runner selection and pipeline options shared by every Beam command.

``--runner DirectRunner`` (the default) runs Beam's in-process FnApiRunner
directly. Beam's own DirectRunner first tries to download the Prism binary from
the internet on every run; this project never downloads at run time, so the
local default bypasses that. Other runners (FlinkRunner, PrismRunner,
DataflowRunner, PortableRunner) are passed to Beam as named, with any extra
``--flag value`` arguments forwarded as Beam pipeline options.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
)

from pipelines.errors import ConfigError

LOCAL_RUNNERS = ("DirectRunner", "local")
REMOTE_RUNNERS = ("FlinkRunner", "PrismRunner", "DataflowRunner", "PortableRunner")
RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner flags; unknown ``--flags`` after them go to Beam as pipeline options."""
    group = parser.add_argument_group("runner (other --flags are passed to Beam, e.g. --flink_master)")
    group.add_argument(
        "--runner",
        default="DirectRunner",
        choices=LOCAL_RUNNERS + REMOTE_RUNNERS,
        help="Beam runner; DirectRunner runs in-process with no network access (default: %(default)s)",
    )
    group.add_argument(
        "--direct-running-mode",
        default="in_memory",
        choices=RUNNING_MODES,
        help="how the local runner executes bundles (default: %(default)s; multi_threading lost elements "
        "or failed decoding them at GroupByKey with large elements in lab runs, so it is not the default)",
    )
    group.add_argument(
        "--direct-num-workers",
        type=int,
        default=1,
        help="worker processes/threads for multi_processing/multi_threading (default: %(default)s)",
    )


def pipeline_options(args: argparse.Namespace, beam_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options from the parsed runner flags plus pass-through Beam flags."""
    if args.direct_num_workers < 1:
        raise ConfigError("--direct-num-workers", f"got {args.direct_num_workers}", "pass a value >= 1")
    flags = list(beam_args)
    if args.runner in LOCAL_RUNNERS:
        flags += [
            f"--direct_running_mode={args.direct_running_mode}",
            f"--direct_num_workers={args.direct_num_workers}",
        ]
    else:
        flags.append(f"--runner={args.runner}")
        if args.runner == "PrismRunner" and not any(f.startswith("--prism_location") for f in flags):
            found = default_prism()
            flags += [f"--prism_location={found}"] if found else []
    options = PipelineOptions(flags, save_main_session=False, pickle_library="cloudpickle")
    validate_runner(args.runner, options)
    return options


def _reachable(address: str, flag: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "localhost", int(port)), timeout=3):
            return
    except (OSError, ValueError) as exc:
        raise ConfigError(
            flag, f"{address!r} is not reachable ({exc})", "start the service or pass the right host:port"
        ) from exc


def _need_file(value: str | None, flag: str, what: str, fix: str) -> None:
    if not value:
        raise ConfigError(flag, f"not set; {what}", fix)
    if not Path(value).is_file():
        raise ConfigError(flag, f"{value!r} is not a file; {what}", fix)


def default_prism() -> str | None:
    """The Prism binary built by ``make prism`` (or on PATH), if any."""
    candidates = [
        os.environ.get("GEM_PRISM", ""),
        str(Path(__file__).resolve().parent.parent / ".cache/bin/prism"),
        shutil.which("prism") or "",
    ]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def validate_runner(runner: str, options: PipelineOptions) -> None:
    """Fail at construction, naming the flag and the fix, before Beam would download or hang."""
    if runner == "FlinkRunner":
        master = options.view_as(FlinkRunnerOptions).flink_master
        if master in ("[local]", "[auto]", "", None):
            _need_file(
                options.view_as(FlinkRunnerOptions).flink_job_server_jar,
                "--flink_job_server_jar",
                "an embedded Flink needs Beam's Flink job server jar, which Beam would otherwise download",
                "pass --flink_job_server_jar PATH/beam-runners-flink-<v>-job-server-<beam>.jar "
                "or --flink_master HOST:8081 of a running cluster",
            )
        else:
            _reachable(master, "--flink_master")
    elif runner == "PortableRunner":
        endpoint = options.view_as(PortableOptions).job_endpoint
        if not endpoint:
            raise ConfigError("--job_endpoint", "PortableRunner needs a job service", "pass --job_endpoint HOST:PORT")
        _reachable(endpoint, "--job_endpoint")
    elif runner == "PrismRunner":
        _need_file(
            options.view_as(PrismRunnerOptions).prism_location or default_prism(),
            "--prism_location",
            "Beam would otherwise download the Prism binary at run time",
            "build it with `make prism` and pass --prism_location .cache/bin/prism",
        )
    elif runner == "DataflowRunner":
        _validate_dataflow(options.view_as(GoogleCloudOptions))


def _validate_dataflow(gcp: GoogleCloudOptions) -> None:
    for flag, value, fix in (
        ("--project", gcp.project, "pass --project YOUR_GCP_PROJECT"),
        ("--region", gcp.region, "pass --region e.g. us-central1"),
        ("--temp_location", gcp.temp_location, "pass --temp_location gs://BUCKET/tmp"),
    ):
        if not value:
            raise ConfigError(flag, "DataflowRunner needs it", fix)
    if not str(gcp.temp_location).startswith("gs://"):
        raise ConfigError(
            "--temp_location", f"{gcp.temp_location!r} is not a gs:// path", "pass --temp_location gs://BUCKET/tmp"
        )


def runner_for(args: argparse.Namespace) -> object | None:
    """A runner instance for the local default, or None to let Beam resolve ``--runner``."""
    if args.runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None
