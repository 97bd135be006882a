"""Compressed representation features and the report's intervals and ratio."""

from __future__ import annotations

import numpy as np

from pipelines.similarity.policy import FallbackPath
from pipelines.transfer.compress import fit_codec, rep_block
from pipelines.transfer.report import _ratio_p05, build_report
from pipelines.transfer.snapshots import RepFeatures
from pipelines.transfer.variants import VariantRun


def _features(n: int = 300, dim: int = 16, seed: int = 0) -> RepFeatures:
    rng = np.random.default_rng(seed)
    user = rng.normal(size=(n, dim)).astype(np.float32)
    pair = rng.normal(size=(n, dim)).astype(np.float32)
    path = np.full(n, FallbackPath.EXACT, np.int8)
    path[:10] = FallbackPath.NONE
    user[:10] = pair[:10] = 0.0
    ages = np.where(path == FallbackPath.NONE, np.nan, 3600.0)
    return RepFeatures(user, pair, path, ages, ages)


def test_codecs_keep_missing_rows_zero_and_state_their_bytes() -> None:
    f = _features()
    for name, size, dims in (("float16", 32, 16), ("int8", 20, 16), ("pca4", 8, 4)):
        codec = fit_codec(name, f)
        assert codec.bytes_per_vector == size
        block = rep_block(f, codec)
        assert block.shape == (300, 2 * dims + 5 + 2)
        assert not block[:10, : 2 * dims].any()  # missing stays zero (the path one-hot says why)
        assert (block[:10, 2 * dims + FallbackPath.NONE] == 1).all()
    int8 = fit_codec("int8", f).apply(f.pair, "pair")
    assert np.abs(int8 - f.pair).max() <= np.abs(f.pair).max(axis=1).max() / 127 / 2 + 1e-6


def test_report_gains_intervals_and_ratio() -> None:
    rng = np.random.default_rng(1)
    n = 4000
    labels = (rng.random(n) < 0.2).astype(np.float64)
    signal = labels + rng.normal(size=n)
    run = VariantRun()
    for name, noise in (("alone", 3.0), ("distilled", 2.0), ("reps", 1.0)):
        run.holdout_probs[name] = [1 / (1 + np.exp(-(signal + rng.normal(scale=noise, size=n)))) for _ in range(2)]
        run.train_digest[name] = "same"
    report = build_report(run, labels, np.ones(n))
    v = report["variants"]
    assert v["reps"]["auc_gain"] > v["distilled"]["auc_gain"] > 0
    assert v["reps"]["auc_gain_p05"] <= v["reps"]["auc_gain"] <= v["reps"]["auc_gain_p95"]
    assert report["reps_instead_of_kd"] > 1
    assert report["reps_instead_of_kd_p05"] <= report["reps_instead_of_kd"]
    assert "beat" in report["verdict"]


def test_ratio_p05_counts_a_gainless_distillation_as_unbounded() -> None:
    assert _ratio_p05(np.array([0.02, 0.02, 0.02]), np.array([0.01, 0.0, -0.01])) == 2.0
    assert _ratio_p05(np.array([-0.01, 0.02]), np.array([-0.01, 0.01])) == -np.inf
