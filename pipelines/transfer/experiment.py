"""The whole transfer job behind ``python -m pipelines transfer``: splits, as-of features (on Beam),
historical representation sequences, distillation targets, the variants, the report and its plot.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow.parquet as pq

from pipelines.durations import DAY_MS, HOUR_MS, format_duration
from pipelines.model.checkpoint import load_model
from pipelines.model.gem import GemModel
from pipelines.model.inputs import HistoryIndex
from pipelines.model.rep_history import compute_rep_history, events_needed, rep_history_table, rep_sequences
from pipelines.model.train.data import load_features
from pipelines.model.train.loop import predict
from pipelines.similarity.policy import FallbackPath, ResolverConfig
from pipelines.transfer.compress import fit_codec
from pipelines.transfer.data import Splits, VerticalSpec, prepare_splits
from pipelines.transfer.report import build_report, json_safe, plot_report
from pipelines.transfer.snapshots import AsOfSetting, RepFeatures, settings_asof
from pipelines.transfer.variants import MAIN, SPLITS, VariantPlan, run_variants

log = logging.getLogger(__name__)

__all__ = ["TransferConfig", "as_of_settings", "gem_teacher", "run_transfer"]

REPORT_NAME = "report.json"
PLOT_NAME = "transfer.png"
REP_HISTORY_NAME = "rep_history.parquet"
AGES_MS = {"age_1h": HOUR_MS, "age_1d": DAY_MS, "age_7d": 7 * DAY_MS}
SIMILAR = "similar"


@dataclass(frozen=True)
class TransferConfig:
    """Inputs and knobs of one transfer run."""

    features: str
    model: str
    output: str
    vertical: VerticalSpec = field(default_factory=VerticalSpec)
    plan: VariantPlan = field(default_factory=VariantPlan)
    cadence_ms: int = 6 * HOUR_MS
    pair_coverage: float = 0.8
    index_users: int = 1000
    sequence_length: int = 32  # historical representations per example (LoopFM); 0: none
    device: str = "cpu"
    use_beam: bool = True
    beam_options: object | None = None  # PipelineOptions (pipelines.runners.pipeline_options); None: local
    runner: object | None = None


def as_of_settings(cadence_ms: int, coverage: float, index_users: int = 1000) -> list[AsOfSetting]:
    """``main``: snapshots every ``cadence_ms``, read as soon as computed (ages up to one cadence);
    ``age_X``: hourly snapshots read only once at least X old; ``similar``: ``main``'s snapshots
    through the chain without its same-user step, so uncovered pairs take the similar-users path.
    Exact pairs up to one cadence old, older ones (and user-level ones, and neighbours' pairs) up to
    8 days, so the 7-day variant still has representations; k = 10 neighbours, as serving."""
    policy = ResolverConfig(max_age_s=cadence_ms / 1000.0, fallback_max_age_s=8 * 86_400.0)
    similar = replace(policy, paths=("same_user_pair", "similar_users"))
    settings = [AsOfSetting(MAIN, cadence_ms, 0, coverage, policy, index_users)]
    settings += [AsOfSetting(name, HOUR_MS, lag, coverage, policy, index_users) for name, lag in AGES_MS.items()]
    settings.append(AsOfSetting(SIMILAR, cadence_ms, 0, coverage, similar, index_users))
    return settings


def gem_teacher(model: GemModel, task: str) -> Callable[[Splits], np.ndarray]:
    """Distillation targets: the GEM model's probabilities on the TRAINING split's rows only."""

    def teacher(splits: Splits) -> np.ndarray:
        return predict(model, splits.train.examples, next(model.parameters()).device)[task]

    return teacher


def _features_direct(
    model: GemModel, index: HistoryIndex, splits: Splits, settings: list[AsOfSetting]
) -> dict[str, dict[str, RepFeatures]]:
    out: dict[str, dict[str, RepFeatures]] = {s.name: {} for s in settings}
    for split in SPLITS:
        start = time.monotonic()
        for name, features in settings_asof(model, index, getattr(splits, split).rows, settings).items():
            out[name][split] = features
        log.info("as-of features of the %s split in %.1f s", split, time.monotonic() - start)
    return out


def _mean_age_h(features: dict[str, dict[str, RepFeatures]]) -> dict[str, float]:
    ages = {}
    for setting, per_split in features.items():
        age = per_split["holdout"].pair_age_s
        name = "reps" if setting == MAIN else f"reps_{setting}"
        ages[name] = float(np.nanmean(age) / 3600.0) if np.isfinite(age).any() else float("nan")
    return ages


def _path_share(features: dict[str, dict[str, RepFeatures]], path: FallbackPath) -> dict[str, float]:
    """Per setting, the share of holdout rows whose pair slot took ``path``."""
    return {name: float(np.mean(f["holdout"].path == path)) for name, f in features.items()}


def historical_sequences(
    model: GemModel, index: HistoryIndex, splits: Splits, main: dict[str, RepFeatures], length: int, out: Path
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Each split's ``(N, length, R)`` historical representations (the as-of user representation
    where a row has none), computed once for every event some row's window holds; the computed
    representations are written to ``out/rep_history.parquet`` (layout ``rep_history``)."""
    start = time.monotonic()
    cut = {}
    for split in SPLITS:
        rows = getattr(splits, split).rows
        cut[split] = (index.rows_of(rows.column("user_id").to_numpy()), rows.column("history_end").to_numpy())
    needed = np.unique(np.concatenate([events_needed(index, r, e, length) for r, e in cut.values()]))
    history = compute_rep_history(model, index, needed)
    table = rep_history_table(history, index)
    pq.write_table(table, out / REP_HISTORY_NAME)
    sequences = {s: rep_sequences(history, index, r, e, length, main[s].user) for s, (r, e) in cut.items()}
    held = {s: float(np.mean(np.any(seq != 0, axis=2).sum(1))) for s, seq in sequences.items()}
    codecs = {c: fit_codec(c, main["train"]).bytes_per_vector for c in ("float16", "int8", "pca16")}
    stats = {
        "length": length,
        "events_represented": len(history),
        "mean_held": held,
        "bytes_per_user": {c: length * b for c, b in codecs.items()},
        "seconds": round(time.monotonic() - start, 1),
    }
    log.info("historical representations of %d events in %.1f s", len(history), stats["seconds"])
    return sequences, stats


def run_transfer(config: TransferConfig) -> dict[str, Any]:
    """Run the job; writes ``OUTPUT/report.json`` and ``OUTPUT/transfer.png``; returns the report."""
    clock = {"start": time.monotonic()}
    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    histories, examples = load_features(config.features)
    index = HistoryIndex(histories)
    splits = prepare_splits(index, examples, config.vertical)
    task = config.vertical.task
    model = load_model(config.model, device=config.device)
    clock["data"] = time.monotonic()
    settings = as_of_settings(config.cadence_ms, config.pair_coverage, config.index_users)
    if config.use_beam:
        from pipelines.transfer.pipeline import run_asof_pipeline

        features = run_asof_pipeline(
            config.features,
            config.model,
            splits,
            settings,
            out / "asof",
            cast(Any, config.beam_options),
            config.runner,
            device=config.device,
        )
    else:
        features = _features_direct(model, index, splits, settings)
    clock["asof"] = time.monotonic()
    sequences: dict[str, np.ndarray] | None = None
    seq_stats: dict[str, Any] = {}
    if config.sequence_length:
        sequences, seq_stats = historical_sequences(model, index, splits, features[MAIN], config.sequence_length, out)
    clock["sequences"] = time.monotonic()
    run = run_variants(splits, task, features, gem_teacher(model, task), config.plan, sequences)
    clock["variants"] = time.monotonic()
    holdout = splits.holdout
    teacher_holdout = predict(model, holdout.examples, next(model.parameters()).device)[task]
    report = build_report(
        run,
        holdout.examples.fields[task],
        holdout.weights,
        teacher_holdout=teacher_holdout,
        ages_h=_mean_age_h(features),
        seed=config.vertical.seed,
    )
    clock["report"] = time.monotonic()
    report |= {
        "vertical": {"surface": config.vertical.surface, "objective": config.vertical.objective},
        "model_version": model.model_version,
        "splits": splits.summary(task),
        "paths": {s.name: features[s.name]["holdout"].path_counts() for s in settings},
        "settings": [
            {
                "name": s.name,
                "cadence": format_duration(s.cadence_ms / 1000),
                "lag": format_duration(max(s.lag_ms, 1) / 1000) if s.lag_ms else "0s",
                "pair_coverage": s.coverage,
            }
            for s in settings
        ],
        "fallback_paths_taken": "exact, same_user_pair, same_user, similar_users (the k nearest users in the "
        "snapshot's own index, their pairs of the same ad from that snapshot), none (zeros + the path one-hot)",
        "similar_users_share": _path_share(features, FallbackPath.SIMILAR_USERS),
        "historical_representations": seq_stats,
        "index_users": config.index_users,
        "plan": {**asdict(config.plan), "ranker": asdict(config.plan.ranker)},
        "seconds": {k: round(clock[k] - clock["start"], 1) for k in clock if k != "start"},
    }
    plot = plot_report(report, out / PLOT_NAME)
    report["plot"] = str(plot)
    (out / REPORT_NAME).write_text(json.dumps(json_safe(report), indent=2) + "\n")
    return report
