"""``--store URI`` parsing: every backend and option, and a ConfigError naming the flag otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.durations import parse_duration
from pipelines.errors import ConfigError
from pipelines.store import (
    LmdbConfig,
    LmdbStore,
    RedisConfig,
    RedisStore,
    StoreUnavailableError,
    open_store,
    parse_store_uri,
)


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("lmdb:///abs/reps", "/abs/reps"),
        ("lmdb://out/reps", "out/reps"),
        ("out/reps", "out/reps"),
        ("/abs/reps", "/abs/reps"),
        ("LMDB:out/reps?map_size_gb=2", "out/reps"),
    ],
)
def test_lmdb_uris(uri: str, path: str) -> None:
    spec = parse_store_uri(uri)
    assert spec.backend == "lmdb" and isinstance(spec.config, LmdbConfig) and spec.config.path == path


def test_options_in_the_uri() -> None:
    spec = parse_store_uri("lmdb:///r?max_age=2h&expire_after=7d&encoding=int8&map_size_gb=0.5")
    assert (spec.options.max_age_s, spec.options.expire_after_s, spec.options.encoding) == (7200, 604800, "int8")
    assert isinstance(spec.config, LmdbConfig) and spec.config.map_size_gb == 0.5
    redis = parse_store_uri("redis://:pw@10.1.2.3:6380/2?namespace=exp7:&timeout=250ms&max_age=90")
    assert isinstance(redis.config, RedisConfig)
    assert (redis.config.url, redis.config.namespace, redis.config.timeout_s) == (
        "redis://:pw@10.1.2.3:6380/2",
        "exp7:",
        0.25,
    )
    assert redis.options.max_age_s == 90


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200), ("7d", 604800), ("250ms", 0.25)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("", "empty"),
        ("mysql://db/reps", "unknown store scheme"),
        ("lmdb://", "names no directory"),
        ("redis://127.0.0.1:notaport/0", "bad port"),
        ("redis://127.0.0.1:6379/zero", "not redis://host:port/db"),
        ("redis:///0", "not redis://host:port/db"),
        ("redis://127.0.0.1:6379/0?namespace=", "empty namespace"),
        ("redis://127.0.0.1:6379/0?map_size_gb=3", "unknown option"),
        ("lmdb:///r?ttl=5", "unknown option"),
        ("lmdb:///r?max_age=soon", "max_age='soon'"),
        ("lmdb:///r?max_age=0", "not positive"),
        ("lmdb:///r?encoding=bf16", "encoding='bf16'"),
        ("lmdb:///r?map_size_gb=-1", "map_size_gb"),
        ("lmdb:///r?max_age=2h&expire_after=1h", "below max_age"),
        ("redis-cluster://127.0.0.1:17000/3", "only db 0"),
        ("redis-cluster://127.0.0.1:17000?layout=slot", "layout='slot'"),
        ("redis-cluster://127.0.0.1:17000?namespace=a{b}:", "brace"),
        ("redis-cluster://127.0.0.1:17000?failover_timeout=never", "failover_timeout='never'"),
        ("redis-cluster:///", "not redis-cluster://host:port"),
        ("redis-cluster://127.0.0.1:17000,127.0.0.1:x", "bad port"),
        ("redis-cluster://127.0.0.1:17000?map_size_gb=1", "unknown option"),
        ("no_such_pkg.mod:Store://x", "cannot import the store backend"),
        ("pipelines.store.codec:Nope://x", "cannot import the store backend"),
        ("builtins.dict://x", "not an OnlineStore subclass"),
        ("tests.store.test_store_registry:ShelfStore://", "names no shelf"),
        ("tests.store.test_store_registry:ShelfStore://x?map_size_gb=1", "unknown option"),
    ],
)
def test_bad_uris_name_the_flag(uri: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        parse_store_uri(uri)
    assert caught.value.flag == "--store" and "Fix:" in str(caught.value)


def test_open_store_keyword_options_override_the_uri(tmp_path: Path) -> None:
    with open_store(f"lmdb://{tmp_path}/reps?max_age=1h", max_age_s=60, encoding="int8") as store:
        assert isinstance(store, LmdbStore)
        assert (store.options.max_age_s, store.options.encoding) == (60, "int8")
    with pytest.raises(ConfigError, match="below max_age"):
        open_store(f"lmdb://{tmp_path}/reps?max_age=1h", expire_after_s=60)


def test_an_unreachable_redis_says_how_to_start_it() -> None:
    store = open_store("redis://127.0.0.1:1/0?timeout=1s")
    assert isinstance(store, RedisStore)
    with pytest.raises(StoreUnavailableError, match="make redis-up"):
        store.read_batch([(1, None)])
    store.close()
