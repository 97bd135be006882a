"""Train the GEM-style model on a features output folder.

Reads DIR/histories/ and DIR/training_examples/ (python -m pipelines features),
holds out the last day of impressions, trains the model on point-in-time examples
(each sees only its user's history before the impression) with a click + conversion
loss, trains the baseline (popularity + logistic regression on count features) on
the same examples, and writes MODEL_DIR/model.pt (weights, config, model version)
and MODEL_DIR/metrics.json (AUC and normalized entropy per task for both, FLOPs
saved by component skip). CUDA is used when present (--device auto).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from pipelines.cli import flags
from pipelines.errors import ConfigError, OutputNotWritableError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_features_input(parser)
    flags.add_output(parser, "the model (model.pt and metrics.json)", metavar="MODEL_DIR")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training sample (default: %(default)s)")
    flags.add_device(parser)
    flags.add_seed(parser, "sampling, initialisation and order")
    parser.add_argument(
        "--max-examples",
        type=int,
        default=24_000,
        help="training examples sampled from the training days; 0 = all (default: %(default)s)",
    )
    parser.add_argument(
        "--max-holdout",
        type=int,
        default=10_000,
        help="holdout examples sampled from the last day; 0 = all (default: %(default)s)",
    )
    flags.add_duration(parser, "--holdout", "1d", "the last stretch of event time held out for evaluation")
    parser.add_argument(
        "--positive-share",
        type=float,
        default=0.25,
        help="share of the training sample given to clicked/converted rows first (negatives "
        "fill the rest, rows weighted by their sampling rate); 0 = uniform (default: %(default)s)",
    )
    parser.add_argument(
        "--interest-weight",
        type=float,
        default=0.5,
        help="weight of the user representation's next-category loss (default: %(default)s)",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="examples per step (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="peak AdamW rate (default: %(default)s)")
    parser.add_argument(
        "--max-len",
        type=int,
        default=128,
        help="most recent history events the model reads (default: %(default)s, a CPU budget)",
    )
    parser.add_argument("--layers", type=int, default=4, help="sequence layers (default: %(default)s)")
    parser.add_argument("--d-model", type=int, default=64, help="token width (default: %(default)s)")
    parser.add_argument("--block-size", type=int, default=64, help="block attention block (default: %(default)s)")
    parser.add_argument(
        "--no-component-skip",
        action="store_true",
        help="every layer does block attention and summarisation (for comparison)",
    )
    parser.add_argument(
        "--no-esmm",
        action="store_true",
        help="a conversion head of its own instead of p(click) * p(conversion | click)",
    )
    parser.add_argument(
        "--compare-skip",
        action="store_true",
        help="also train the other component-skip setting and report the AUC it costs",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default: 1; this model's ops are small, extra "
        "threads mostly wait on each other on a shared machine, and one thread gives the "
        "same bits on any machine)",
    )
    flags.add_progress(parser)


def _positive(args: argparse.Namespace, name: str, allow_zero: bool = False) -> None:
    value = getattr(args, name.replace("-", "_"))
    if value < 0 or (value == 0 and not allow_zero):
        fix = "pass a positive number" + (" or 0 for all" if allow_zero else "")
        raise ConfigError(f"--{name}", f"got {value}", fix)


def _check(args: argparse.Namespace) -> None:
    for name in (
        "epochs",
        "batch-size",
        "max-len",
        "layers",
        "d-model",
        "block-size",
        "threads",
    ):
        _positive(args, name)
    for name in ("max-examples", "max-holdout"):
        _positive(args, name, allow_zero=True)
    if args.d_model % 4:
        raise ConfigError("--d-model", f"{args.d_model} is not a multiple of 4 heads", "pass e.g. 32, 64 or 128")


def _check_paths(args: argparse.Namespace) -> None:
    from pipelines.io.outputs import check_output
    from pipelines.io.snapshot import open_snapshot

    # an uncommitted or damaged snapshot fails before any work (sizes here; training checks the CRCs)
    open_snapshot(args.features, flag="--features", writer="python -m pipelines features", deep=False, pin=False)
    check_output(args.output, [("--features", args.features)])
    out = Path(args.output)
    if (out / "model.pt").exists() and not args.overwrite:
        raise ConfigError("--output", f"{out} already holds a model", "pass --overwrite or another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputNotWritableError(f"--output {out}: cannot create it ({exc})") from exc
    if not os.access(out, os.W_OK):
        raise OutputNotWritableError(f"--output {out}: not writable; pass a folder you can write")


def run(args: argparse.Namespace) -> int:
    import torch

    from pipelines.model.checkpoint import resolve_device
    from pipelines.model.config import GemConfig
    from pipelines.model.train.loop import TrainConfig, train_model

    _check(args)
    model_config = GemConfig(
        d_model=args.d_model,
        num_layers=args.layers,
        block_size=args.block_size,
        max_len=args.max_len,
        component_skip=not args.no_component_skip,
        esmm=not args.no_esmm,
    )
    tc = TrainConfig(  # validates every training flag before anything is read or created
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_examples=args.max_examples or None,
        max_holdout=args.max_holdout or None,
        holdout_days=args.holdout / 86_400.0,
        positive_share=args.positive_share or None,
        interest_weight=args.interest_weight,
        seed=args.seed,
        device=args.device,
        progress=not args.no_progress,
        compare_skip=args.compare_skip,
    )
    _check_paths(args)
    resolve_device(args.device)  # a missing CUDA fails here, before any work
    torch.set_num_threads(args.threads)
    metrics = train_model(args.features, args.output, model_config, tc)
    summary = {
        part: {task: {k: metrics[part][task][k] for k in ("auc", "ne")} for task in ("click", "conversion")}
        for part in ("model", "baseline")
    }
    print(json.dumps(summary, indent=2))
    print(
        f"train: saved {metrics['checkpoint']} ({metrics['model_version']}); "
        f"metrics in {Path(args.output) / 'metrics.json'}"
    )
    return 0
