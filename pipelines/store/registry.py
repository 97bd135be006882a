"""``--store URI`` -> backend. Parsing does no I/O, so a pipeline checks the flag at construction.

URI forms (query options after ``?``, joined with ``&``):

- ``lmdb:///abs/dir``, ``lmdb://rel/dir`` or a plain path ``out/store``: :class:`LmdbStore`;
  option ``map_size_gb``.
- ``redis://[:password@]host:port/db`` (``rediss://`` for TLS): :class:`RedisStore`;
  options ``namespace`` (key prefix, default ``gem:rep:``), ``timeout`` (a duration).
- every backend: ``max_age`` and ``expire_after`` (durations: ``90``, ``90s``, ``15m``,
  ``2h``, ``7d``), ``encoding`` (``float16`` or ``int8``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pipelines.durations import parse_duration
from pipelines.errors import ConfigError
from pipelines.redact import register_uri
from pipelines.store.base import Clock, OnlineStore, StoreOptions
from pipelines.store.codec import ENCODINGS, Encoding
from pipelines.store.lmdb_store import LmdbConfig, LmdbStore
from pipelines.store.redis_store import RedisConfig, RedisStore

__all__ = ["BACKENDS", "StoreSpec", "check_store", "open_store", "parse_store_uri"]

FLAG = "--store"
_COMMON = ("max_age", "expire_after", "encoding")
_BACKEND_OPTIONS = {"lmdb": ("map_size_gb",), "redis": ("namespace", "timeout")}
_EXAMPLES = "lmdb:///path/to/dir, a plain directory path, or redis://127.0.0.1:16379/0"


@dataclass(frozen=True)
class StoreSpec:
    """A parsed store URI: which backend, its config, and the shared options."""

    backend: str
    config: LmdbConfig | RedisConfig
    options: StoreOptions


def parse_store_uri(uri: str) -> StoreSpec:
    """Parse ``uri`` (see the module docstring); :class:`ConfigError` naming ``--store`` if bad."""
    if not uri or not uri.strip():
        raise ConfigError(FLAG, "the store URI is empty", f"give one of {_EXAMPLES}")
    register_uri(uri)  # its password is masked in every message from now on
    scheme = uri.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri) else ""
    if scheme in ("redis", "rediss"):
        return _redis_spec(uri)
    if scheme == "lmdb":
        return _lmdb_spec(re.sub(r"^lmdb:(//)?", "", uri, flags=re.IGNORECASE), uri)
    if "://" in uri:
        raise ConfigError(FLAG, f"unknown store scheme {scheme!r} in {uri!r}", f"use {_EXAMPLES}")
    return _lmdb_spec(uri, uri)


def open_store(
    uri: str,
    *,
    clock: Clock | None = None,
    max_age_s: float | None = None,
    expire_after_s: float | None = None,
    encoding: Encoding | None = None,
    reader: bool = False,
) -> OnlineStore:
    """Open the store at ``uri``; keyword options given here override the URI's. A ``reader``
    never creates a store (a missing LMDB directory is an error, not a new empty store)."""
    spec = parse_store_uri(uri)
    base = spec.options
    try:
        options = replace(
            base,
            max_age_s=base.max_age_s if max_age_s is None else max_age_s,
            expire_after_s=base.expire_after_s if expire_after_s is None else expire_after_s,
            encoding=base.encoding if encoding is None else encoding,
        )
    except ValueError as exc:
        raise ConfigError(FLAG, str(exc), "give consistent store options") from exc
    config = replace(spec.config, create=False) if reader and isinstance(spec.config, LmdbConfig) else spec.config
    return BACKENDS[spec.backend](config, options, clock)


def _lmdb_spec(rest: str, uri: str) -> StoreSpec:
    path, _, query = rest.partition("?")
    if not path:
        raise ConfigError(FLAG, f"{uri!r} names no directory", "use lmdb:///path/to/dir or a plain path")
    options = _query(query, uri, "lmdb")
    try:
        config = LmdbConfig(path, float(options.pop("map_size_gb", LmdbConfig.map_size_gb)))
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r}: {exc}", "give map_size_gb as a positive number") from exc
    return StoreSpec("lmdb", config, _options(options, uri))


def _redis_spec(uri: str) -> StoreSpec:
    parts = urlsplit(uri)
    options = _query(parts.query, uri, "redis")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r} has a bad port", "use redis://host:port/db") from exc
    db = parts.path.lstrip("/")
    if not parts.hostname or (port is not None and port < 1) or (db and not db.isdigit()):
        raise ConfigError(FLAG, f"{uri!r} is not redis://host:port/db", "e.g. redis://127.0.0.1:16379/0")
    namespace = options.pop("namespace", RedisConfig.namespace)
    if not namespace:
        raise ConfigError(FLAG, f"{uri!r} has an empty namespace", "drop namespace= or give a prefix")
    timeout = _duration(options.pop("timeout", "5s"), "timeout", uri)
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return StoreSpec("redis", RedisConfig(url, namespace, timeout_s=timeout), _options(options, uri))


def _query(query: str, uri: str, backend: str) -> dict[str, str]:
    allowed = _COMMON + _BACKEND_OPTIONS[backend]
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(FLAG, f"unknown option(s) {unknown} in {uri!r}", f"use only {list(allowed)}")
    return options


def _options(options: dict[str, str], uri: str) -> StoreOptions:
    encoding = options.get("encoding", "float16")
    if encoding not in ENCODINGS:
        raise ConfigError(FLAG, f"encoding={encoding!r} in {uri!r}", f"use one of {list(ENCODINGS)}")
    max_age = _duration(options["max_age"], "max_age", uri) if "max_age" in options else None
    expire = _duration(options["expire_after"], "expire_after", uri) if "expire_after" in options else None
    try:
        return StoreOptions(max_age_s=max_age, expire_after_s=expire, encoding=cast(Encoding, encoding))
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r}: {exc}", "fix max_age / expire_after") from exc


def _duration(text: str, name: str, uri: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(FLAG, f"{name}={text!r} in {uri!r}", "give a duration like 90s, 15m, 2h, 7d") from exc
    if seconds <= 0:
        raise ConfigError(FLAG, f"{name}={text!r} in {uri!r} is not positive", "give a positive duration")
    return seconds


def _open_lmdb(config: LmdbConfig | RedisConfig, options: StoreOptions, clock: Clock | None) -> OnlineStore:
    assert isinstance(config, LmdbConfig)
    return LmdbStore(config, options, clock)


def _open_redis(config: LmdbConfig | RedisConfig, options: StoreOptions, clock: Clock | None) -> OnlineStore:
    assert isinstance(config, RedisConfig)
    return RedisStore(config, options, clock)


#: backend name -> factory(config, options, clock); a new backend registers itself here.
BACKENDS: dict[str, Callable[[LmdbConfig | RedisConfig, StoreOptions, Clock | None], OnlineStore]] = {
    "lmdb": _open_lmdb,
    "redis": _open_redis,
}


def check_store(uri: str) -> dict[str, object]:
    """Open the store at ``uri``, prove it usable (:meth:`OnlineStore.check`: reached, authenticated,
    a supported version, room to write) and close it: the check a command runs before any work."""
    store = open_store(uri)
    try:
        return store.check()
    finally:
        store.close()
