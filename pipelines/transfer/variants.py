"""The downstream variants, trained on identical examples, scored on the same holdout rows.

======================  ========================================================================
``alone``               the ranker on its own features
``distilled``           + the GEM model's predicted probabilities on the training rows as soft
                        labels; temperature and weight chosen by validation AUC
``reps``                + the as-of user and pair representations (float16, as stored),
                        missing ones resolved through the fallback policy
``reps_int8``           the same, stored as int8 with a scale per vector
``reps_pcaK``           the same, projected to K dims (PCA fitted on the training split)
``reps_distilled``      representations and distillation (the temperature/weight chosen above)
``reps_age_X``          representations at least X old (trained and scored so)
``reps_similar``        representations whose uncovered pairs take the similar-users path (the
                        chain without the same-user step) instead of the user-level vector
``seq``                 + the last L historical representations (LoopFM's sequence form), read
                        by target attention or pooling, whichever the validation split prefers
``seq_reps``            + the sequence and the as-of representations (LoopFM, both forms)
``seq_reps_distilled``  LoopFM (both forms) on top of distillation (the temperature/weight above)
======================  ========================================================================

The ``seq*`` variants run when the historical representation sequences are given.

The freshness row: the ``reps`` ranker served representations ``adapter_age`` old, then with a
residual adapter trained on the validation split (the newest labels) with those stale
representations while the ranker stays frozen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from tqdm import tqdm

from pipelines.model.context import WINDOW
from pipelines.model.train.metrics import auc
from pipelines.transfer.compress import Codec, fit_codec, rep_block
from pipelines.transfer.data import Splits
from pipelines.transfer.downstream import (
    SEQ_MODES,
    Distill,
    DownstreamRanker,
    RankerConfig,
    RankerInputs,
    fit_adapter,
    fit_ranker,
    predict_adapted,
    predict_ranker,
    ranker_inputs,
)
from pipelines.transfer.snapshots import RepFeatures

log = logging.getLogger(__name__)

__all__ = ["MAIN", "VariantPlan", "VariantRun", "run_variants"]

#: the as-of setting every representation variant but the age ones reads
MAIN = "main"
SPLITS = ("train", "validation", "holdout")


@dataclass(frozen=True)
class VariantPlan:
    """What to train: seeds, the distillation grid, the codecs, the age settings, the other fallback
    settings (``reps_<name>``), the adapter's age, the ranker and the length of its own window."""

    seeds: tuple[int, ...] = (0, 1)
    temperatures: tuple[float, ...] = (1.0, 2.0, 4.0)
    distill_weights: tuple[float, ...] = (0.25, 0.5, 0.75)
    codecs: tuple[str, ...] = ("int8", "pca16")
    ages: tuple[str, ...] = ("age_1h", "age_1d", "age_7d")
    fallbacks: tuple[str, ...] = ("similar",)
    adapter_age: str = "age_7d"
    ranker: RankerConfig = field(default_factory=RankerConfig)
    vm_window: int = WINDOW  # the ranker's own window of last events (production VMs see a short one)
    progress: bool = True


@dataclass
class VariantRun:
    """Per variant: holdout probabilities per seed, the rows' digest, representation bytes; the
    distillation choice of each seed; the adapter row's probabilities; the validation AUCs of the grid."""

    holdout_probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    train_digest: dict[str, str] = field(default_factory=dict)
    bytes_per_vector: dict[str, int] = field(default_factory=dict)
    distill_grid: list[dict[str, float]] = field(default_factory=list)
    distill_choice: list[dict[str, float]] = field(default_factory=list)
    adapter_probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    seq_mode_choice: dict[str, object] = field(default_factory=dict)


def _add(run: VariantRun, name: str, digest: str, probs: np.ndarray) -> None:
    run.holdout_probs.setdefault(name, []).append(probs)
    previous = run.train_digest.setdefault(name, digest)
    assert previous == digest, f"variant {name} trained on other rows across seeds"


def _choose_distill(
    x: dict[str, RankerInputs], splits: Splits, teacher: np.ndarray, plan: VariantPlan, seed: int
) -> tuple[Distill, list[dict[str, float]], dict[tuple[float, float], DownstreamRanker]]:
    grid, models = [], {}
    for t in plan.temperatures:
        for w in plan.distill_weights:
            d = Distill(teacher, t, w)
            model = fit_ranker(x["train"], splits.train.weights, plan.ranker, distill=d, seed=seed)
            val = auc(x["validation"].labels, predict_ranker(model, x["validation"]), splits.validation.weights)
            grid.append({"temperature": t, "weight": w, "validation_auc": val, "seed": seed})
            models[(t, w)] = model
    best = max((g for g in grid if np.isfinite(g["validation_auc"])), key=lambda g: g["validation_auc"], default=None)
    t, w = (plan.temperatures[0], plan.distill_weights[0]) if best is None else (best["temperature"], best["weight"])
    return Distill(teacher, t, w), grid, models


def _choose_seq_mode(
    x: dict[str, RankerInputs], splits: Splits, seq: dict[str, np.ndarray], plan: VariantPlan
) -> tuple[RankerConfig, dict[str, object]]:
    """The sequence reader (attention or pooling) with the better validation AUC, first seed."""
    seed, scores = plan.seeds[0], {}
    for mode in SEQ_MODES:
        config = replace(plan.ranker, seq_mode=mode)
        model = fit_ranker(x["train"], splits.train.weights, config, seq=seq["train"], seed=seed)
        scores[mode] = auc(
            x["validation"].labels,
            predict_ranker(model, x["validation"], seq=seq["validation"]),
            splits.validation.weights,
        )
    best = max(SEQ_MODES, key=lambda m: scores[m] if np.isfinite(scores[m]) else -np.inf)
    return replace(plan.ranker, seq_mode=best), {"mode": best, "validation_auc": scores, "seed": seed}


