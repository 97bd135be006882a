"""The resolver: every path, the staleness bounds, unknown users, empty indexes, version and dim checks,
one index search and one store round trip per request; on the embedded store and on Redis."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.durations import HOUR_MS
from pipelines.similarity.build import BuildSpec, build_index
from pipelines.similarity.faiss_ops import faiss
from pipelines.similarity.policy import ResolverConfig
from pipelines.similarity.resolver import DimensionMismatchError, Resolver, VersionMismatchError
from pipelines.similarity.user_index import UserIndex
from pipelines.similarity.vectors import UserVectors
from pipelines.store import ManualClock, OnlineStore
from tests.conftest import MakeStore
from tests.similarity.data import T0_MS, T0_S, VERSION, rep_table

DIM = 8
CONFIG = ResolverConfig(max_age_s=3_600, fallback_max_age_s=86_400, k=3)


def _vectors() -> np.ndarray:
    """Users 0..9: two tight groups (0-4 and 5-9) on orthogonal axes."""
    rng = np.random.default_rng(0)
    x = np.zeros((10, DIM), np.float32)
    x[:5, 0], x[5:, 1] = 1.0, 1.0
    x += 0.05 * rng.normal(size=x.shape).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float16).astype(np.float32)


VECTORS = _vectors()


@pytest.fixture(scope="module")
def index() -> UserIndex:
    users = UserVectors(
        np.arange(10, dtype=np.int64), VECTORS, np.zeros(10, np.int64), np.full(10, VERSION, dtype=object)
    )
    return UserIndex.from_built(build_index(users, BuildSpec(factory="Flat")))


@pytest.fixture
def store(make_store: MakeStore) -> OnlineStore:
    """The shared store fixture (tests/conftest.py): LMDB, and a real Redis in the integration tier."""
    return make_store(clock=ManualClock(T0_S))


def emb(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float16).astype(np.float32)


def put(store: OnlineStore, user: int, ad: int | None, vector: np.ndarray, age_ms: int, version: str = VERSION) -> None:
    store.write_batch(rep_table([user], [ad], vector.reshape(1, -1), computed_at_ms=T0_MS - age_ms, version=version))


def resolver(store: OnlineStore, index: UserIndex, config: ResolverConfig = CONFIG) -> Resolver:
    return Resolver(store, index, config, clock=ManualClock(T0_S))


def test_exact_pair_when_fresh(store: OnlineStore, index: UserIndex) -> None:
    vector = emb(1)
    put(store, 0, 100, vector, age_ms=60_000)
    got = resolver(store, index).resolve(0, [100])
    assert got.path_names() == ["exact"] and got.age_s[0] == pytest.approx(60)
    np.testing.assert_allclose(got.embedding[0], vector[0], rtol=1e-3)
    assert got.p_click[0] == pytest.approx(0.1)


def test_same_user_pair_when_stale_within_the_bound(store: OnlineStore, index: UserIndex) -> None:
    put(store, 0, 101, emb(2), age_ms=2 * HOUR_MS)
    got = resolver(store, index).resolve(0, [101])
    assert got.path_names() == ["same_user_pair"] and got.age_s[0] == pytest.approx(7_200)


def test_same_user_level_representation(store: OnlineStore, index: UserIndex) -> None:
    user_vector = emb(3)
    put(store, 0, None, user_vector, age_ms=3 * HOUR_MS)
    got = resolver(store, index).resolve(0, [102])
    assert got.path_names() == ["same_user"] and got.age_s[0] == pytest.approx(10_800)
    np.testing.assert_allclose(got.embedding[0], user_vector[0], rtol=1e-3)


def test_similar_users_similarity_weighted(store: OnlineStore, index: UserIndex) -> None:
    near = index.neighbors(np.array([0]), 3)
    (n1, n2, _), (s1, s2, _) = near.user_ids[0].tolist(), near.similarity[0].tolist()
    a, b = emb(4), emb(5)
    put(store, n1, 103, a, age_ms=60_000)
    put(store, n2, 103, b, age_ms=120_000)
    put(store, 7, 103, emb(6), age_ms=60_000)  # in the other group: not among user 0's 3 nearest
    got = resolver(store, index).resolve(0, [103])
    expected = (s1 * a[0] + s2 * b[0]) / (s1 + s2)
    assert got.path_names() == ["similar_users"] and got.neighbors_used[0] == 2
    np.testing.assert_allclose(got.embedding[0], expected, rtol=1e-3, atol=1e-3)
    assert got.age_s[0] == pytest.approx(120)  # the oldest representation used
    assert 7 not in got.neighbor_ids.tolist()


def test_none_when_nothing_is_usable(store: OnlineStore, index: UserIndex) -> None:
    got = resolver(store, index).resolve(0, [999])
    assert got.path_names() == ["none"] and np.isnan(got.embedding).all() and np.isnan(got.age_s[0])
    assert got.answers()[0].embedding is None


def test_staleness_bounds_are_respected(store: OnlineStore, index: UserIndex) -> None:
    put(store, 0, 110, emb(7), age_ms=HOUR_MS + 1_000)  # just past max_age: not exact
    put(store, 0, 111, emb(8), age_ms=24 * HOUR_MS + 1_000)  # past the fallback bound: unusable
    nearest = int(index.neighbors(np.array([0]), 1).user_ids[0, 0])
    put(store, nearest, 111, emb(9), age_ms=24 * HOUR_MS + 1_000)  # a neighbour's, also too old
    put(store, 0, 112, emb(10), age_ms=HOUR_MS)  # exactly max_age: still exact
    got = resolver(store, index).resolve(0, [110, 111, 112])
    assert got.path_names() == ["same_user_pair", "none", "exact"]


def test_policy_order_and_switched_off_paths(store: OnlineStore, index: UserIndex) -> None:
    put(store, 0, None, emb(11), age_ms=HOUR_MS)
    put(store, int(index.neighbors(np.array([0]), 1).user_ids[0, 0]), 120, emb(12), age_ms=60_000)
    default = resolver(store, index).resolve(0, [120])
    pairs_only = resolver(store, index, ResolverConfig(max_age_s=3_600, k=3, paths=("same_user_pair", "similar_users")))
    assert default.path_names() == ["same_user"]  # user-level before neighbours, as the policy orders
    assert pairs_only.resolve(0, [120]).path_names() == ["similar_users"]


def test_unknown_user_gets_none(store: OnlineStore, index: UserIndex) -> None:
    put(store, 1, 130, emb(13), age_ms=60_000)
    got = resolver(store, index).resolve(12_345, [130, 131])
    assert got.path_names() == ["none", "none"] and len(got.neighbor_ids) == 0


def test_empty_index_still_serves_exact_and_same_user(store: OnlineStore) -> None:
    empty = UserIndex.from_built(build_index(UserVectors.empty(DIM), BuildSpec(), model_version=VERSION))
    put(store, 0, 140, emb(14), age_ms=60_000)
    put(store, 1, 141, emb(15), age_ms=60_000)
    got = resolver(store, empty).resolve(0, [140, 141])
    assert got.path_names() == ["exact", "none"]


def test_store_of_another_model_version_is_an_error(store: OnlineStore, index: UserIndex) -> None:
    put(store, 0, 150, emb(16), age_ms=60_000, version="gem-other")
    with pytest.raises(VersionMismatchError, match=r"model_version \['gem-other'\].*built from 'gem-test-v1'"):
        resolver(store, index).resolve(0, [150])


def test_request_for_another_model_version_is_an_error(store: OnlineStore, index: UserIndex) -> None:
    with pytest.raises(VersionMismatchError, match="asks for model_version 'v9'"):
        resolver(store, index).resolve(0, [1], model_version="v9")
    assert len(resolver(store, index).resolve(0, [1], model_version=VERSION)) == 1


def test_store_dimension_mismatch_names_expected_and_actual(store: OnlineStore, index: UserIndex) -> None:
    store.write_batch(rep_table([0], [160], np.ones((1, 4), np.float32), computed_at_ms=T0_MS))
    with pytest.raises(DimensionMismatchError, match="have 4 dims, the index expects 8"):
        resolver(store, index).resolve(0, [160])


def test_one_search_and_one_round_trip_per_request(
    store: OnlineStore, index: UserIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    ads = np.arange(1_000, 1_300)
    nearest = int(index.neighbors(np.array([0]), 1).user_ids[0, 0])
    store.write_batch(rep_table([nearest] * 150, ads[:150].tolist(), emb(17, 150), computed_at_ms=T0_MS))
    calls = {"get": 0, "search": 0}
    get, search = store._get, index.index.search

    def counted_get(keys: list[bytes]) -> list[bytes]:
        calls["get"] += 1
        return get(keys)

    def counted_search(*args: object) -> object:
        calls["search"] += 1
        return search(*args)

    monkeypatch.setattr(store, "_get", counted_get)
    monkeypatch.setattr(index.index, "search", counted_search)
    got = resolver(store, index).resolve(0, ads)
    assert calls == {"get": 1, "search": 1}
    assert got.counts()["similar_users"] == 150 and got.counts()["none"] == 150
    table = got.to_arrow()
    assert table.num_rows == 300 and table.column("embedding").null_count == 150


def test_auto_neighbour_reads_give_the_same_answers(
    store: OnlineStore, index: UserIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    ads = np.arange(2_000, 2_060)
    for user in range(10):  # a random mix of fresh, stale and missing pairs; user-level rows for even users
        keep = rng.random(len(ads)) < 0.3
        ages = rng.choice([60_000, 2 * HOUR_MS, 30 * HOUR_MS], size=int(keep.sum()))
        store.write_batch(
            rep_table(
                [user] * int(keep.sum()),
                ads[keep].tolist(),
                emb(user, int(keep.sum())),
                computed_at_ms=(T0_MS - ages).tolist(),
            )
        )
        if user % 2 == 0:
            put(store, user, None, emb(100 + user), age_ms=HOUR_MS)
    auto = ResolverConfig(max_age_s=3_600, fallback_max_age_s=86_400, k=3, neighbor_reads="auto")
    calls = {"get": 0}
    get = store._get

    def counted_get(keys: list[bytes]) -> list[bytes]:
        calls["get"] += 1
        return get(keys)

    monkeypatch.setattr(store, "_get", counted_get)
    for user in range(10):
        want = resolver(store, index).resolve(user, ads)
        calls["get"] = 0
        got = resolver(store, index, auto).resolve(user, ads)
        assert calls["get"] == (1 if user % 2 == 0 else 2)  # a second trip only without a user-level row
        assert got.path_names() == want.path_names()
        np.testing.assert_allclose(got.embedding, want.embedding, rtol=1e-5)
        np.testing.assert_array_equal(got.neighbors_used, want.neighbors_used)


def test_the_one_query_search_runs_on_one_omp_thread_and_restores_the_setting(
    store: OnlineStore, index: UserIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    search = index.index.search

    def watched(*args: object) -> object:
        seen.append(faiss.omp_get_max_threads())
        return search(*args)

    monkeypatch.setattr(index.index, "search", watched)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        resolver(store, index).resolve(0, [1, 2])
        assert seen == [1] and faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)
