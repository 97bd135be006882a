"""AUC and normalized entropy against brute-force definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.model.train.metrics import auc, normalized_entropy, paired_auc_interval, seeded_auc_gain, task_metrics


@settings(max_examples=50, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=30))
def test_auc_equals_the_pairwise_definition_with_ties_counted_half(pairs: list[tuple[bool, int]]) -> None:
    labels = np.array([p[0] for p in pairs], dtype=float)
    scores = np.array([p[1] for p in pairs], dtype=float)
    pos, neg = scores[labels == 1], scores[labels == 0]
    if len(pos) == 0 or len(neg) == 0:
        assert math.isnan(auc(labels, scores))
        return
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auc(labels, scores) == pytest.approx(brute)


def test_normalized_entropy_is_one_for_the_base_rate_and_lower_for_a_better_model() -> None:
    labels = np.array([1, 0, 0, 0, 1, 0, 0, 0])
    assert normalized_entropy(labels, np.full(8, labels.mean())) == 1.0
    better = np.where(labels == 1, 0.6, 0.15)
    assert normalized_entropy(labels, better) < 1.0
    assert math.isnan(normalized_entropy(np.zeros(4), np.full(4, 0.1)))
    assert task_metrics(labels, better)["auc"] == 1.0


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(1, 3)), min_size=2, max_size=25))
def test_weighted_metrics_equal_the_unweighted_ones_on_rows_repeated_by_their_weight(
    rows: list[tuple[bool, int, int]],
) -> None:
    labels = np.array([r[0] for r in rows], dtype=float)
    scores = np.array([r[1] for r in rows], dtype=float)
    weights = np.array([r[2] for r in rows], dtype=float)
    repeat = np.repeat(np.arange(len(rows)), weights.astype(int))
    probs = (scores + 0.5) / 6.0
    weighted, repeated = task_metrics(labels, probs, weights), task_metrics(labels[repeat], probs[repeat])
    for key in ("auc", "ne", "log_loss", "positive_rate"):
        if math.isnan(repeated[key]):
            assert math.isnan(weighted[key])
        else:
            assert weighted[key] == pytest.approx(repeated[key])


def test_paired_interval_brackets_a_clear_gain() -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random(2000) < 0.2).astype(float)
    good, noise = labels + rng.normal(0, 0.7, 2000), rng.normal(0, 1, 2000)
    low, high = paired_auc_interval(labels, good, noise)
    gain = auc(labels, good) - auc(labels, noise)
    assert 0.2 < low <= gain <= high


def test_seeded_gain_averages_seeds_and_widens_its_interval_by_their_spread() -> None:
    rng = np.random.default_rng(1)
    labels = (rng.random(3000) < 0.1).astype(float)
    weights = rng.uniform(0.5, 2.0, 3000)
    base = [labels + rng.normal(0, 1.5, 3000) for _ in range(3)]
    better = [labels + rng.normal(0, sd, 3000) for sd in (0.6, 0.9, 1.2)]  # seeds disagree on how much better
    out = seeded_auc_gain(labels, better, base, weights, draws=100)
    each = [auc(labels, a, weights) - auc(labels, b, weights) for a, b in zip(better, base, strict=True)]
    assert out["per_seed"] == pytest.approx(each) and out["gain"] == pytest.approx(np.mean(each))
    assert out["seeds"] == 3 and out["seed_std"] == pytest.approx(np.std(each, ddof=1))
    half = out["high"] - out["gain"]
    assert half == pytest.approx(out["gain"] - out["low"])
    assert half >= 1.6449 * out["seed_std"] / np.sqrt(3) and half >= 1.6449 * out["rows_se"] > 0
    assert 0 < out["low"]  # a clear gain stays above zero


def test_seeded_gain_of_a_model_against_itself_is_exactly_zero() -> None:
    rng = np.random.default_rng(2)
    labels = (rng.random(500) < 0.3).astype(float)
    runs = [rng.random(500) for _ in range(2)]
    out = seeded_auc_gain(labels, runs, runs, draws=20)
    assert out["gain"] == out["low"] == out["high"] == 0.0
