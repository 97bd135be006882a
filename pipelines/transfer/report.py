"""The transfer report: holdout AUC and NE per variant with 90% intervals, gains over ``alone``,
the transfer ratio, the freshness row, and a plot of gain against representation age and bytes.

Intervals: a variant's AUC and NE are means over seeds, their interval the 5th..95th percentile
over bootstrap resamples of the holdout rows (the same resamples for every variant, so gains and
the ratio are paired). A gain's interval is :func:`pipelines.model.train.metrics.seeded_auc_gain`'s:
the rows' bootstrap noise plus the seeds' spread. ``reps_instead_of_kd`` = AUC gain with the
as-of representations / AUC gain with distillation (LoopFM's snapshot form *instead of* KD, not
the paper's measure); ``reps_instead_of_kd_p05`` its 5th percentile over the
paired row resamples (a draw where distillation gains nothing and representations do counts as
an unbounded ratio).

The paper's measure (LoopFM, arXiv 2605.29280), under ``loopfm``: FM gain = AUC(GEM live) -
AUC(alone); TR(variant) = (AUC(variant) - AUC(alone)) / FM gain, its interval the 5th..95th
percentile of the same ratio on each paired row resample (seed means); ``loopfm_on_kd`` =
TR(KD + LoopFM) / TR(KD) (= the ratio of their gains over alone), with its 5th percentile over the
paired resamples as ``loopfm_on_kd_p05``. KD + LoopFM is ``seq_reps_distilled`` (both LoopFM forms
on top of distillation) when the sequence variants ran, else ``reps_distilled`` (the snapshot form).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.model.train.metrics import auc, normalized_entropy, seeded_auc_gain
from pipelines.transfer.variants import VariantRun

__all__ = ["LOOPFM_VARIANTS", "build_report", "json_safe", "plot_report"]

DRAWS = 200
#: The paper's names for the variants whose transfer ratio the report gives.
LOOPFM_VARIANTS = {
    "kd": "distilled",
    "loopfm_snapshot": "reps",
    "loopfm_sequence": "seq",
    "loopfm": "seq_reps",
    "kd_loopfm_snapshot": "reps_distilled",
    "kd_loopfm": "seq_reps_distilled",
}


def json_safe(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _metric_draws(
    labels: np.ndarray, weights: np.ndarray, probs: dict[str, list[np.ndarray]], seed: int
) -> dict[str, dict[str, np.ndarray]]:
    """Per variant, ``auc``/``ne`` of the seed mean on ``DRAWS`` shared row resamples."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {v: {"auc": [], "ne": []} for v in probs}
    for _ in range(DRAWS):
        rows = rng.integers(0, len(labels), len(labels))
        y, w = labels[rows], weights[rows]
        for v, per_seed in probs.items():
            out[v]["auc"].append(float(np.mean([auc(y, p[rows], w) for p in per_seed])))
            out[v]["ne"].append(float(np.mean([normalized_entropy(y, p[rows], w) for p in per_seed])))
    return {v: {k: np.asarray(x) for k, x in m.items()} for v, m in out.items()}


def _q(draws: np.ndarray, q: float) -> float:
    finite = draws[np.isfinite(draws)]
    return float(np.quantile(finite, q)) if len(finite) else float("nan")


def _ratio_p05(gain_reps: np.ndarray, gain_distill: np.ndarray) -> float:
    ratio = np.where(
        gain_distill > 0, gain_reps / np.where(gain_distill > 0, gain_distill, 1.0), np.sign(gain_reps) * np.inf
    )
    ratio = ratio[~np.isnan(ratio)]
    return float(np.quantile(ratio, 0.05, method="lower")) if len(ratio) else float("nan")


