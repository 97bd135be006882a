"""AUC and normalized entropy against brute-force definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.model.metrics import auc, normalized_entropy, paired_auc_interval, task_metrics


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
        rows: list[tuple[bool, int, int]]) -> None:
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
