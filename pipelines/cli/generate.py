"""Generate a synthetic engagement world: events, optional candidate sets, ground truth.

Users with latent interests (segments) browse in sessions across surfaces and
devices, see ads and organic items, click more on what matches their interests
and, rarely and later, convert. Events go to --output (.jsonl, .jsonl.gz or
.parquet, sorted by event_time); ground truth to OUTPUT.truth/ (users.parquet,
items.parquet, world.json). --funnel F.parquet adds ad requests narrowed by the
ranking funnel (retrieval ~1000 ads, early ~200, late ~50, auction a few; one
CANDIDATE_SET row per request and stage, anchored on impressions) and their late
stage as CANDIDATES rows in F.late.parquet. About 3.6 events per user per day: --users 20000
--days 14 gives ~1M events (median ~25 per user, a few users above 20,000).
Same flags, same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.cli import flags
from pipelines.errors import ConfigError, OutputNotWritableError

if TYPE_CHECKING:
    from pipelines.generator.output import Request

MAX_USERS = 5_000_000
MAX_DAYS = 366
MAX_BAD_FRACTION = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--users", type=int, default=20_000, help="number of users (default 20000)")
    parser.add_argument("--days", type=int, default=14, help="length of the period in days (default 14)")
    flags.add_seed(parser, "the world (same seed, same bytes)")
    flags.add_output(
        parser,
        "the events file (.jsonl, .jsonl.gz or .parquet, by suffix) and its .truth/ folder",
        metavar="FILE",
        type=Path,
    )
    parser.add_argument(
        "--candidates-output",
        type=Path,
        default=None,
        metavar="FILE.parquet",
        help="also write candidate sets (CANDIDATES layout) to this file",
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="number of candidate requests (default: one per user)"
    )
    parser.add_argument(
        "--funnel",
        type=Path,
        default=None,
        metavar="FILE.parquet",
        help="also write ranking-funnel candidate sets (CANDIDATE_SET layout) here, and the late-stage "
        "requests (CANDIDATES layout) beside it as FILE.late.parquet",
    )
    parser.add_argument(
        "--funnel-requests",
        type=int,
        default=None,
        help="number of funnel requests, anchored on impressions (default: one per user)",
    )
    parser.add_argument(
        "--bad-fraction",
        type=float,
        default=0.0,
        help="share of JSONL lines that are malformed (inserted; JSONL outputs only; default 0)",
    )
    parser.add_argument(
        "--duplicate-fraction",
        type=float,
        default=0.0,
        help="share of events emitted a second time later in the output, same event_id (default 0)",
    )
    parser.add_argument(
        "--niche-affinity",
        type=float,
        default=0.0,
        help="give each user a niche category they like this much (affinity, 1 = indifferent) but are rarely "
        "shown, so only long histories reveal it: a world where old interests matter (default 0 = off)",
    )
    parser.add_argument(
        "--niche-exposure",
        type=float,
        default=0.03,
        help="share of impressions that show the user's niche category (with --niche-affinity; default 0.03)",
    )
    parser.add_argument(
        "--start",
        type=str,
        default="2026-05-01",
        help="first day of the period, ISO date or datetime (no timezone = UTC; default 2026-05-01)",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipelines.generator.output import write_world

    request = build_request(args)
    began = time.perf_counter()
    stages = tqdm(
        total=4 + (request.candidates is not None) + (request.funnel is not None),
        desc="generate",
        unit="step",
        file=sys.stderr,
        disable=None,
        leave=False,
    )
    written = tqdm(desc="write", unit="B", unit_scale=True, file=sys.stderr, disable=None, leave=False)

    started: list[str] = []

    def stage(name: str) -> None:  # called as each step starts; the bar counts finished steps
        if started:
            stages.update(1)
        started.append(name)
        stages.set_postfix_str(name)

    try:
        summary = write_world(request, stage, written.update)
        stages.update(1)
    finally:
        written.close()
        stages.close()
    counts = summary["counts"]
    print(
        f"wrote {counts['records_written']:,} records ({counts['events']:,} events, "
        f"{counts['duplicates']:,} duplicates, {counts['bad_lines_total']:,} bad lines) for "
        f"{counts['users']:,} users to {request.output} in {time.perf_counter() - began:.1f} s"
    )
    return 0


def build_request(args: argparse.Namespace) -> Request:
    """Check every flag (ConfigError names the flag and the fix) before any work."""
    from pipelines.generator.config import MAX_EXPECTED_EVENTS, WorldConfig
    from pipelines.generator.output import Request, format_of

    _check_range("--users", args.users, 1, MAX_USERS)
    _check_range("--days", args.days, 1, MAX_DAYS)
    _check_range("--seed", args.seed, 0, 2**32 - 1)
    fmt = format_of(args.output)
    if fmt is None:
        raise ConfigError(
            "--output", f"{args.output} is not .jsonl, .jsonl.gz or .parquet", "pick one of those suffixes"
        )
    if not 0.0 <= args.bad_fraction <= MAX_BAD_FRACTION:
        raise ConfigError("--bad-fraction", f"{args.bad_fraction} is outside [0, {MAX_BAD_FRACTION}]", "use e.g. 0.01")
    if args.bad_fraction > 0 and fmt == "parquet":
        raise ConfigError("--bad-fraction", "malformed lines only exist in JSONL", "write .jsonl or drop the flag")
    if not 0.0 <= args.duplicate_fraction <= 1.0:
        raise ConfigError("--duplicate-fraction", f"{args.duplicate_fraction} is outside [0, 1]", "use e.g. 0.01")
    requests = _check_candidates(args)
    funnel_requests = _check_funnel(args)
    _check_niche(args)
    config = WorldConfig(
        users=args.users,
        days=args.days,
        seed=args.seed,
        start_ms=_start_ms(args.start),
        niche_affinity=args.niche_affinity,
        niche_exposure=args.niche_exposure,
    )
    if config.expected_events > MAX_EXPECTED_EVENTS:
        raise ConfigError(
            "--users",
            f"{args.users} users x {args.days} days is ~{config.expected_events:,.0f} events",
            f"generate at most ~{MAX_EXPECTED_EVENTS:,} events per run (fewer users or days)",
        )
    outputs = (("--output", args.output), ("--candidates-output", args.candidates_output), ("--funnel", args.funnel))
    for flag, path in outputs:
        if path is not None:
            _check_writable(path, flag, args.overwrite)
    return Request(
        config,
        args.output,
        args.candidates_output,
        requests,
        args.bad_fraction,
        args.duplicate_fraction,
        funnel=args.funnel,
        funnel_requests=funnel_requests,
    )


def _check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(flag, f"{value} is outside [{low}, {high}]", f"pass a value between {low} and {high}")


def _check_candidates(args: argparse.Namespace) -> int:
    requests = args.users if args.requests is None else args.requests
    if args.candidates_output is None:
        if args.requests is not None:
            raise ConfigError("--requests", "given without --candidates-output", "add --candidates-output PATH.parquet")
        return 0
    if not args.candidates_output.name.endswith(".parquet"):
        raise ConfigError(
            "--candidates-output", f"{args.candidates_output} is not a .parquet file", "name it *.parquet"
        )
    if args.candidates_output.resolve() == args.output.resolve():
        raise ConfigError("--candidates-output", "is the same file as --output", "write candidates to another path")
    _check_range("--requests", requests, 0, 50_000_000)
    return requests


def _check_funnel(args: argparse.Namespace) -> int:
    requests = args.users if args.funnel_requests is None else args.funnel_requests
    if args.funnel is None:
        if args.funnel_requests is not None:
            raise ConfigError("--funnel-requests", "given without --funnel", "add --funnel PATH.parquet")
        return 0
    if not args.funnel.name.endswith(".parquet") or args.funnel.name.endswith(".late.parquet"):
        raise ConfigError("--funnel", f"{args.funnel} is not a .parquet file", "name it e.g. funnel.parquet")
    others = {p.resolve() for p in (args.output, args.candidates_output) if p is not None}
    if args.funnel.resolve() in others:
        raise ConfigError("--funnel", "is the same file as --output or --candidates-output", "write it elsewhere")
    _check_range("--funnel-requests", requests, 0, 10_000_000)
    return requests


def _check_niche(args: argparse.Namespace) -> None:
    from pipelines.generator.config import DEFAULT_CATEGORIES as most

    if args.niche_affinity != 0 and not 1 <= args.niche_affinity <= most:
        raise ConfigError(
            "--niche-affinity",
            f"{args.niche_affinity} is neither 0 (off) nor in [1, {most}]",
            "use e.g. 16 (as strong as a main interest), or 0 for the default world",
        )
    if not 0 <= args.niche_exposure <= 0.5:
        raise ConfigError("--niche-exposure", f"{args.niche_exposure} is outside [0, 0.5]", "use e.g. 0.03")
    if args.niche_exposure != 0.03 and not args.niche_affinity:
        raise ConfigError("--niche-exposure", "given without --niche-affinity", "add --niche-affinity, e.g. 16")


def _start_ms(text: str) -> int:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(
            "--start", f"{text!r} is not an ISO date", "use e.g. 2026-05-01 or 2026-05-01T00:00Z"
        ) from exc
    if isinstance(parsed, datetime) and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if parsed < datetime(1970, 1, 1, tzinfo=UTC) or parsed.year > 9000:
        raise ConfigError("--start", f"{text} is outside 1970..9000", "use a date after 1970-01-01")
    return int(parsed.timestamp() * 1000)


def _check_writable(path: Path, flag: str, overwrite: bool) -> None:
    if path.is_file() and not overwrite:
        raise ConfigError(flag, f"{path} already exists", "pass --overwrite or choose another path")
    parent = path.parent if str(path.parent) else Path(".")
    existing = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise OutputNotWritableError(f"{path}: {existing} is not a writable folder; choose another output path")
    if path.exists() and path.is_dir():
        raise OutputNotWritableError(f"{path} is a folder; pass a file name")