def _sequence_variants(
    run: VariantRun,
    x: dict[str, RankerInputs],
    splits: Splits,
    seq: dict[str, np.ndarray],
    reps: dict[str, np.ndarray],
    distill: Distill,
    config: RankerConfig,
    seed: int,
) -> None:
    digest, w = splits.train.digest(), splits.train.weights
    for name, rep, d in (("seq", None, None), ("seq_reps", reps, None), ("seq_reps_distilled", reps, distill)):
        model = fit_ranker(
            x["train"], w, config, rep=None if rep is None else rep["train"], seq=seq["train"], distill=d, seed=seed
        )
        probs = predict_ranker(model, x["holdout"], None if rep is None else rep["holdout"], seq["holdout"])
        _add(run, name, digest, probs)


def run_variants(
    splits: Splits,
    task: str,
    features: dict[str, dict[str, RepFeatures]],
    teacher: Callable[[Splits], np.ndarray],
    plan: VariantPlan,
    sequences: dict[str, np.ndarray] | None = None,
) -> VariantRun:
    """Train every variant for every seed on ``splits.train`` (``features[setting][split]``: as-of
    features of each split; ``teacher(splits)``: the GEM model's probabilities on the training
    rows only, in their order; ``sequences[split] (N, L, R)``: the historical representations of
    each split's rows, for the ``seq*`` variants)."""
    x = {name: ranker_inputs(getattr(splits, name).examples, task, plan.vm_window) for name in SPLITS}
    soft = np.asarray(teacher(splits), np.float32)
    if soft.shape != (len(x["train"]),):
        raise ValueError(f"teacher gave {soft.shape} targets for {len(x['train'])} training rows")
    digest = splits.train.digest()
    float16 = fit_codec("float16", features[MAIN]["train"])
    codecs: dict[str, Codec] = {c: fit_codec(c, features[MAIN]["train"]) for c in plan.codecs}
    run = VariantRun()
    run.bytes_per_vector = {"reps": float16.bytes_per_vector} | {
        f"reps_{c}": codec.bytes_per_vector for c, codec in codecs.items()
    }

    def block(setting: str, split: str, codec: Codec = float16) -> np.ndarray:
        return rep_block(features[setting][split], codec)

    others = (*plan.ages, *plan.fallbacks)
    total = len(plan.seeds) * (4 + len(plan.temperatures) * len(plan.distill_weights) + len(codecs) + len(others))
    bar = tqdm(total=total, desc="downstream variants", disable=not plan.progress, dynamic_ncols=True)
    seq_config = plan.ranker
    if sequences is not None:
        seq_config, run.seq_mode_choice = _choose_seq_mode(x, splits, sequences, plan)
    for seed in plan.seeds:
        rc, w = plan.ranker, splits.train.weights
        alone = fit_ranker(x["train"], w, rc, seed=seed)
        _add(run, "alone", digest, predict_ranker(alone, x["holdout"]))
        bar.update(1)
        distill, grid, models = _choose_distill(x, splits, soft, plan, seed)
        bar.update(len(grid))
        run.distill_grid += grid
        run.distill_choice.append({"seed": seed, "temperature": distill.temperature, "weight": distill.weight})
        _add(run, "distilled", digest, predict_ranker(models[(distill.temperature, distill.weight)], x["holdout"]))
        reps = fit_ranker(x["train"], w, rc, rep=block(MAIN, "train"), seed=seed)
        _add(run, "reps", digest, predict_ranker(reps, x["holdout"], block(MAIN, "holdout")))
        bar.update(1)
        for c, codec in codecs.items():
            model = fit_ranker(x["train"], w, rc, rep=block(MAIN, "train", codec), seed=seed)
            _add(run, f"reps_{c}", digest, predict_ranker(model, x["holdout"], block(MAIN, "holdout", codec)))
            bar.update(1)
        both = fit_ranker(x["train"], w, rc, rep=block(MAIN, "train"), distill=distill, seed=seed)
        _add(run, "reps_distilled", digest, predict_ranker(both, x["holdout"], block(MAIN, "holdout")))
        bar.update(1)
        if sequences is not None:
            snapshot = {s: block(MAIN, s) for s in ("train", "holdout")}
            _sequence_variants(run, x, splits, sequences, snapshot, distill, seq_config, seed)
        for setting in others:
            model = fit_ranker(x["train"], w, rc, rep=block(setting, "train"), seed=seed)
            _add(run, f"reps_{setting}", digest, predict_ranker(model, x["holdout"], block(setting, "holdout")))
            bar.update(1)
        stale = block(plan.adapter_age, "holdout")
        run.adapter_probs.setdefault("stale", []).append(predict_ranker(reps, x["holdout"], stale))
        adapter = fit_adapter(
            reps, x["validation"], splits.validation.weights, block(plan.adapter_age, "validation"), seed=seed
        )
        run.adapter_probs.setdefault("adapted", []).append(predict_adapted(reps, adapter, x["holdout"], stale))
        bar.update(1)
    bar.close()
    return run
