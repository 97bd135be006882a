"""The fallback policy and the neighbour blend, as pure functions (hypothesis over random inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import ConfigError
from pipelines.similarity.metrics import cosine_rows, gain_kept, gain_table, same_segment_share
from pipelines.similarity.policy import FallbackPath, ResolverConfig, blend_neighbors, pick_paths

CONFIG = ResolverConfig(max_age_s=10.0, fallback_max_age_s=100.0, k=4, min_neighbors=2)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), ads=st.integers(1, 30))
def test_each_ad_takes_the_first_usable_path(seed: int, ads: int) -> None:
    rng = np.random.default_rng(seed)
    found = rng.random(ads) < 0.5
    age = rng.uniform(0, 200, ads)
    user_found, user_age = bool(rng.random() < 0.5), float(rng.uniform(0, 200))
    used = rng.integers(0, 5, ads)
    path = pick_paths(
        CONFIG, pair_found=found, pair_age=age, user_found=user_found, user_age=user_age, neighbors_used=used
    )
    for j in range(ads):
        if found[j] and age[j] <= 10:
            want = FallbackPath.EXACT
        elif found[j] and age[j] <= 100:
            want = FallbackPath.SAME_USER_PAIR
        elif user_found and user_age <= 100:
            want = FallbackPath.SAME_USER
        elif used[j] >= 2:
            want = FallbackPath.SIMILAR_USERS
        else:
            want = FallbackPath.NONE
        assert path[j] == want


def test_switched_off_paths_are_skipped() -> None:
    config = ResolverConfig(max_age_s=10.0, k=4, paths=("similar_users",))
    path = pick_paths(
        config,
        pair_found=np.array([True, True]),
        pair_age=np.array([5.0, 50.0]),
        user_found=True,
        user_age=1.0,
        neighbors_used=np.array([0, 1]),
    )
    assert path.tolist() == [FallbackPath.EXACT, FallbackPath.SIMILAR_USERS]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_blend_is_the_similarity_weighted_mean_of_usable_neighbours(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k, a, d = 5, 7, 3
    emb = rng.normal(size=(k, a, d)).astype(np.float32)
    usable = rng.random((k, a)) < 0.6
    sim = rng.uniform(-0.5, 1.0, k).astype(np.float32)
    age = rng.uniform(0, 50, (k, a))
    blend = blend_neighbors(emb, usable, sim, age, np.full((k, a), 0.2, np.float32))
    for j in range(a):
        w = np.where(usable[:, j] & (sim > 0), sim, 0.0)
        assert blend.used[j] == int((w > 0).sum())
        if w.sum() == 0:
            assert np.isnan(blend.embedding[j]).all() and np.isnan(blend.age_s[j])
            continue
        np.testing.assert_allclose(blend.embedding[j], (w[:, None] * emb[:, j]).sum(0) / w.sum(), rtol=1e-4, atol=1e-5)
        assert blend.age_s[j] == pytest.approx(age[w > 0, j].max())
        assert blend.p_click[j] == pytest.approx(0.2)


def test_blend_without_neighbours() -> None:
    blend = blend_neighbors(
        np.zeros((0, 3, 4), np.float32),
        np.zeros((0, 3), bool),
        np.zeros(0, np.float32),
        np.zeros((0, 3)),
        np.zeros((0, 3), np.float32),
    )
    assert blend.used.tolist() == [0, 0, 0] and np.isnan(blend.embedding).all()


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"max_age_s": 0}, "--max-age"),
        ({"max_age_s": 100, "fallback_max_age_s": 10}, "--fallback-max-age"),
        ({"k": 0}, "--k"),
        ({"k": 2, "min_neighbors": 3}, "--k"),
        ({"paths": ("exact_match",)}, "--paths"),
    ],
)
def test_bad_resolver_config_names_the_flag(kwargs: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        ResolverConfig(**kwargs)


def test_metrics() -> None:
    assert cosine_rows(
        np.array([[1.0, 0.0], [1.0, 1.0]]), np.array([[2.0, 0.0], [-1.0, -1.0]])
    ).tolist() == pytest.approx([1.0, -1.0])
    assert np.isnan(cosine_rows(np.zeros((1, 2)), np.ones((1, 2)))[0])
    assert gain_kept(0.7, 0.8, 0.6) == pytest.approx(0.5)
    assert np.isnan(gain_kept(0.7, 0.6, 0.6))
    assert same_segment_share(np.array([[1, 1, 2], [3, -1, -1]]), np.array([1, 3])) == pytest.approx(3 / 4)
    labels = np.array([0, 0, 1, 1, 0, 1], float)
    exact = np.array([0.1, 0.2, 0.8, 0.9, 0.3, 0.7])
    table = gain_table(labels, exact, exact, np.zeros(6), bootstrap=20)
    assert table["auc_exact"] == 1.0 and table["auc_none"] == 0.5 and table["gain_kept"] == 1.0
    assert table["count"] == 6 and table["positives"] == 3
