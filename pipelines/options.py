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
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.errors import ConfigError

LOCAL_RUNNERS = ("DirectRunner", "local")
REMOTE_RUNNERS = ("FlinkRunner", "PrismRunner", "DataflowRunner", "PortableRunner")
RUNNING_MODES = ("in_memory", "multi_threading", "multi_processing")


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner flags; unknown ``--flags`` after them go to Beam as pipeline options."""
    group = parser.add_argument_group("runner (other --flags are passed to Beam, e.g. --flink_master)")
    group.add_argument(
        "--runner", default="DirectRunner", choices=LOCAL_RUNNERS + REMOTE_RUNNERS,
        help="Beam runner; DirectRunner runs in-process with no network access (default: %(default)s)",
    )
    group.add_argument(
        "--direct-running-mode", default="in_memory", choices=RUNNING_MODES,
        help="how the local runner executes bundles (default: %(default)s; multi_threading lost elements "
        "at GroupByKey with large elements in lab runs, so it is not the default)",
    )
    group.add_argument(
        "--direct-num-workers", type=int, default=1,
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
    return PipelineOptions(flags, save_main_session=False, pickle_library="cloudpickle")


def runner_for(args: argparse.Namespace) -> object | None:
    """A runner instance for the local default, or None to let Beam resolve ``--runner``."""
    if args.runner in LOCAL_RUNNERS:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return FnApiRunner()
    return None
