"""Resolve one request: a representation for each (user, ad), with the path taken and its age.

For each ad, in order: the exact (user, ad) representation when at most --max-age
old; else the same user's older (user, ad) representation or its user-level
representation, at most --fallback-max-age old; else the similarity-weighted mean
of the --k nearest users' (neighbour, ad) representations; else none. One index
search and one store round trip per request. A store or request holding another
model_version than the index is an error, never a silent mix.

    python -m pipelines lookup --store lmdb:///out/store --index out/index --user 42 --ads 7,8,9
"""

from __future__ import annotations

import argparse
import json
import math
import time

from pipelines import settings
from pipelines.cli import flags
from pipelines.errors import ConfigError

DEFAULT_MAX_AGE_S = settings.MAX_AGE.seconds
DEFAULT_FALLBACK_MAX_AGE_S = settings.FALLBACK_MAX_AGE.seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_store(parser, required=True)
    parser.add_argument("--index", required=True, metavar="INDEX_DIR", help="output folder of the index command")
    parser.add_argument("--user", required=True, type=int, help="the requesting user id")
    parser.add_argument("--ads", required=True, help="candidate ad ids, comma-separated")
    parser.add_argument(
        "--max-age",
        type=flags.duration,
        metavar="DURATION",
        help=f"an exact pair older than this is stale (default: the store URI's ?max_age=, else "
        f"{settings.MAX_AGE.default})",
    )
    parser.add_argument(
        "--fallback-max-age",
        type=flags.duration,
        metavar="DURATION",
        help="staleness bound of same-user and neighbours' representations (default: "
        f"{settings.FALLBACK_MAX_AGE.default}, or --max-age if longer)",
    )
    parser.add_argument("--k", type=int, default=10, help="nearest users searched (default: %(default)s)")
    parser.add_argument(
        "--min-neighbors",
        type=int,
        default=1,
        help="neighbours with a representation of the ad needed for that path (default: 1)",
    )
    parser.add_argument(
        "--paths",
        default="same_user_pair,same_user,similar_users",
        help="fallback paths allowed, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--neighbor-reads",
        default="always",
        choices=("always", "auto"),
        help="always: neighbours' pairs in the one store round trip; auto: only when the user-level "
        "representation cannot answer (a second, smaller trip) (default: %(default)s)",
    )
    parser.add_argument("--model-version", default=None, help="fail unless the index serves this model_version")
    flags.add_device(parser, "the index search")
    parser.add_argument("--json", action="store_true", help="print one JSON object per ad, embeddings included")


def _ads(text: str) -> list[int]:
    try:
        ads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError("--ads", f"{text!r} is not a list of integers", "pass e.g. --ads 7,8,9") from exc
    if not ads:
        raise ConfigError("--ads", "no ad ids given", "pass e.g. --ads 7,8,9")
    return ads


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width + len(unit)) if x is None or math.isnan(x) else format(x, spec) + unit


def _ages(args: argparse.Namespace) -> tuple[float, float]:
    """(max age, fallback max age): --max-age, else the store URI's ``?max_age=``, else 1h; the
    fallback bound --fallback-max-age, else 7d or the max age when that is longer."""
    from pipelines.store import parse_store_uri

    if args.max_age is not None:
        max_age_s = args.max_age
    else:
        max_age_s = parse_store_uri(args.store).options.max_age_s or DEFAULT_MAX_AGE_S
    if args.fallback_max_age is not None:
        return max_age_s, args.fallback_max_age
    return max_age_s, max(DEFAULT_FALLBACK_MAX_AGE_S, max_age_s)


def run(args: argparse.Namespace) -> int:
    from pipelines.similarity.faiss_ops import faiss_gpu_mode
    from pipelines.similarity.policy import ResolverConfig
    from pipelines.similarity.resolver import Resolver
    from pipelines.similarity.user_index import UserIndex
    from pipelines.store import open_store

    max_age_s, fallback_max_age_s = _ages(args)
    config = ResolverConfig(
        max_age_s=max_age_s,
        fallback_max_age_s=fallback_max_age_s,
        k=args.k,
        min_neighbors=args.min_neighbors,
        paths=tuple(p.strip() for p in args.paths.split(",") if p.strip()),
        neighbor_reads=args.neighbor_reads,
    )
    ads = _ads(args.ads)
    index = UserIndex.load(args.index, gpu=faiss_gpu_mode(args.device))
    with open_store(args.store, reader=True) as store:
        started = time.perf_counter()
        got = Resolver(store, index, config).resolve(args.user, ads, model_version=args.model_version)
        elapsed_ms = (time.perf_counter() - started) * 1000
    if args.json:
        for a in got.answers():
            print(
                json.dumps(
                    {
                        "user_id": a.user_id,
                        "ad_id": a.ad_id,
                        "path": a.path,
                        "age_s": a.age_s,
                        "p_click": a.p_click,
                        "neighbors_used": a.neighbors_used,
                        "similarity": a.similarity,
                        "embedding": None if a.embedding is None else [round(float(v), 5) for v in a.embedding],
                    }
                )
            )
        return 0
    print(f"{'ad_id':>12} {'path':<15} {'age':>10} {'p_click':>8} {'neighbours':>10} {'similarity':>10}")
    for a in got.answers():
        print(
            f"{a.ad_id:>12} {a.path:<15} {_fmt(a.age_s, '>9.0f', 's')} {_fmt(a.p_click, '>8.4f')} "
            f"{a.neighbors_used:>10} {_fmt(a.similarity, '>10.3f')}"
        )
    mix = ", ".join(f"{name} {n}" for name, n in got.counts().items() if n)
    print(f"lookup: user {args.user}, {len(ads)} ads in {elapsed_ms:.2f} ms ({mix}); model {got.model_version}")
    return 0
