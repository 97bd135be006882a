"""Measure the fallback paths on a generated world: hide exact pair representations, resolve, compare.

Takes the last --holdout-days of labelled impressions of a features folder (one per
(user, item); all clicked ones and sampled others, --max-pairs in all), computes with
the model their exact pair representations, day-old ones and every user's user-level
representation, indexes the users, hides --hide of the exact pairs (the store keeps
their day-old version; the --k nearest users get a fresh representation of the item),
and resolves every hidden pair with the real resolver: with the normal policy and
with each fallback path alone. Prints, per path: its share of hidden pairs, cosine to
the hidden exact representation, and the holdout click AUC of the model's click head
fed the fallback vs the exact representation vs none (the mean pair representation),
with the share of the exact representation's gain kept (90% bootstrap interval): head
"pair" is the model's click head, which reads the pair representation and the surface
alone; head "user" (the same-user path, whose user-level representation is not in the
pair space) ranks by the log-probability the model's interest head gives the ad's
category from the user representation.
A control row blends k random users' fresh representations of the same ad instead of
the nearest users' (the share of the gain the ad alone carries).
With --candidates, the generator's candidate requests are replayed in time order
(each request's pairs stored as precompute would; the last day resolved) for the
path mix of a realistic stream. With --truth (the generator's X.truth folder): the share of each user's k neighbours
in its ground-truth interest segment, against random users. Writes OUTPUT/report.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from pipelines.cli import flags
from pipelines.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_features_input(parser)
    flags.add_model_input(parser)
    flags.add_output(parser, "report.json, index/ and store/")
    parser.add_argument("--truth", metavar="DIR", help="the generator's ground truth (EVENTS.truth folder)")
    parser.add_argument(
        "--candidates",
        metavar="PATH",
        help="candidate requests (e.g. generate --candidates) to replay for the path mix",
    )
    parser.add_argument("--hide", type=float, default=0.5, help="share of exact pairs hidden (default: %(default)s)")
    parser.add_argument("--k", type=int, default=10, help="nearest users (default: %(default)s)")
    parser.add_argument("--max-pairs", type=int, default=6000, help="holdout pairs used (default: %(default)s)")
    flags.add_duration(parser, "--holdout", "1d", "the last stretch of event time held out")
    parser.add_argument("--ads-only", action="store_true", help="only ad impressions (default: every impression)")
    parser.add_argument("--factory", default="auto", help="FAISS factory string of the user index (default: auto)")
    flags.add_seed(parser, "every sample")
    flags.add_device(parser, "the model and the index", default="cpu", why="; the same bits on every machine")


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.hide < 1:
        raise ConfigError("--hide", f"got {args.hide}", "pass a share between 0 and 1, e.g. 0.5")
    for flag in ("k", "max_pairs"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}", f"got {getattr(args, flag)}", "pass a positive number")
    if (Path(args.output) / "report.json").exists() and not args.overwrite:
        raise ConfigError("--output", f"{args.output} already holds a report", "pass --overwrite or another folder")
    if args.truth and not (Path(args.truth) / "users.parquet").is_file():
        raise ConfigError("--truth", f"{args.truth} has no users.parquet", "pass the EVENTS.truth folder of generate")


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _gain_cells(head: str, g: dict[str, Any]) -> str:
    """The head's columns of a report row: AUC exact, fallback, none, gain kept and its interval."""
    return (
        f"{head:<4} {_f(g.get('auc_exact')):>9} {_f(g.get('auc_fallback')):>8} {_f(g.get('auc_none')):>6} "
        f"{_f(g.get('gain_kept'), '.1%'):>9} "
        f"{_f(g.get('gain_kept_p05'), '.0%'):>7}-{_f(g.get('gain_kept_p95'), '.0%'):<7}"
    )


def print_report(report: dict[str, Any]) -> None:
    print(
        f"evaluate-fallback: {report['pairs']} holdout pairs ({report['clicked']} clicked), "
        f"{report['hidden']} hidden; model {report['model_version']}"
    )
    print(
        f"{'path (alone)':<15} {'share':>6} {'cosine':>7} {'(none)':>6} | {'head':<4} {'AUC exact':>9} "
        f"{'fallback':>8} {'none':>6} {'gain kept':>9} {'90% interval':>15}"
    )
    for name in ("same_user_pair", "same_user", "similar_users"):
        q = report[name][name]
        heads: list[str] = [h for h in ("pair", "user") if f"head_{h}" in q] or ["-"]
        for head in heads:
            g = q.get(f"head_{head}", {})
            print(
                f"{name:<15} {_f(q['share_of_hidden'], '.2f'):>6} {_f(q.get('cosine_mean')):>7} "
                f"{_f(q.get('cosine_none_mean'), '.2f'):>6} | {_gain_cells(head, g)}"
            )
    if "random_users_control" in report:
        r = report["random_users_control"]
        print(
            f"{'random users':<15} {'-':>6} {_f(r['cosine_mean']):>7} {'-':>6} | "
            f"{_gain_cells('pair', r['head_pair'])}  (control: {r['k']} random users' pairs for the same ad)"
        )
    print("policy mix on hidden pairs: " + ", ".join(f"{k} {v}" for k, v in report["policy"]["mix"].items()))
    for name, r in report.get("stream", {}).items():
        mix = ", ".join(f"{k} {v:.1%}" for k, v in r["shares"].items())
        print(
            f"request stream ({name}): {r['requests']} requests, {r['candidates']} candidates: {mix}; "
            f"resolve p50 {_f(r['latency_ms_p50'], '.2f')} p99 {_f(r['latency_ms_p99'], '.2f')} ms"
        )
    if "neighbors" in report:
        n, c = report["neighbors"], report["neighbors_category_profile"]
        print(
            f"neighbours: {n['same_segment_share']:.1%} of k={n['k']} in the user's ground-truth segment "
            f"(random users: {n['random_same_segment_share']:.1%}; neighbours by history category profile, "
            f"a behavioural yardstick: {c['same_segment_share']:.1%}), {n['users']} users"
        )


def run(args: argparse.Namespace) -> int:
    _check(args)
    from pipelines.io.commit import staged_output

    inputs = [("--features", args.features), ("--model", args.model), ("--truth", args.truth)]
    with staged_output(args.output, overwrite=args.overwrite, holds="a fallback evaluation", inputs=inputs) as staging:
        report = _evaluate(args, staging.root)
        (Path(staging.root) / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print_report(report)
    print(f"report: {Path(args.output) / 'report.json'} ({report['seconds']} s)")
    return 0


def _evaluate(args: argparse.Namespace, root: str) -> dict[str, Any]:
    """Run the evaluation writing into ``root`` (the staging folder); the report names ``--output``."""
    from pipelines.similarity.evaluate import EvalConfig, evaluate_fallback

    config = EvalConfig(
        features=args.features,
        model=args.model,
        output=root,
        truth=args.truth,
        candidates=args.candidates,
        hide=args.hide,
        k=args.k,
        max_pairs=args.max_pairs,
        holdout_days=args.holdout / 86_400.0,
        ads_only=args.ads_only,
        factory=args.factory,
        seed=args.seed,
        device=args.device,
    )
    report = evaluate_fallback(config)
    report["config"] = {**report["config"], "output": args.output}
    return report
