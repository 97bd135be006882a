"""Flags shared by the commands that read events: ``--max-future`` and ``--skip-bad-files``."""

from __future__ import annotations

import argparse

from pipelines.errors import ConfigError

DEFAULT_MAX_FUTURE = "1d"


def add_max_future(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-future",
        default=DEFAULT_MAX_FUTURE,
        metavar="DURATION",
        help="events later than the run's clock plus this (90s, 15m, 2h, 7d) become `future_time` "
        "dead letters, so no event moves a watermark past now (default: %(default)s)",
    )


def add_skip_bad_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="record a file that cannot be read (truncated or non-gzip .gz, not Parquet, a schema the "
        "layouts cannot take) in the summary and as an `unreadable_file` dead letter, and go on; "
        "without it such a file stops the run with an error naming it",
    )


def max_future_ms(args: argparse.Namespace) -> int:
    """``--max-future`` in milliseconds; :class:`ConfigError` when it is not a duration."""
    from pipelines.durations import parse_duration

    try:
        return int(parse_duration(args.max_future) * 1000)
    except ValueError as exc:
        raise ConfigError("--max-future", str(exc), "write a duration such as 1d, 2h or 90s") from exc
