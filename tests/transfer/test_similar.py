"""The similar-users step, point-in-time: neighbours come from the snapshot the example reads (its own
index, its own pairs), never from anything computed at or after the impression."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.similarity.policy import FallbackPath, ResolverConfig
from pipelines.similarity.vectors import UserVectors
from pipelines.transfer.asof import NO_AD, SnapshotKeys, snapshot_tick
from pipelines.transfer.similar import ExampleKeys, NeighbourSource
from pipelines.transfer.snapshots import AsOfSetting, Snapshots, asof_features, with_similar_users

HOUR = 3_600_000
DAY = 24 * HOUR
CADENCE = 6 * HOUR
POLICY = ResolverConfig(max_age_s=6 * 3600, fallback_max_age_s=8 * 86400, k=3)


def _keys(user: np.ndarray, ad: np.ndarray, t: np.ndarray) -> ExampleKeys:
    none = np.full(len(user), -1, np.int64)
    return ExampleKeys(np.asarray(user, np.int64), np.asarray(ad, np.int64), np.asarray(t, np.int64), none, none, none)


class Recording:
    """A snapshot store over :class:`Snapshots` rows (pure logic under test; the model is not): the pool
    of tick T is its user-level rows computed at T; a pair of T is ``[T in cadences, neighbour id, 1]``;
    every read is recorded."""

    def __init__(self, snaps: Snapshots) -> None:
        self.snaps = snaps
        self.pools: dict[int, np.ndarray] = {}
        self.asked: list[SnapshotKeys] = []

    def pool(self, tick: int) -> UserVectors:
        rows = np.flatnonzero((self.snaps.ad_id == NO_AD) & (self.snaps.computed_at_ms == tick))
        _, first = np.unique(self.snaps.user_id[rows], return_index=True)
        rows = rows[first]
        self.pools[tick] = self.snaps.user_id[rows]
        return UserVectors(
            self.snaps.user_id[rows],
            self.snaps.embedding[rows],
            self.snaps.computed_at_ms[rows],
            np.full(len(rows), "v", dtype=object),
        )

    def pairs(self, keys: SnapshotKeys) -> np.ndarray:
        self.asked.append(keys)
        return np.stack([keys.tick_ms / CADENCE, keys.user_id, np.ones(len(keys))], axis=1).astype(np.float32)

    def source(self) -> NeighbourSource:
        return NeighbourSource(self.pool, self.pairs, lambda u, a: np.ones(u.shape, bool), gpu="off")


def test_a_user_missing_from_the_snapshot_gets_its_neighbours_pairs() -> None:
    tick = 10 * DAY
    snaps = Snapshots(  # user 1: only a 10-day-old user-level row (too old for the same-user step)
        user_id=np.array([1, 2, 3, 4]),
        ad_id=np.full(4, NO_AD),
        computed_at_ms=np.array([0, tick, tick, tick]),
        embedding=np.array([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.6, 0.8, 0.0], [-1.0, 0.0, 0.0]], np.float32),
    )
    user, ad, t = np.array([1, 5]), np.array([7, 7]), np.array([tick + HOUR, tick + HOUR])
    setting = AsOfSetting("main", 6 * HOUR, 0, 1.0, POLICY)
    base = asof_features(user, ad, t, snaps, POLICY)
    assert base.path.tolist() == [FallbackPath.NONE, FallbackPath.NONE]
    store = Recording(snaps)
    got = with_similar_users(_keys(user, ad, t), base, setting, store.source())
    # user 1 searches with its old vector among tick's users 2, 3, 4; user 4 (similarity -1) never counts
    assert got.path.tolist() == [FallbackPath.SIMILAR_USERS, FallbackPath.NONE]  # user 5 has no vector at all
    s2, s3 = 0.8, 0.6
    want = (s2 * np.array([40, 2, 1]) + s3 * np.array([40, 3, 1])) / (s2 + s3)  # tick = 40 cadences
    np.testing.assert_allclose(got.pair[0], want, rtol=1e-6)
    np.testing.assert_array_equal(got.pair[1], 0)
    assert got.pair_age_s[0] == 3600 and np.isnan(got.pair_age_s[1])
    assert list(store.pools) == [tick]
    assert sorted(np.concatenate([k.user_id for k in store.asked]).tolist()) == [2, 3, 4]


def test_neighbours_need_the_policy_and_enough_of_them() -> None:
    tick = 2 * DAY
    snaps = Snapshots(
        user_id=np.array([1, 1, 2]),
        ad_id=np.array([NO_AD, NO_AD, NO_AD]),
        computed_at_ms=np.array([tick, tick, tick]),
        embedding=np.array([[1.0, 0.0, 0.0]] * 3, np.float32),
    )
    user, ad, t = np.array([1]), np.array([7]), np.array([tick + HOUR])
    setting = AsOfSetting("similar", 6 * HOUR, 0, 1.0, replace(POLICY, paths=("same_user_pair", "similar_users")))
    base = asof_features(user, ad, t, snaps, setting.policy)
    assert base.path.tolist() == [FallbackPath.NONE]  # the same-user step is off
    got = with_similar_users(_keys(user, ad, t), base, setting, Recording(snaps).source())
    assert got.path.tolist() == [FallbackPath.SIMILAR_USERS]
    two = replace(setting, policy=replace(setting.policy, min_neighbors=2))
    assert with_similar_users(_keys(user, ad, t), base, two, Recording(snaps).source()).path.tolist() == [
        FallbackPath.NONE
    ]
    off = replace(setting, policy=replace(setting.policy, paths=("same_user_pair",)))
    assert with_similar_users(_keys(user, ad, t), base, off, Recording(snaps).source()).path.tolist() == [
        FallbackPath.NONE
    ]


USERS, TICKS = 6, 9
grid = [(user, tick) for user in range(USERS) for tick in range(TICKS)]  # user-level rows: who is in each snapshot


@settings(max_examples=80, deadline=None)
@given(
    examples=st.lists(
        st.tuples(st.integers(0, USERS - 1), st.sampled_from([7, 8]), st.integers(1, TICKS * 6 * HOUR)),
        min_size=1,
        max_size=20,
    ),
    present=st.lists(st.booleans(), min_size=len(grid), max_size=len(grid)),
    vectors=st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=len(grid), max_size=len(grid)),
    pairs=st.lists(st.tuples(st.integers(0, USERS - 1), st.integers(0, TICKS - 1)), max_size=10),
    lag_h=st.sampled_from([0, 1, 7]),
    same_user=st.booleans(),
)
def test_nothing_computed_after_the_impression_reaches_an_example_through_neighbours(
    examples, present, vectors, pairs, lag_h, same_user
) -> None:
    """Every snapshot row's first component is its computed_at (in cadences); whatever path an example takes, what it
    reads was computed strictly before the impression (minus the lag), and the neighbours it blends
    come from the one snapshot it reads, whose index holds that snapshot's users only."""
    cadence, lag = CADENCE, lag_h * HOUR
    u, a, t = (np.array([e[i] for e in examples], np.int64) for i in range(3))
    rows = [(user, NO_AD, tick, *vec) for (user, tick), on, vec in zip(grid, present, vectors, strict=True) if on]
    rows += [(user, 7, tick, 0.5, 0.5) for user, tick in pairs]
    table = Snapshots(
        user_id=np.array([r[0] for r in rows], np.int64),
        ad_id=np.array([r[1] for r in rows], np.int64),
        computed_at_ms=np.array([r[2] * cadence for r in rows], np.int64),
        embedding=np.array([[r[2], r[3], r[4]] for r in rows], np.float32).reshape(-1, 3),
    )
    paths = ("same_user_pair", "same_user", "similar_users") if same_user else ("same_user_pair", "similar_users")
    policy = replace(POLICY, fallback_max_age_s=30 * 3600.0, paths=paths)
    setting = AsOfSetting("s", cadence, lag, 1.0, policy)
    store = Recording(table)
    got = with_similar_users(_keys(u, a, t), asof_features(u, a, t, table, policy, lag_ms=lag), setting, store.source())

    def computed(x: np.ndarray) -> np.ndarray:  # a blend of one snapshot's rows: its time, up to float32 rounding
        return np.round(x).astype(np.int64) * cadence

    read = got.path != FallbackPath.NONE
    assert np.all(computed(got.pair[read, 0]) < t[read] - lag)
    assert np.all(got.pair_age_s[read] > lag / 1000)
    has_user = np.isfinite(got.user_age_s)
    assert np.all(computed(got.user[has_user, 0]) < t[has_user] - lag)
    tick = snapshot_tick(t, cadence, lag)
    similar = got.path == FallbackPath.SIMILAR_USERS
    np.testing.assert_array_equal(computed(got.pair[similar, 0]), tick[similar])  # from that snapshot only
    for keys in store.asked:  # each neighbour pair read was a user of that tick's index
        for neighbour, tk in zip(keys.user_id.tolist(), keys.tick_ms.tolist(), strict=True):
            assert neighbour in store.pools[tk].tolist()
    assert all(tk in set(tick.tolist()) for tk in store.pools)
