"""Measure how much small downstream rankers learn from the precomputed representations.

For one vertical (a surface and an objective), trains a ranker the size of a live one
(an MLP over non-sequence features and the last 32 events) alone, distilled from the GEM
model's probabilities (temperature and weight chosen on a validation split), with the
point-in-time user and pair representations as features (snapshots every --cadence of
event time; each example reads the newest computed strictly before its impression,
missing ones resolved through the fallback policy), with them compressed (int8, PCA-16),
with the last --sequence-length historical representations (LoopFM: the model's representation
of each earlier engagement, as of that engagement), and with distillation on top; over --seeds
seeds. Writes OUTPUT/report.json (holdout AUC and normalized entropy per variant with 90%
intervals, gains over alone, the paper's transfer ratios and loopfm_on_kd = TR(KD + LoopFM) /
TR(KD) with its 5th percentile, the freshness/adapter row), OUTPUT/transfer.png,
OUTPUT/rep_history.parquet (the historical representations) and OUTPUT/asof/ (Beam).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from pipelines.cli import flags
from pipelines.errors import ConfigError, OutputNotWritableError

ACCEPTS_BEAM_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add_features_input(parser)
    flags.add_model_input(parser)
    flags.add_output(parser, "report.json, transfer.png and asof/")
    parser.add_argument("--surface", default=None, help="surface name or code of the vertical (default: every surface)")
    parser.add_argument("--objective", default="click", choices=("click", "conversion"), help="(default: click)")
    flags.add_duration(parser, "--cadence", "6h", "how often representations are snapshotted, in event time")
    parser.add_argument("--seeds", type=int, default=2, help="downstream training seeds per variant (default: 2)")
    flags.add_seed(parser, "sampling and the first ranker")
    parser.add_argument(
        "--max-train", type=int, default=12_000, help="training examples sampled (default: %(default)s)"
    )
    parser.add_argument(
        "--max-holdout", type=int, default=8_000, help="holdout examples sampled (default: %(default)s)"
    )
    parser.add_argument("--epochs", type=int, default=4, help="ranker epochs (default: %(default)s)")
    parser.add_argument(
        "--sequence-length",
        type=int,
        default=32,
        help="historical representations each example reads (LoopFM's sequence form; 0: off) (default: %(default)s)",
    )
    parser.add_argument(
        "--vm-window",
        type=int,
        default=32,
        help="events in the ranker's own window of last events (default: %(default)s)",
    )
    parser.add_argument(
        "--pair-coverage",
        type=float,
        default=0.8,
        help="share of (user, ad) pairs the candidate sets covered, so precomputed (default: %(default)s)",
    )
    parser.add_argument(
        "--index-users",
        type=int,
        default=1000,
        help="users in each snapshot's similar-users index (a stable sample of those with a history "
        "before the tick; serving indexes every user) (default: %(default)s)",
    )
    flags.add_device(parser, "GEM's snapshots and the rankers", default="cpu", why="; the same bits on every machine")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default: 1)")
    parser.add_argument("--direct", action="store_true", help="compute the as-of features in-process, without Beam")
    flags.add_progress(parser)
    flags.add_runner(parser)


def _surface(value: str | None) -> int | None:
    from pipelines.schemas.enums import SURFACE_CODE, SURFACES

    if value is None:
        return None
    if value.isdigit() and int(value) < len(SURFACES):
        return int(value)
    if value in SURFACE_CODE:
        return SURFACE_CODE[value]
    raise ConfigError("--surface", f"unknown surface {value!r}", f"pass one of {', '.join(SURFACES)}")


def _check(args: argparse.Namespace) -> None:
    from pipelines.io.outputs import check_output

    for name in ("seeds", "max_train", "max_holdout", "epochs", "threads", "index_users", "vm_window"):
        if getattr(args, name) < 1:
            raise ConfigError("--" + name.replace("_", "-"), f"got {getattr(args, name)}", "pass a positive number")
    if args.sequence_length < 0:
        raise ConfigError("--sequence-length", f"got {args.sequence_length}", "pass 0 (off) or a positive length")
    if not 0 <= args.pair_coverage <= 1:
        raise ConfigError("--pair-coverage", f"got {args.pair_coverage}", "pass a share in [0, 1]")
    features = Path(args.features)
    if not (features / "histories").is_dir() or not (features / "training_examples").is_dir():
        raise ConfigError(
            "--features", f"{features} has no histories/ and training_examples/", "pass a `pipelines features` output"
        )
    if not (Path(args.model) / "model.pt").is_file():
        raise ConfigError("--model", f"{args.model} holds no model.pt", "pass a `pipelines train` output folder")
    check_output(args.output, [("--features", args.features), ("--model", args.model)])
    out = Path(args.output)
    if (out / "report.json").exists() or (out / "asof").exists():
        if not args.overwrite:
            raise ConfigError(
                "--output", f"{out} already holds a transfer report", "pass --overwrite or another folder"
            )
        shutil.rmtree(out / "asof", ignore_errors=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputNotWritableError(f"--output {out}: cannot create it ({exc})") from exc


def run(args: argparse.Namespace) -> int:
    cadence_ms = int(args.cadence * 1000)
    if cadence_ms < 60_000:
        raise ConfigError("--cadence", f"{args.cadence} is under a minute", "pass 1h or more")
    surface = _surface(args.surface)
    _check(args)
    import torch

    from pipelines.model.checkpoint import resolve_device
    from pipelines.runners import pipeline_options, runner_for
    from pipelines.transfer.data import VerticalSpec
    from pipelines.transfer.downstream import RankerConfig
    from pipelines.transfer.experiment import TransferConfig, run_transfer
    from pipelines.transfer.variants import VariantPlan

    resolve_device(args.device)
    torch.set_num_threads(args.threads)
    config = TransferConfig(
        features=args.features,
        model=args.model,
        output=args.output,
        vertical=VerticalSpec(
            surface=surface,
            objective=args.objective,
            max_train=args.max_train,
            max_holdout=args.max_holdout,
            seed=args.seed,
        ),
        plan=VariantPlan(
            seeds=tuple(range(args.seed, args.seed + args.seeds)),
            ranker=RankerConfig(epochs=args.epochs),
            vm_window=args.vm_window,
            progress=not args.no_progress,
        ),
        cadence_ms=cadence_ms,
        pair_coverage=args.pair_coverage,
        index_users=args.index_users,
        sequence_length=args.sequence_length,
        device=args.device,
        use_beam=not args.direct,
        beam_options=None if args.direct else pipeline_options(args, args.beam_args),
        runner=None if args.direct else runner_for(args),
    )
    report = run_transfer(config)
    print(headline(report))
    print(f"transfer: report in {Path(args.output) / 'report.json'}, plot in {report['plot']}")
    return 0


def headline(report: dict) -> str:
    """A few lines: each variant's holdout AUC and gain over alone with intervals, the ratio."""
    lines = [f"transfer ({json.dumps(report['vertical'])}): holdout AUC [90% interval], gain over alone"]
    for name, v in report["variants"].items():
        gain = f"{v['auc_gain']:+.4f} [{v['auc_gain_p05']:+.4f}, {v['auc_gain_p95']:+.4f}]" if "auc_gain" in v else "-"
        size = f"  {v['bytes_per_pair']} B/rep" if "bytes_per_pair" in v else ""
        lines.append(f"  {name:<16} AUC {v['auc']:.4f} [{v['auc_p05']:.4f}, {v['auc_p95']:.4f}]  gain {gain}{size}")
    lines.append("  " + report["verdict"])
    if "loopfm" in report:
        tr = report["loopfm"]["transfer_ratio"]
        lines.append(
            "  transfer ratio (paper): "
            + ", ".join(f"{k} {v['tr']:.2f} [{v['tr_p05']:.2f}, {v['tr_p95']:.2f}]" for k, v in tr.items())
        )
        lines.append(
            f"  loopfm_on_kd {report['loopfm_on_kd']:.2f} (p05 {report['loopfm_on_kd_p05']:.2f}): "
            f"TR(KD + LoopFM) / TR(KD); FM gain {report['loopfm']['fm_gain']:+.4f}"
        )
    return "\n".join(lines)