def build_report(
    run: VariantRun,
    labels: np.ndarray,
    weights: np.ndarray,
    *,
    teacher_holdout: np.ndarray | None = None,
    ages_h: dict[str, float] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The report's figures (see the module docstring); ``ages_h``: mean pair-slot age in hours of
    each representation variant on the holdout."""
    labels = np.asarray(labels, np.float64)
    scored = run.holdout_probs | ({"gem": [np.asarray(teacher_holdout)]} if teacher_holdout is not None else {})
    draws = _metric_draws(labels, weights, scored, seed)
    alone = run.holdout_probs["alone"]
    variants: dict[str, Any] = {}
    for v, per_seed in run.holdout_probs.items():
        a = float(np.mean([auc(labels, p, weights) for p in per_seed]))
        row: dict[str, Any]
        ne = float(np.mean([normalized_entropy(labels, p, weights) for p in per_seed]))
        row = {
            "auc": a,
            "auc_p05": _q(draws[v]["auc"], 0.05),
            "auc_p95": _q(draws[v]["auc"], 0.95),
            "ne": ne,
            "ne_p05": _q(draws[v]["ne"], 0.05),
            "ne_p95": _q(draws[v]["ne"], 0.95),
            "train_digest": run.train_digest[v],
        }
        if v != "alone":
            g = seeded_auc_gain(labels, per_seed, alone, weights, draws=DRAWS, seed=seed)
            ne_gain = draws["alone"]["ne"] - draws[v]["ne"]
            row |= {
                "auc_gain": g["gain"],
                "auc_gain_p05": g["low"],
                "auc_gain_p95": g["high"],
                "auc_gain_per_seed": g["per_seed"],
                "ne_gain": float(np.mean([normalized_entropy(labels, p, weights) for p in alone])) - ne,
                "ne_gain_p05": _q(ne_gain, 0.05),
                "ne_gain_p95": _q(ne_gain, 0.95),
            }
        if v in run.bytes_per_vector:
            row["bytes_per_user"] = row["bytes_per_pair"] = run.bytes_per_vector[v]
        if ages_h and v in ages_h:
            row["mean_age_h"] = ages_h[v]
        variants[v] = row
    gain_draws = {v: draws[v]["auc"] - draws["alone"]["auc"] for v in draws}
    ratio = (
        variants["reps"]["auc_gain"] / variants["distilled"]["auc_gain"]
        if variants["distilled"]["auc_gain"]
        else float("nan")
    )
    report: dict[str, Any] = {
        "variants": variants,
        "reps_instead_of_kd": ratio,
        "reps_instead_of_kd_p05": _ratio_p05(gain_draws["reps"], gain_draws["distilled"]),
        "reps_minus_distilled": seeded_auc_gain(
            labels, run.holdout_probs["reps"], run.holdout_probs["distilled"], weights, draws=DRAWS, seed=seed
        ),
        "distillation": {"choice": run.distill_choice, "grid": run.distill_grid},
        "sequence_reader": run.seq_mode_choice,
        "freshness": _freshness(run, labels, weights, variants, seed),
    }
    if teacher_holdout is not None:
        report["gem_live"] = {
            "auc": auc(labels, teacher_holdout, weights),
            "ne": normalized_entropy(labels, teacher_holdout, weights),
        }
        report["loopfm"] = _loopfm(variants, draws, report["gem_live"]["auc"])
        report["loopfm_on_kd"] = report["loopfm"]["loopfm_on_kd"]
        report["loopfm_on_kd_p05"] = report["loopfm"]["loopfm_on_kd_p05"]
    report["verdict"] = _verdict(report)
    return report


def _loopfm(variants: dict[str, Any], draws: dict[str, dict[str, np.ndarray]], gem_auc: float) -> dict[str, Any]:
    """The paper's transfer ratios (see the module docstring)."""
    fm_gain = gem_auc - variants["alone"]["auc"]
    fm_draws = draws["gem"]["auc"] - draws["alone"]["auc"]
    ratios: dict[str, Any] = {}
    for paper, v in LOOPFM_VARIANTS.items():
        if v not in variants:
            continue
        tr_draws = (draws[v]["auc"] - draws["alone"]["auc"]) / np.where(fm_draws != 0, fm_draws, np.nan)
        ratios[paper] = {
            "variant": v,
            "tr": variants[v]["auc_gain"] / fm_gain if fm_gain else float("nan"),
            "tr_p05": _q(tr_draws, 0.05),
            "tr_p95": _q(tr_draws, 0.95),
        }
    on_top = "seq_reps_distilled" if "seq_reps_distilled" in variants else "reps_distilled"
    gains = {v: draws[v]["auc"] - draws["alone"]["auc"] for v in (on_top, "distilled")}
    kd_gain = variants["distilled"]["auc_gain"]
    return {
        "fm_gain": fm_gain,
        "fm_gain_p05": _q(fm_draws, 0.05),
        "fm_gain_p95": _q(fm_draws, 0.95),
        "transfer_ratio": ratios,
        "kd_loopfm_variant": on_top,
        "loopfm_on_kd": variants[on_top]["auc_gain"] / kd_gain if kd_gain else float("nan"),
        "loopfm_on_kd_p05": _ratio_p05(gains[on_top], gains["distilled"]),
    }


def _freshness(
    run: VariantRun, labels: np.ndarray, weights: np.ndarray, variants: dict[str, Any], seed: int
) -> dict[str, Any]:
    if not run.adapter_probs:
        return {}
    alone = run.holdout_probs["alone"]
    stale = seeded_auc_gain(labels, run.adapter_probs["stale"], alone, weights, draws=DRAWS, seed=seed)
    adapted = seeded_auc_gain(labels, run.adapter_probs["adapted"], alone, weights, draws=DRAWS, seed=seed)
    fresh = variants["reps"]["auc_gain"]
    lost = fresh - stale["gain"]
    return {
        "fresh_auc_gain": fresh,
        "stale_auc_gain": stale["gain"],
        "stale_auc_gain_p05": stale["low"],
        "stale_auc_gain_p95": stale["high"],
        "adapted_auc_gain": adapted["gain"],
        "adapted_auc_gain_p05": adapted["low"],
        "adapted_auc_gain_p95": adapted["high"],
        "recovered_share": (adapted["gain"] - stale["gain"]) / lost if lost > 0 else float("nan"),
    }


def _verdict(report: dict[str, Any]) -> str:
    v = report["variants"]
    reps, dist = v["reps"], v["distilled"]
    diff = report["reps_minus_distilled"]
    if diff["low"] > 0:
        word = "beat"
    elif diff["high"] < 0:
        word = "lose to"
    else:
        word = "are not distinguishable from"
    return (
        f"representations {word} distillation: AUC gain over alone {reps['auc_gain']:+.4f} "
        f"[{reps['auc_gain_p05']:+.4f}, {reps['auc_gain_p95']:+.4f}] vs {dist['auc_gain']:+.4f} "
        f"[{dist['auc_gain_p05']:+.4f}, {dist['auc_gain_p95']:+.4f}]; difference {diff['gain']:+.4f} "
        f"[{diff['low']:+.4f}, {diff['high']:+.4f}]; gain ratio {report['reps_instead_of_kd']:.2f} "
        f"(p05 {report['reps_instead_of_kd_p05']:.2f})"
    )


def plot_report(report: dict[str, Any], path: str | Path) -> Path:
    """Two panels: AUC gain over alone against representation age, and against bytes per vector;
    distillation's gain as a band in both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = report["variants"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    dist = v["distilled"]
    for ax in (left, right):
        ax.axhspan(dist["auc_gain_p05"], dist["auc_gain_p95"], color="tab:orange", alpha=0.2)
        ax.axhline(dist["auc_gain"], color="tab:orange", label="distilled")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_ylabel("holdout AUC gain over alone")

    def points(names: list[str], key: str) -> tuple[list[float], list[float], list[list[float]]]:
        names = [n for n in names if n in v and v[n].get(key) is not None]
        xs = [v[n][key] for n in names]
        ys = [v[n]["auc_gain"] for n in names]
        err = [
            [y - v[n]["auc_gain_p05"] for n, y in zip(names, ys, strict=True)],
            [v[n]["auc_gain_p95"] - y for n, y in zip(names, ys, strict=True)],
        ]
        return xs, ys, err

    xs, ys, err = points(["reps", *sorted(n for n in v if n.startswith("reps_age_"))], "mean_age_h")
    order = np.argsort(xs)
    left.errorbar(
        np.asarray(xs)[order],
        np.asarray(ys)[order],
        yerr=np.asarray(err)[:, order],
        marker="o",
        label="with representations",
    )
    left.set_xscale("log")
    left.set_xlabel("mean representation age at the impression (hours)")
    xs, ys, err = points(["reps", *[n for n in v if n.startswith(("reps_int", "reps_pca"))]], "bytes_per_pair")
    right.errorbar(xs, ys, yerr=err, marker="o", ls="none", label="with representations")
    right.set_xlabel("bytes per stored representation (user or pair)")
    for ax in (left, right):
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(
        f"representations instead of KD: gain ratio {report['reps_instead_of_kd']:.2f} "
        f"(p05 {report['reps_instead_of_kd_p05']:.2f})"
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
