"""What only one backend does: LMDB's shared environments and map size, Redis namespaces and PXAT."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis

from pipelines.store import (
    LmdbConfig,
    LmdbStore,
    RedisConfig,
    RedisStore,
    StoreFullError,
    StoreOptions,
    default_redis_url,
    record_nbytes,
)
from tests.conftest import require_redis
from tests.store.reps import grid, reps


def test_lmdb_stores_on_one_path_share_the_environment(tmp_path: Path) -> None:
    first = LmdbStore(LmdbConfig(str(tmp_path / "s")))
    second = LmdbStore(LmdbConfig(str(tmp_path / "s" / ".." / "s")))
    first.write_batch(reps([(1, 10)]))
    first.close()
    first.close()  # idempotent
    assert second.read_batch([(1, 10)]).found.tolist() == [True]
    assert second.count() == 1
    second.close()


def test_a_reader_never_creates_an_lmdb_store(tmp_path: Path) -> None:
    from pipelines.errors import InputNotFoundError
    from pipelines.store import open_store

    missing = tmp_path / "nope" / "store"
    with pytest.raises(InputNotFoundError, match=f"no LMDB store at {missing} .*Fix: "):
        open_store(f"lmdb://{missing}", reader=True)
    assert not (tmp_path / "nope").exists()
    with open_store(f"lmdb://{missing}") as store:  # a writer creates it
        store.write_batch(reps([(1, 10)]))
    with open_store(str(missing), reader=True) as store:
        assert store.read_batch([(1, 10)]).found.tolist() == [True]


def test_lmdb_full_map_names_the_setting(tmp_path: Path) -> None:
    with LmdbStore(LmdbConfig(str(tmp_path / "s"), map_size_gb=1 / 1024)) as store:  # 1 MiB
        with pytest.raises(StoreFullError, match="map_size_gb"):
            store.write_batch(reps(grid(100, 99)))


@pytest.mark.integration
def test_redis_namespaces_are_isolated_and_expiry_is_physical() -> None:
    url = default_redis_url()
    require_redis(url)
    now_ms = int(time.time() * 1000)
    a = RedisStore(RedisConfig(url, f"gem-test:{uuid.uuid4().hex}:"), StoreOptions(expire_after_s=60))
    b = RedisStore(RedisConfig(url, f"gem-test:{uuid.uuid4().hex}:"))
    raw = redis.Redis.from_url(url)
    try:
        a.write_batch(reps([(1, 10), (2, None)], computed_at_ms=[now_ms, now_ms - 120_000]))
        b.write_batch(reps([(1, 10)], computed_at_ms=now_ms))
        assert a.memory_per_record() > record_nbytes("float16", 64)
        ttl_ms = raw.pttl(a.config.namespace.encode() + b"r:" + (1).to_bytes(8, "big") + (10).to_bytes(8, "big"))
        assert 0 < int(ttl_ms) <= 60_000
        assert raw.exists(a.config.namespace.encode() + b"r:" + (2).to_bytes(8, "big")) == 0  # expired on arrival
        a.clear()
        assert a.read_batch([(1, 10)]).found.tolist() == [False]
        assert b.read_batch([(1, 10)]).found.tolist() == [True]
    finally:
        a.clear()
        b.clear()
        for client in (a, b, raw):
            client.close()
