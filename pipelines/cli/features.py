"""Build per-user histories and point-in-time training examples from engagement events.

Reads JSONL(.gz) and Parquet files (globs allowed), writes Parquet under
OUTPUT/histories/, OUTPUT/training_examples/ and OUTPUT/dead_letters/, plus
OUTPUT/summary.json with the counts (records in = valid + duplicates + dead letters).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipelines import settings
from pipelines.cli import flags

if TYPE_CHECKING:
    from pipelines.features.pipeline import FeaturesConfig

ACCEPTS_BEAM_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH_OR_GLOB",
        help="event files: .jsonl, .jsonl.gz, .parquet (globs allowed)",
    )
    flags.add_output(parser, "the features snapshot")
    add_history_arguments(parser)
    flags.add_skip_bad_files(parser)
    flags.add_runner(parser)


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    """How histories and labels are built: shared by ``features`` and ``replay``."""
    parser.add_argument(
        "--previous", metavar="DIR", help="an earlier snapshot to merge into (incremental build); dedups against it"
    )
    flags.add_max_history(parser)
    flags.add_num_shards(parser, "output files per kind and the unit of parallelism")
    flags.add_setting_duration(
        parser, settings.CLICK_WINDOW, "a click on the same item within this long labels an impression clicked"
    )
    flags.add_setting_duration(
        parser,
        settings.CONVERSION_WINDOW,
        "a conversion, app install or off-site conversion within this long labels it converted",
    )
    flags.add_max_future(parser)


def features_config(args: argparse.Namespace, *, inputs: Sequence[str], output: str) -> FeaturesConfig:
    """The one place a :class:`FeaturesConfig` is built from parsed flags (``features`` and ``replay``)."""
    from pipelines.features.examples import LabelWindows
    from pipelines.features.pipeline import FeaturesConfig

    return FeaturesConfig(
        inputs=inputs,
        output=output,
        previous=args.previous,
        max_history=args.max_history,
        num_shards=args.num_shards,
        windows=LabelWindows(int(args.click_window * 1000), int(args.conversion_window * 1000)),
        overwrite=args.overwrite,
        max_future_ms=int(args.max_future * 1000),
        skip_bad_files=getattr(args, "skip_bad_files", False),
    )


def run(args: argparse.Namespace) -> int:
    from pipelines.features.pipeline import run_features
    from pipelines.runners import pipeline_options, runner_for

    config = features_config(args, inputs=args.input, output=args.output)
    summary = run_features(config, pipeline_options(args, args.beam_args), runner_for(args))
    if summary.get("dry_run"):  # --runner DataflowRunner --dry_run=True: the job graph, nothing ran
        from pipelines.dataflow_job import dry_run_report

        print(dry_run_report(summary))
        return 0
    print(json.dumps(summary, indent=2))
    print(
        f"features: {summary.get('records_in', 0)} records in, {summary.get('events_valid', 0)} valid, "
        f"{summary.get('duplicates', 0) + summary.get('duplicates_previous', 0)} duplicates, "
        f"{summary.get('dead_letters', 0)} rejected (see {args.output}/dead_letters/), "
        f"{summary.get('histories', 0)} histories, {summary.get('training_examples', 0)} training examples "
        f"in {summary['seconds']} s"
        + (f"; {summary['bad_files']} bad file(s) skipped" if summary.get("bad_files") else "")
    )
    return 0
