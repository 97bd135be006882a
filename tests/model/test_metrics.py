"""AUC and normalized entropy against brute-force definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.model.metrics import auc, normalized_entropy, task_metrics


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
