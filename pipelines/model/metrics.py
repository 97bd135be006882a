"""Evaluation metrics for binary tasks: ROC AUC and normalized entropy."""

from __future__ import annotations

import math

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC with ties counted half (Mann-Whitney U); NaN when one class is absent.

    ``labels: (N,)`` in {0, 1}; ``scores: (N,)`` any real values.
    """
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    positives = float(labels.sum())
    negatives = float(len(labels) - positives)
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # average rank of each group of tied scores (1-based)
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy (nats); ``labels, probs: (N,)``."""
    labels = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1 - eps)
    return float(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean())


def normalized_entropy(labels: np.ndarray, probs: np.ndarray) -> float:
    """Log loss divided by the entropy of the base rate (He et al. 2014): below 1.0 beats
    predicting the average; NaN when the labels have one class only."""
    rate = float(np.mean(labels)) if len(labels) else 0.0
    if rate <= 0.0 or rate >= 1.0:
        return float("nan")
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return log_loss(labels, probs) / base


def task_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """``{"auc", "ne", "log_loss", "positive_rate", "count"}`` of one task."""
    return {
        "auc": auc(labels, probs),
        "ne": normalized_entropy(labels, probs),
        "log_loss": log_loss(labels, probs) if len(labels) else float("nan"),
        "positive_rate": float(np.mean(labels)) if len(labels) else float("nan"),
        "count": len(labels),
    }
