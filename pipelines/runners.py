"""Runner selection and pipeline options shared by every Beam command.

``--runner DirectRunner`` (the default) runs Beam's in-process FnApiRunner
directly. Beam's own DirectRunner first tries to download the Prism binary from
the internet on every run; this project never downloads at run time, so the
local default bypasses that. Other runners (FlinkRunner, SparkRunner, PrismRunner,
DataflowRunner, PortableRunner) are passed to Beam as named, with any extra
``--flag value`` arguments forwarded as Beam pipeline options; FlinkRunner and
SparkRunner get the job server jars built by make (see :mod:`pipelines.jobservers`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
)

from pipelines import jobservers
from pipelines.dataflow_job import validate_dry_run
from pipelines.errors import ConfigError

LOCAL_RUNNERS = ("DirectRunner", "local")
REMOTE_RUNNERS = ("FlinkRunner", "SparkRunner", "PrismRunner", "DataflowRunner", "PortableRunner")

#: Beam's portable runner puts ``--job_server_timeout`` (300 s by default) on the job's state and
#: message streams too, so a job on Prism, Flink or Spark that runs past 5 minutes fails with
#: DEADLINE_EXCEEDED while it is still running (seen: a 10-minute ``stream`` soak on Prism). The
#: project's default is ten years; the job servers are checked for reachability before submission,
#: so a long timeout never stands for an unreachable one.
JOB_SERVER_TIMEOUT = {"job_server_timeout": str(10 * 365 * 86_400)}

#: The flags (argparse dests) that name a command's input and output files or folders.
PATH_FLAGS = (
    "input", "output", "features", "candidates", "model", "representations", "histories", "previous",
    "dead_letters", "index",
)  # fmt: skip


def worker_paths(args: argparse.Namespace) -> dict[str, list[str]]:
    """``{--flag: [paths]}`` of the command's inputs and outputs (see :data:`PATH_FLAGS`)."""
    found: dict[str, list[str]] = {}
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        values = value if isinstance(value, list | tuple) else [value]
        paths = [str(v) for v in values if isinstance(v, str | os.PathLike) and str(v)]
        if paths:
            found[f"--{name.replace('_', '-')}"] = paths
    return found


def absolute_paths(args: argparse.Namespace) -> None:
    """Make a cluster runner's local input and output paths absolute, against this process's
    directory: its workers run in another directory and would resolve a relative one there."""
    if getattr(args, "runner", None) not in REMOTE_RUNNERS:
        return
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, list):
            setattr(args, name, [_absolute(v) for v in value])
        elif value is not None:
            setattr(args, name, _absolute(value))


def _absolute(value: object) -> object:
    if isinstance(value, Path):
        return value.absolute()
    if isinstance(value, str) and value and "://" not in value:
        return os.path.abspath(value)
    return value


