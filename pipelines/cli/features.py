"""Build per-user histories and point-in-time training examples from engagement events.

Reads JSONL(.gz) and Parquet files (globs allowed), writes Parquet under
OUTPUT/histories/, OUTPUT/training_examples/ and OUTPUT/dead_letters/, plus
OUTPUT/summary.json with the counts (records in = valid + duplicates + dead letters).
"""

from __future__ import annotations

import argparse
import json

from pipelines.errors import ConfigError

ACCEPTS_BEAM_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.runners import add_runner_arguments

    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH_OR_GLOB",
        help="event files: .jsonl, .jsonl.gz, .parquet (globs allowed)",
    )
    parser.add_argument("--output", required=True, metavar="DIR", help="folder for the new snapshot")
    parser.add_argument(
        "--previous", metavar="DIR", help="an earlier snapshot to merge into (incremental build); dedups against it"
    )
    parser.add_argument(
        "--max-history",
        type=int,
        default=4096,
        help="events kept per user; older ones fold into the summary (default: %(default)s)",
    )
    parser.add_argument(
        "--num-shards",
        type=int,
        default=16,
        help="user shards: output files per kind and the unit of parallelism (default: %(default)s)",
    )
    parser.add_argument(
        "--click-window-minutes",
        type=float,
        default=30.0,
        help="a click on the same item within this many minutes labels an impression clicked",
    )
    parser.add_argument(
        "--conversion-window-days",
        type=float,
        default=7.0,
        help="a conversion/app install/off-site conversion within this many days labels it converted",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing snapshot in --output")
    add_runner_arguments(parser)


def _windows(args: argparse.Namespace):
    from pipelines.durations import DAY_MS, MINUTE_MS
    from pipelines.features.examples import LabelWindows

    if args.click_window_minutes <= 0:
        raise ConfigError("--click-window-minutes", f"got {args.click_window_minutes}", "pass a positive number")
    if args.conversion_window_days <= 0:
        raise ConfigError("--conversion-window-days", f"got {args.conversion_window_days}", "pass a positive number")
    return LabelWindows(int(args.click_window_minutes * MINUTE_MS), int(args.conversion_window_days * DAY_MS))


def run(args: argparse.Namespace) -> int:
    from pipelines.features.pipeline import FeaturesConfig, run_features
    from pipelines.runners import pipeline_options, runner_for

    config = FeaturesConfig(
        inputs=args.input,
        output=args.output,
        previous=args.previous,
        max_history=args.max_history,
        num_shards=args.num_shards,
        windows=_windows(args),
        overwrite=args.overwrite,
    )
    summary = run_features(config, pipeline_options(args, args.beam_args), runner_for(args))
    print(json.dumps(summary, indent=2))
    print(
        f"features: {summary.get('records_in', 0)} records in, {summary.get('events_valid', 0)} valid, "
        f"{summary.get('duplicates', 0) + summary.get('duplicates_previous', 0)} duplicates, "
        f"{summary.get('dead_letters', 0)} rejected (see {args.output}/dead_letters/), "
        f"{summary.get('histories', 0)} histories, {summary.get('training_examples', 0)} training examples "
        f"in {summary['seconds']} s"
    )
    return 0
