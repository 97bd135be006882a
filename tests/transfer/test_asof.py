"""The as-of join never lets a representation computed at or after the impression reach an example."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.similarity.policy import FallbackPath, ResolverConfig, pick_paths
from pipelines.transfer.asof import NO_AD, asof_join, covered_pairs, plan_snapshots, resolve_paths, snapshot_tick
from pipelines.transfer.snapshots import Snapshots, asof_features

HOUR = 3_600_000


def _reference(ex_u, ex_a, ex_t, sn_u, sn_a, sn_t, lag):
    """Brute force: the newest snapshot of the key strictly before t - lag (the later row on ties)."""
    rows, ages = [], []
    for u, a, t in zip(ex_u, ex_a, ex_t, strict=True):
        best = -1
        for j in range(len(sn_u)):
            if sn_u[j] == u and sn_a[j] == a and sn_t[j] < t - lag and (best < 0 or sn_t[j] >= sn_t[best]):
                best = j
        rows.append(best)
        ages.append(t - sn_t[best] if best >= 0 else -1)
    return np.array(rows), np.array(ages)


small = st.integers(0, 3)
times = st.integers(0, 40)


@settings(max_examples=200, deadline=None)
@given(
    examples=st.lists(st.tuples(small, st.sampled_from([NO_AD, 7, 8]), times), min_size=0, max_size=25),
    snaps=st.lists(st.tuples(small, st.sampled_from([NO_AD, 7, 8]), times), min_size=0, max_size=25),
    lag=st.integers(0, 5),
)
def test_join_matches_brute_force_and_never_reads_the_future(examples, snaps, lag) -> None:
    ex_u, ex_a, ex_t = (np.array([e[i] for e in examples], np.int64) for i in range(3))
    sn_u, sn_a, sn_t = (np.array([s[i] for s in snaps], np.int64) for i in range(3))
    got = asof_join(ex_u, ex_a, ex_t, sn_u, sn_a, sn_t, lag_ms=lag)
    rows, ages = _reference(ex_u, ex_a, ex_t, sn_u, sn_a, sn_t, lag)
    np.testing.assert_array_equal(got.row, rows)
    np.testing.assert_array_equal(got.age_ms, ages)
    found = got.found
    # the guarantee itself, stated directly: computed strictly before the impression (minus the lag)
    assert np.all(sn_t[got.row[found]] < ex_t[found] - lag)
    assert np.all(got.age_ms[found] > lag)
    assert np.all((sn_u[got.row[found]] == ex_u[found]) & (sn_a[got.row[found]] == ex_a[found]))


@settings(max_examples=60, deadline=None)
@given(
    examples=st.lists(st.tuples(small, st.sampled_from([7, 8, 9]), st.integers(1, 60 * HOUR)), min_size=1, max_size=30),
    cadence_h=st.sampled_from([1, 6]),
    lag_h=st.sampled_from([0, 1, 24]),
)
def test_planned_snapshots_give_the_join_of_every_tick(examples, cadence_h, lag_h) -> None:
    """Computing only the planned entries answers exactly as computing every key at every tick."""
    u, a, t = (np.array([e[i] for e in examples], np.int64) for i in range(3))
    cadence, lag = cadence_h * HOUR, lag_h * HOUR
    minus = np.full(len(u), -1, np.int64)
    keys = plan_snapshots(u, a, t, minus, minus, minus, cadence_ms=cadence, lag_ms=lag)
    ticks = np.arange(-cadence * 30, 61 * HOUR, cadence)
    every_key = {(x, y) for x, y in zip(keys.user_id.tolist(), keys.ad_id.tolist(), strict=True)}
    full_u = np.array([k[0] for k in every_key for _ in ticks], np.int64)
    full_a = np.array([k[1] for k in every_key for _ in ticks], np.int64)
    full_t = np.tile(ticks, len(every_key))
    for ad in (a, np.full(len(u), NO_AD)):
        planned = asof_join(u, ad, t, keys.user_id, keys.ad_id, keys.tick_ms, lag_ms=lag)
        full = asof_join(u, ad, t, full_u, full_a, full_t, lag_ms=lag)
        assert planned.found.all()
        np.testing.assert_array_equal(keys.tick_ms[planned.row], full_t[full.row])
        np.testing.assert_array_equal(planned.age_ms, full.age_ms)
        assert np.all((planned.age_ms > lag) & (planned.age_ms <= lag + cadence))


def test_snapshot_tick_is_strictly_before() -> None:
    t = np.array([6 * HOUR, 6 * HOUR + 1, 12 * HOUR - 1])
    np.testing.assert_array_equal(snapshot_tick(t, 6 * HOUR), [0, 6 * HOUR, 6 * HOUR])
    np.testing.assert_array_equal(snapshot_tick(t, 6 * HOUR, HOUR), [0, 0, 6 * HOUR])


@settings(max_examples=200, deadline=None)
@given(
    pair_found=st.booleans(),
    pair_age=st.floats(0, 20 * 86400),
    user_found=st.booleans(),
    user_age=st.floats(0, 20 * 86400),
    paths=st.sampled_from([("same_user_pair", "same_user", "similar_users"), ("same_user",), ()]),
)
def test_resolution_is_the_serving_policy(pair_found, pair_age, user_found, user_age, paths) -> None:
    config = ResolverConfig(max_age_s=6 * 3600, fallback_max_age_s=7 * 86400, paths=paths)
    got = resolve_paths(
        config,
        pair_found=np.array([pair_found]),
        pair_age_s=np.array([pair_age]),
        user_found=np.array([user_found]),
        user_age_s=np.array([user_age]),
    )
    expected = pick_paths(
        config,
        pair_found=np.array([pair_found]),
        pair_age=np.array([pair_age]),
        user_found=user_found,
        user_age=user_age,
        neighbors_used=np.zeros(1, np.int64),
    )
    np.testing.assert_array_equal(got, expected)


def test_missing_representations_are_resolved() -> None:
    """Exact pair; an uncovered pair -> the user's representation; a user with none yet -> zeros."""
    snaps = Snapshots(
        user_id=np.array([1, 1, 2]),
        ad_id=np.array([NO_AD, 7, NO_AD]),
        computed_at_ms=np.array([0, 0, 10 * HOUR]),
        embedding=np.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], np.float32),
    )
    f = asof_features(
        np.array([1, 1, 2]),
        np.array([7, 8, 7]),
        np.array([HOUR, 2 * HOUR, 10 * HOUR]),  # user 2's snapshot is computed AT the impression: unusable
        snaps,
        ResolverConfig(max_age_s=6 * 3600, fallback_max_age_s=7 * 86400),
    )
    assert f.path.tolist() == [FallbackPath.EXACT, FallbackPath.SAME_USER, FallbackPath.NONE]
    np.testing.assert_array_equal(f.pair, [[0, 1], [1, 0], [0, 0]])
    np.testing.assert_array_equal(f.user, [[1, 0], [1, 0], [0, 0]])
    np.testing.assert_allclose(f.pair_age_s[:2], [3600, 7200])
    assert np.isnan(f.pair_age_s[2]) and np.isnan(f.user_age_s[2])


def test_coverage_is_stable_and_near_its_share() -> None:
    u = np.arange(20_000) % 500
    a = np.arange(20_000) // 500
    covered = covered_pairs(u, a, 0.8)
    assert abs(covered.mean() - 0.8) < 0.02
    np.testing.assert_array_equal(covered, covered_pairs(u, a, 0.8))
    assert covered_pairs(u, a, 1.0).all() and not covered_pairs(u, a, 0.0).any()