def pipeline_options(args: argparse.Namespace, beam_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options from the runner flags (:func:`pipelines.cli.flags.add_runner`) and the pass-through
    ``beam_args``: every Beam option reaches Beam exactly as the user gave it; a project default is
    added only for an option the user did not give."""
    given = [*beam_args, *_declared(args)]
    required: dict[str, str | None] = {}
    defaults: dict[str, str] = {}
    if args.runner in LOCAL_RUNNERS:
        defaults = {"direct_running_mode": "in_memory", "direct_num_workers": "1"}
    else:
        required = {"runner": args.runner}
        found = default_prism() if args.runner == "PrismRunner" else None
        defaults = {"prism_location": found} if found else {}
        defaults |= jobservers.default_options(args.runner, given_values(given))
        if args.runner != "DataflowRunner":
            defaults |= JOB_SERVER_TIMEOUT
    options = PipelineOptions(
        merge_flags(given, required=required, defaults=defaults), save_main_session=False, pickle_library="cloudpickle"
    )
    check_known(options, beam_args, jobservers.runner_options(args.runner))
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 1:
        raise ConfigError("--direct_num_workers", f"got {workers}", "pass a value >= 1")
    validate_dry_run(options)
    validate_runner(args.runner, options)
    refuse_secret_flags(beam_args)
    FileSystems.set_options(options)  # the driver reads and commits s3:// / gs:// with the job's options
    if args.runner == "FlinkRunner":
        jobservers.check_worker_paths(options, worker_paths(args))
    return options


#: Beam options that would carry a credential inside the job's options (and so its graph and logs).
SECRET_FLAGS = {"s3_secret_access_key": "AWS_SECRET_ACCESS_KEY", "s3_session_token": "AWS_SESSION_TOKEN"}


def refuse_secret_flags(beam_args: Sequence[str]) -> None:
    """Stop on a credential given as a Beam flag: Beam would write it into the pipeline's options,
    which are sent to every worker and shown in the job's graph; the environment carries it instead."""
    for name in sorted(_names(beam_args) & set(SECRET_FLAGS)):
        raise ConfigError(
            f"--{name}",
            "a credential in the pipeline options is written into the job's graph",
            f"drop it and set {SECRET_FLAGS[name]} in the environment of the command and of the workers",
        )


#: Beam options the runner group declares (so that --help lists them); see pipelines.cli.flags.
DECLARED = ("direct_running_mode", "direct_num_workers", "prism_location")


def _declared(args: argparse.Namespace) -> list[str]:
    return [f"--{name}={value}" for name in DECLARED if (value := getattr(args, name, None)) is not None]


def _names(flags: Sequence[str]) -> set[str]:
    """Option names in ``--name=value`` / ``--name value`` flags, as spelt."""
    return {f[2:].split("=", 1)[0] for f in flags if f.startswith("--")}


def merge_flags(user: Sequence[str], *, required: dict[str, str | None], defaults: dict[str, str]) -> list[str]:
    """The user's Beam flags plus the project's: a ``required`` option (``None`` = a switch) the
    user also gave must agree, else :class:`ConfigError`; a default is added only when not given."""
    given = given_values(user)
    for name, value in required.items():
        if name in given and given[name] != value:
            raise ConfigError(
                f"--{name}",
                f"this command needs {value or 'it on'}, got {given[name]}",
                f"drop --{name} (the command sets it)",
            )
    extra = {
        **{k: v for k, v in defaults.items() if k not in given},
        **{k: v for k, v in required.items() if k not in given},
    }
    return [*user, *(f"--{k}" if v is None else f"--{k}={v}" for k, v in extra.items())]


def given_values(flags: Sequence[str]) -> dict[str, str | None]:
    """``{name: value}`` of ``--name=value``, ``--name value`` and ``--switch`` flags."""
    found: dict[str, str | None] = {}
    for i, flag in enumerate(flags):
        if not flag.startswith("--"):
            continue
        name, eq, value = flag[2:].partition("=")
        following = flags[i + 1] if i + 1 < len(flags) else None
        found[name] = value if eq else (following if following and not following.startswith("--") else None)
    return found


def check_known(options: PipelineOptions, beam_args: Sequence[str], runner_options: Sequence[str] = ()) -> None:
    """Stop on a pass-through flag that is no Beam option (Beam would drop it with a warning);
    ``runner_options``: those a JVM runner's job server adds (e.g. Flink's checkpointing_interval)."""
    known = set(options.get_all_options(drop_default=False)) | set(runner_options)
    unknown = sorted(_names(beam_args) - known)
    if unknown:
        raise ConfigError(
            f"--{unknown[0]}",
            "is neither a flag of this command nor a Beam pipeline option",
            "check the spelling against --help (durations take e.g. 30m, 7d)",
        )


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
        jobservers.validate_flink(options)
    elif runner == "SparkRunner":
        jobservers.validate_spark(options)
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
    try:
        import apache_beam.runners.dataflow.internal.apiclient  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "--runner", f"DataflowRunner needs apache-beam[gcp] ({exc})", "pip install 'gem-pipelines[dataflow]'"
        ) from exc


def runner_for(args: argparse.Namespace) -> object | None:
    """A runner instance for the local default, or None to let Beam resolve ``--runner``."""
    if args.runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None
