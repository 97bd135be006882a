"""Evaluation metrics for binary tasks: ROC AUC and normalized entropy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """ROC AUC with ties counted half (Mann-Whitney U); NaN when one class is absent.

    ``labels: (N,)`` in {0, 1}; ``scores: (N,)`` any real values; ``weights: (N,)`` row
    weights (e.g. the inverse of a row's sampling rate), all 1 when omitted.
    """
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype=np.float64)
    pos_w, neg_w = w * labels, w * (1 - labels)
    positives, negatives = float(pos_w.sum()), float(neg_w.sum())
    if positives <= 0 or negatives <= 0:
        return float("nan")
    # per group of tied scores: negatives strictly below count whole, tied ones half
    _, group = np.unique(scores, return_inverse=True)
    neg_in = np.bincount(group, weights=neg_w)
    below = np.cumsum(neg_in) - neg_in
    pos_in = np.bincount(group, weights=pos_w)
    return float((pos_in * (below + 0.5 * neg_in)).sum() / (positives * negatives))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7, weights: np.ndarray | None = None) -> float:
    """Mean (weighted) binary cross-entropy (nats); ``labels, probs, weights: (N,)``."""
    labels = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    return float(np.average(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)), weights=weights))


def normalized_entropy(labels: np.ndarray, probs: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Log loss divided by the entropy of the base rate (He et al. 2014): below 1.0 beats
    predicting the average; NaN when the labels have one class only."""
    rate = float(np.average(labels, weights=weights)) if len(labels) else 0.0
    if rate <= 0.0 or rate >= 1.0:
        return float("nan")
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return log_loss(labels, probs, weights=weights) / base


def task_metrics(labels: np.ndarray, probs: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """``{"auc", "ne", "log_loss", "positive_rate", "count", "positives"}`` of one task; rows
    weighted by ``weights`` (the inverse of their sampling rate) when given, so the figures
    estimate those of the unsampled rows."""
    empty = not len(labels)
    return {
        "auc": auc(labels, probs, weights),
        "ne": normalized_entropy(labels, probs, weights),
        "log_loss": float("nan") if empty else log_loss(labels, probs, weights=weights),
        "positive_rate": float("nan") if empty else float(np.average(labels, weights=weights)),
        "count": len(labels),
        "positives": int(np.sum(labels)),
    }


def paired_auc_draws(
    labels: np.ndarray,
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    weights: np.ndarray | None = None,
    *,
    draws: int = 200,
    seed: int = 0,
) -> np.ndarray:
    """Bootstrap draws ``(D,)`` of the mean over pairs of ``AUC(a[s]) - AUC(b[s])``: every draw
    resamples the rows once and scores every pair on them (paired across models and seeds).
    Draws where a class is missing are dropped."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    diffs = []
    for _ in range(draws if len(labels) else 0):
        rows = rng.integers(0, len(labels), len(labels))
        diffs.append(
            float(
                np.mean(
                    [
                        auc(labels[rows], x[rows], w[rows]) - auc(labels[rows], y[rows], w[rows])
                        for x, y in zip(a, b, strict=True)
                    ]
                )
            )
        )
    return np.asarray([d for d in diffs if np.isfinite(d)])


def paired_auc_interval(
    labels: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    draws: int = 200,
    seed: int = 0,
) -> tuple[float, float]:
    """90% paired-bootstrap interval of ``AUC(a) - AUC(b)`` on the same rows (resampled together)."""
    finite = paired_auc_draws(labels, [a], [b], weights, draws=draws, seed=seed)
    if not len(finite):
        return float("nan"), float("nan")
    return float(np.quantile(finite, 0.05)), float(np.quantile(finite, 0.95))


_Z90 = 1.6449  # two-sided 90%: mean +- 1.645 standard errors


def seeded_auc_gain(
    labels: np.ndarray,
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    weights: np.ndarray | None = None,
    *,
    draws: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """The AUC gain of setting A over setting B, trained with S seeds each and scored on the
    same rows: ``a[s], b[s]: (N,)`` are the predictions of seed s.

    Returns ``gain`` (the mean over seeds of ``AUC(a[s]) - AUC(b[s])``), ``per_seed``,
    ``seed_std`` (their sample std), ``rows_se`` (the std of the mean gain over bootstrap
    resamples of the rows) and a 90% interval ``low..high`` = gain +- 1.645 * sqrt(rows_se^2
    + seed_std^2 / S): the holdout's sampling noise plus the noise of training with S seeds
    (normal approximation; with one seed the seed term is unknown and left out, see
    ``seeds``)."""
    w = None if weights is None else np.asarray(weights, np.float64)
    labels = np.asarray(labels)
    per_seed = [auc(labels, x, w) - auc(labels, y, w) for x, y in zip(a, b, strict=True)]
    gain = float(np.mean(per_seed))
    boot = paired_auc_draws(labels, a, b, w, draws=draws, seed=seed)
    rows_se = float(np.std(boot, ddof=1)) if len(boot) > 1 else float("nan")
    seed_std = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    half = _Z90 * math.sqrt(rows_se**2 + seed_std**2 / len(per_seed))
    return {
        "gain": gain,
        "low": gain - half,
        "high": gain + half,
        "per_seed": per_seed,
        "seeds": len(per_seed),
        "seed_std": seed_std,
        "rows_se": rows_se,
    }
