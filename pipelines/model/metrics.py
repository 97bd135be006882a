"""Evaluation metrics for binary tasks: ROC AUC and normalized entropy."""

from __future__ import annotations

import math

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


def paired_auc_interval(labels: np.ndarray, a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None,
                        *, draws: int = 200, seed: int = 0) -> tuple[float, float]:
    """90% paired-bootstrap interval of ``AUC(a) - AUC(b)`` on the same rows (resampled together)."""
    rng = np.random.default_rng(seed)
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    diffs = []
    for _ in range(draws if len(labels) else 0):
        rows = rng.integers(0, len(labels), len(labels))
        diffs.append(auc(labels[rows], a[rows], w[rows]) - auc(labels[rows], b[rows], w[rows]))
    finite = np.asarray([d for d in diffs if np.isfinite(d)])
    if not len(finite):
        return float("nan"), float("nan")
    return float(np.quantile(finite, 0.05)), float(np.quantile(finite, 0.95))
