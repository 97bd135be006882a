"""The store registry: a backend by scheme, a third-party backend by dotted path, the cluster's URI
(bad URIs of every form: test_store_uri.py)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from pipelines.errors import ConfigError
from pipelines.store import (
    BACKENDS,
    OnlineStore,
    RedisClusterConfig,
    RedisClusterStore,
    backend_class,
    open_store,
    parse_store_uri,
)
from tests.store.reps import grid, reps

_SHELVES: dict[str, dict[bytes, bytes]] = {}


class ShelfStore(OnlineStore):
    """A third-party backend as a plugin author would write it: records in a process-wide dict named
    by the URI (``tests.store.test_store_registry:ShelfStore://NAME?label=...``)."""

    uri_options: ClassVar[tuple[str, ...]] = ("label",)

    @classmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> tuple[str, str]:
        if not location:
            raise ConfigError("--store", f"{uri!r} names no shelf", "give ShelfStore://NAME")
        return location, options.get("label", "")

    def __init__(self, config: tuple[str, str], options: Any = None, clock: Any = None) -> None:
        super().__init__(options, clock)
        self.name, self.label = config
        self._data = _SHELVES.setdefault(self.name, {})
        self._names: dict[int, str] = {}

    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        self._names.update(versions)
        self._data.update(zip(keys, values, strict=True))
        return len(keys)

    def _get(self, keys: list[bytes]) -> list[bytes]:
        return [self._data.get(key, b"") for key in keys]

    def _delete(self, keys: list[bytes]) -> int:
        return sum(self._data.pop(key, None) is not None for key in keys)

    def _versions(self, ids: list[int]) -> dict[int, str]:
        return {i: self._names[i] for i in ids if i in self._names}

    def clear(self) -> None:
        self._data.clear()

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "scheme", ["tests.store.test_store_registry:ShelfStore", "tests.store.test_store_registry.ShelfStore"]
)
def test_a_third_party_backend_plugs_in_by_dotted_path(scheme: str) -> None:
    spec = parse_store_uri(f"{scheme}://shelf-{len(scheme)}?label=a&max_age=2h&encoding=int8")
    assert spec.store_class is ShelfStore and spec.config == (f"shelf-{len(scheme)}", "a")
    assert (spec.options.max_age_s, spec.options.encoding) == (7200, "int8")
    keys = grid(3, 2)
    with open_store(f"{scheme}://shelf-{len(scheme)}") as store:
        assert isinstance(store, ShelfStore)
        assert store.write_batch(reps(keys)).written == len(keys)
    with open_store(f"{scheme}://shelf-{len(scheme)}") as store:  # a second opening sees the records
        got = store.read_for_request(1, [1000, 1001, 7])
        assert got.pairs.found.tolist() == [True, True, False] and got.user.found.tolist() == [True]


def test_every_registered_backend_imports_and_parses_without_io() -> None:
    for scheme in BACKENDS:
        assert issubclass(backend_class(scheme), OnlineStore)
    spec = parse_store_uri("redis-cluster://u:s3cret@10.0.0.7:7000?namespace=exp:&layout=pair&failover_timeout=5s")
    assert spec.store_class is RedisClusterStore and isinstance(spec.config, RedisClusterConfig)
    assert (spec.config.url, spec.config.namespace, spec.config.layout, spec.config.failover_timeout_s) == (
        "redis://u:s3cret@10.0.0.7:7000/0",
        "exp:",
        "pair",
        5.0,
    )
    assert parse_store_uri("redis-cluster://127.0.0.1:17000").config.layout == "user"  # type: ignore[attr-defined]
    several = parse_store_uri("redis-cluster://:pw@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002").config
    assert (several.url, several.seeds) == ("redis://:pw@10.0.0.1:7000/0", ("10.0.0.2:7001", "[::1]:7002"))  # type: ignore[attr-defined]
