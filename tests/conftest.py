"""Shared fixtures: one online-store fixture, parametrized over every backend (the embedded LMDB and a
real Redis), used by the store suite and the resolver tests."""

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
    RedisConfig,
    RedisStore,
    StoreOptions,
    StoreUnavailableError,
    default_redis_url,
)
from tests.store.reps import T0_S

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.browser"]

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


@pytest.fixture(params=["lmdb", pytest.param("redis", marks=pytest.mark.integration)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """``make_store(clock=..., **StoreOptions fields)``: a store of this backend; every call
    opens the same data (one LMDB directory / one Redis namespace) with its own options."""
    backend = request.param
    url = default_redis_url()
    namespace = f"gem-test:{uuid.uuid4().hex}:"
    if backend == "redis":
        require_redis(url)
    opened: list[OnlineStore] = []

    def make(*, clock: Clock | None = None, **options: Any) -> OnlineStore:
        opts = StoreOptions(**options)
        clock = clock or ManualClock(T0_S)
        store: OnlineStore
        if backend == "lmdb":
            store = LmdbStore(LmdbConfig(str(tmp_path / "store")), opts, clock)
        else:
            store = RedisStore(RedisConfig(url, namespace), opts, clock)
        opened.append(store)
        return store

    yield make
    if opened:
        opened[0].clear()
    for store in opened:
        store.close()
