"""Precompute representations: candidates + histories → GEM inference in Beam → Parquet (+ store).

Joins each candidate set to its user's history (events strictly before the
request time; users without history still get pair representations from their
non-sequence features), runs the model through Beam's RunInference with batches
formed by a token budget, and writes REPRESENTATION rows to
OUTPUT/representations/ and, with --store, to the online store.
"""

from __future__ import annotations

import argparse
import json
import logging

from pipelines.cli import flags

ACCEPTS_BEAM_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_features_input(parser)
    parser.add_argument(
        "--candidates",
        required=True,
        nargs="+",
        metavar="PATH_OR_GLOB",
        help="candidate sets (CANDIDATES layout Parquet)",
    )
    flags.add_model_input(parser)
    flags.add_output(parser, "the representations")
    flags.add_store(parser, required=False, what=" to also write to")
    parser.add_argument(
        "--all-users", action="store_true", help="also emit a user-level representation for every user with a history"
    )
    parser.add_argument(
        "--contexts",
        action="store_true",
        help="also write each written user's context record to --store (the last 32 events and the prefix counts "
        "a downstream ranker reads with the representations; pipelines/model/context.py)",
    )
    flags.add_rep_history(parser, "a backfill of the features snapshot")
    flags.add_device(parser)
    parser.add_argument(
        "--batching",
        default="tokens",
        choices=("tokens", "count"),
        help="form inference batches by token budget (default) or by request count",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=32_768,
        help="history tokens per inference batch with --batching tokens (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="requests per inference batch with --batching count (default: %(default)s)",
    )
    flags.add_runner(parser)


def run(args: argparse.Namespace) -> int:
    from pipelines.precompute.pipeline import PrecomputeConfig, run_precompute
    from pipelines.runners import pipeline_options, runner_for

    config = PrecomputeConfig(
        features=args.features,
        candidates=args.candidates,
        model=args.model,
        output=args.output,
        store=args.store,
        all_users=args.all_users,
        contexts=args.contexts,
        rep_history=args.rep_history,
        device=args.device,
        batching=args.batching,
        token_budget=args.token_budget,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
    )
    if args.store:
        from pipelines.redact import redact
        from pipelines.store import check_store

        # A bad URI, an unreachable server, refused credentials, an old version, a full disk or a
        # damaged LMDB file all fail here, before any inference runs.
        found = check_store(args.store)
        logging.getLogger(__name__).info("store %s ready: %s", redact(args.store), found)
    summary = run_precompute(config, pipeline_options(args, args.beam_args), runner_for(args))
    if summary.get("dry_run"):  # --runner DataflowRunner --dry_run=True: the job graph, nothing ran
        from pipelines.dataflow_job import dry_run_report

        print(dry_run_report(summary))
        return 0
    print(json.dumps(summary, indent=2))
    print(
        f"precompute: {summary.get('requests_in', 0)} requests, {summary.get('pairs_in', 0)} pairs in, "
        f"{summary.get('pairs_out', 0)} pair and {summary.get('users_out', 0)} user representations out, "
        f"{summary.get('dead_letters', 0)} dead letters, in {summary['seconds']} s"
    )
    return 0
