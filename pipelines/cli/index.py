"""Build a FAISS index of user representations (Beam): train once, add shards in parallel, merge.

Reads the user-level rows (ad_id null) of a precompute output's representations,
keeps the newest per user, trains the index given as a FAISS factory string on a
seeded sample of those vectors, adds them in batches (--shards N: N Beam workers
each add one contiguous range to a copy of the trained index; IVF and flat-code
shards are merged into one index, HNSW shards are kept and searched together),
tunes the search parameter (nprobe / efSearch) to --recall-target recall@10 on
sample queries against exact search, and writes INDEX_DIR/index.faiss (or
shard-NNNNN.faiss), ids.parquet (position -> user_id), vectors.npy and
manifest.json (model_version, dim, metric, factory, count, built_at, ...).
--gpu auto uses faiss GPU indexes when faiss reports a GPU, the CPU otherwise.
"""

from __future__ import annotations

import argparse
import json

from pipelines.cli import flags

ACCEPTS_BEAM_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--representations",
        required=True,
        metavar="DIR",
        help="a precompute --output folder (or its representations/ folder, or one file)",
    )
    flags.add_output(parser, "the index", metavar="INDEX_DIR")
    parser.add_argument(
        "--factory",
        default="auto",
        help="FAISS factory string, e.g. Flat, HNSW32, IVF4096,Flat, IVF1024,PQ16, IVF8192,PQ32,RFlat (,RFlat: "
        "re-rank on the stored vectors); auto = Flat below 20,000 users, IVF(~4 sqrt n),Flat below 4M, else "
        "IVF(~4 sqrt n),PQ(dim/2),RFlat (default: %(default)s)",
    )
    parser.add_argument(
        "--metric",
        default="ip",
        choices=("ip", "l2"),
        help="ip = cosine on the L2-normalised user embeddings (default: %(default)s)",
    )
    flags.add_device(parser, "FAISS trains and adds (cuda: faiss GPU indexes)")
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="contiguous user ranges added in parallel by Beam workers (default: %(default)s)",
    )
    parser.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="training sample size (default: 40 per IVF list, at least 65,536, at most all)",
    )
    flags.add_seed(parser, "the training and tuning samples")
    parser.add_argument(
        "--search-params", default=None, help="fixed search parameters, e.g. nprobe=16 or efSearch=128 (default: tuned)"
    )
    parser.add_argument(
        "--recall-target",
        type=float,
        default=0.95,
        help="recall@10 the tuned search parameter must reach (default: %(default)s)",
    )
    flags.add_runner(parser)


def run(args: argparse.Namespace) -> int:
    from pipelines.runners import pipeline_options, runner_for
    from pipelines.similarity.build import BuildSpec
    from pipelines.similarity.faiss_ops import faiss_gpu_mode
    from pipelines.similarity.pipeline import IndexConfig, run_index

    spec = BuildSpec(
        factory=args.factory,
        metric=args.metric,
        gpu=faiss_gpu_mode(args.device),
        shards=args.shards,
        train_size=args.train_size,
        seed=args.seed,
        search_params=args.search_params,
        recall_target=args.recall_target,
    )
    config = IndexConfig(args.representations, args.output, spec, overwrite=args.overwrite)
    manifest = run_index(config, pipeline_options(args, args.beam_args), runner_for(args))
    if manifest.get("dry_run"):  # --runner DataflowRunner --dry_run=True: the job graph, nothing ran
        from pipelines.dataflow_job import dry_run_report

        print(dry_run_report(manifest))
        return 0
    print(json.dumps(manifest, indent=2, sort_keys=True))
    recall = manifest["tuned_recall_at_10"]
    print(
        f"index: {manifest['count']} users x {manifest['dim']} ({manifest['factory']}, {manifest['layout']}, "
        f"{manifest['shards']} shard(s), {manifest['search_params'] or 'no search parameter'}"
        f"{'' if recall is None else f', recall@10 {recall:.3f}'}) in {args.output}"
    )
    return 0
