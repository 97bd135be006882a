"""Shared fixtures: one online-store fixture, parametrized over every backend (the embedded LMDB, a
real Redis and a real Redis Cluster, in both key layouts), used by the store suite and the resolver
tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.store import (
    Clock,
    LmdbConfig,
    LmdbStore,
    ManualClock,
    OnlineStore,
    RedisClusterStore,
    RedisConfig,
    RedisStore,
    StoreOptions,
    StoreUnavailableError,
    default_redis_cluster_url,
    default_redis_url,
    parse_store_uri,
)
from tests.store.reps import T0_S

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.browser", "tests.fixtures.redis_cluster", "tests.fixtures.s3"]

MakeStore = Callable[..., OnlineStore]


def require_redis(url: str) -> None:
    """Fail (never skip) when the project's Redis is not up."""
    probe = RedisStore(RedisConfig(url))
    try:
        probe.ping()
    except StoreUnavailableError as exc:
        pytest.fail(f"Redis is not reachable at {url}: run `make redis-up` (or set GEM_REDIS_URL). {exc}")
    finally:
        probe.close()


def require_redis_cluster(uri: str) -> None:
    """Fail (never skip) when the project's Redis Cluster is not up and ok."""
    try:
        probe = RedisClusterStore(parse_store_uri(uri).config)  # type: ignore[arg-type]
        try:
            probe.check()
        finally:
            probe.close()
    except StoreUnavailableError as exc:
        pytest.fail(f"Redis Cluster is not ok at {uri}: run `make redis-cluster-up`. {exc}")


_CLUSTER = pytest.mark.integration


@pytest.fixture(
    params=[
        "lmdb",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("redis-cluster", marks=_CLUSTER),
        pytest.param("redis-cluster-pair", marks=_CLUSTER),
    ]
)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """``make_store(clock=..., **StoreOptions fields)``: a store of this backend; every call
    opens the same data (one LMDB directory / one Redis or Redis Cluster namespace) with its own
    options. ``redis-cluster`` keys carry a hash tag per user, ``redis-cluster-pair`` a slot per key."""
    backend = request.param
    url = default_redis_url()
    namespace = f"gem-test:{uuid.uuid4().hex}:"
    cluster_uri = f"{default_redis_cluster_url()}?namespace={namespace}&layout="
    cluster_uri += "pair" if backend == "redis-cluster-pair" else "user"
    if backend == "redis":
        require_redis(url)
    elif backend.startswith("redis-cluster"):
        require_redis_cluster(cluster_uri)
    opened: list[OnlineStore] = []

    def make(*, clock: Clock | None = None, **options: Any) -> OnlineStore:
        opts = StoreOptions(**options)
        clock = clock or ManualClock(T0_S)
        store: OnlineStore
        if backend == "lmdb":
            store = LmdbStore(LmdbConfig(str(tmp_path / "store")), opts, clock)
        elif backend == "redis":
            store = RedisStore(RedisConfig(url, namespace), opts, clock)
        else:
            store = RedisClusterStore(parse_store_uri(cluster_uri).config, opts, clock)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield make
    if opened:
        opened[0].clear()
    for store in opened:
        store.close()
