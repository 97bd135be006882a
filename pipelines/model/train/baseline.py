"""The baseline the model must beat: popularity plus logistic regression on count features.

Features of an example, all point-in-time (computed from the same history prefix the
model sees, or from training-split statistics): the user's history length and its
impression, click and conversion counts and smoothed click rate before the
impression, time since the user's last event; the item's, advertiser's and
category's training-split impression count and smoothed click / conversion rate
(leave-one-out on training rows, so a row never sees its own label); is_ad, the
surface and the device as one-hot codes. "Popularity" alone is the item's smoothed rate.
"""

from __future__ import annotations

import numpy as np
import torch

from pipelines.model.inputs import ExampleSet
from pipelines.schemas.enums import CLICK, CONVERSION_CODES, DEVICES, IMPRESSION, SURFACES

_SMOOTHING = 20.0


class TargetRate:
    """Smoothed rate of ``labels`` per key: ``(sum + a * prior) / (count + a)``."""

    def __init__(self, keys: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> None:
        w = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
        self.prior = float(np.average(labels, weights=w)) if len(labels) else 0.0
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.sums = np.bincount(inverse, weights=labels * w, minlength=len(self.keys))
        self.counts = np.bincount(inverse, weights=w, minlength=len(self.keys))

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        hit = self.keys[pos] == keys if len(self.keys) else np.zeros(len(keys), bool)
        return pos, hit

    def rate(
        self, keys: np.ndarray, own_labels: np.ndarray | None = None, own_weights: np.ndarray | float = 1.0
    ) -> np.ndarray:
        """Smoothed rate per key; with ``own_labels`` each row's own (weighted) label is left out."""
        pos, hit = self._find(keys)
        sums = np.where(hit, self.sums[pos], 0.0)
        counts = np.where(hit, self.counts[pos], 0.0)
        if own_labels is not None:
            sums, counts = sums - own_labels * own_weights, np.maximum(counts - own_weights, 0.0)
        return (sums + _SMOOTHING * self.prior) / (counts + _SMOOTHING)

    def count(self, keys: np.ndarray, leave_one_out: bool | np.ndarray = False) -> np.ndarray:
        """(Weighted) count per key; ``leave_one_out``: True, or each row's own weight, taken off."""
        pos, hit = self._find(keys)
        return np.where(hit, self.counts[pos], 0.0) - np.asarray(leave_one_out, np.float64)


def _prefix_counts(examples: ExampleSet) -> dict[str, np.ndarray]:
    index = examples.index
    event_type = index.columns["event_type"]
    start = index.offsets[np.maximum(examples.rows, 0)]
    end = start + np.where(examples.rows >= 0, examples.ends, 0)
    out: dict[str, np.ndarray] = {}
    for name, mask in (
        ("impressions", event_type == IMPRESSION),
        ("clicks", event_type == CLICK),
        ("conversions", np.isin(event_type, CONVERSION_CODES)),
    ):
        cumulative = np.concatenate([[0], np.cumsum(mask)])
        out[name] = (cumulative[end] - cumulative[start]).astype(np.float64)
    last = np.where(end > start, index.event_time[np.maximum(end - 1, 0)], examples.request_ms - 10**10)
    out["recency"] = np.log1p(np.maximum(examples.request_ms - last, 0) / 1000.0)
    return out


def _one_hot(codes: np.ndarray, n: int) -> np.ndarray:
    return np.eye(n + 1)[np.where((codes >= 0) & (codes < n), codes, n)]


class CountFeatures:
    """Turns an :class:`ExampleSet` into a ``(N, F)`` feature matrix; fitted on the training split."""

    def __init__(self, train: ExampleSet, weights: np.ndarray | None = None) -> None:
        f = train.fields
        self.weights = np.ones(len(train)) if weights is None else np.asarray(weights, np.float64)
        self.rates = {
            (key, task): TargetRate(f[key], f[task], self.weights)
            for key in ("target_item", "target_advertiser", "target_category")
            for task in ("clicked", "converted")
        }

    def popularity(self, examples: ExampleSet, task: str, train: bool) -> np.ndarray:
        own = examples.fields[task] if train else None
        return self.rates[("target_item", task)].rate(examples.fields["target_item"], own, self.weights)

    def matrix(self, examples: ExampleSet, train: bool) -> np.ndarray:
        f, counts = examples.fields, _prefix_counts(examples)
        columns = [
            np.log1p(f["history_length"]),
            np.log1p(counts["impressions"]),
            np.log1p(counts["clicks"]),
            np.log1p(counts["conversions"]),
            (counts["clicks"] + 1) / (counts["impressions"] + 10),
            counts["recency"],
            f["target_is_ad"].astype(np.float64),
        ]
        for (key, task), rate in self.rates.items():
            columns.append(rate.rate(f[key], f[task] if train else None, self.weights))
            if task == "clicked":
                own = self.weights if train else False
                columns.append(np.log1p(np.maximum(rate.count(f[key], leave_one_out=own), 0)))
        dense = np.stack(columns, axis=1)
        return np.concatenate(
            [dense, _one_hot(f["request_surface"], len(SURFACES)), _one_hot(f["device"], len(DEVICES))], axis=1
        )


def fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-4, steps: int = 200, sample_weight: np.ndarray | None = None
) -> np.ndarray:
    """Weights ``(F + 1,)`` (bias last) of an L2-regularised logistic regression (L-BFGS, float64),
    rows weighted by ``sample_weight`` (normalised to mean 1) when given."""
    torch.manual_seed(0)
    xt = torch.from_numpy(np.concatenate([x, np.ones((len(x), 1))], axis=1))
    yt = torch.from_numpy(y.astype(np.float64))
    sw = None if sample_weight is None else torch.from_numpy(sample_weight / sample_weight.mean())
    w = torch.zeros(xt.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w, yt, weight=sw) + l2 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy()


def predict_logistic(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ w[:-1] + w[-1])))


class CountBaseline:
    """Popularity + logistic regression on count features, one regression per task."""

    def __init__(self, train: ExampleSet, weights: np.ndarray | None = None) -> None:
        """Fitted on ``train``, rows weighted by ``weights`` (the inverse of their sampling rate)."""
        self.features = CountFeatures(train, weights)
        x = self.features.matrix(train, train=True)
        self.mean, self.std = x.mean(axis=0), x.std(axis=0) + 1e-6
        xs = (x - self.mean) / self.std
        self.weights = {
            task: fit_logistic(xs, train.fields[task], sample_weight=self.features.weights)
            for task in ("clicked", "converted")
        }

    def predict(self, examples: ExampleSet) -> dict[str, np.ndarray]:
        xs = (self.features.matrix(examples, train=False) - self.mean) / self.std
        return {task: predict_logistic(w, xs) for task, w in self.weights.items()}
