"""``--store URI`` -> backend. Parsing does no I/O, so a pipeline checks the flag at construction.

URI forms (query options after ``?``, joined with ``&``):

- ``lmdb:///abs/dir``, ``lmdb://rel/dir`` or a plain path ``out/store``: :class:`LmdbStore`;
  option ``map_size_gb``.
- ``redis://[[user]:password@]host:port/db`` (``rediss://`` for TLS): :class:`RedisStore`;
  options ``namespace`` (key prefix, default ``gem:rep:``), ``timeout`` (a duration).
- ``redis-cluster://[[user]:password@]host:port``: :class:`RedisClusterStore`, the other nodes
  discovered from that one; options ``namespace``, ``timeout``, ``layout`` (``user``: a hash
  tag per user, the default; ``pair``: a slot per key), ``failover_timeout`` (a duration).
- ``package.module:Class://anything`` (or ``package.module.Class://anything``): a third-party
  backend, imported by that dotted path (see :data:`BACKENDS`).
- every backend: ``max_age`` and ``expire_after`` (durations: ``90``, ``90s``, ``15m``,
  ``2h``, ``7d``), ``encoding`` (``float16`` or ``int8``).

A backend is a subclass of :class:`OnlineStore` that names its own URI options
(``uri_options``), turns a URI into its config (``config_from_uri``, no I/O) and is made as
``Backend(config, options, clock)``. Adding one to the project is its module plus one line in
:data:`BACKENDS`; a backend outside the project needs no line at all: its dotted path is the
scheme.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast
from urllib.parse import parse_qsl

from pipelines.errors import ConfigError
from pipelines.redact import register_uri
from pipelines.store.base import Clock, OnlineStore, StoreOptions
from pipelines.store.codec import ENCODINGS, Encoding
from pipelines.store.uri import FLAG, duration

__all__ = ["BACKENDS", "StoreSpec", "backend_class", "check_store", "open_store", "parse_store_uri"]

#: URI scheme -> ``"module:Class"`` of its backend (imported when a URI names it, so an install
#: without a backend's extra still opens the others).
BACKENDS: dict[str, str] = {
    "lmdb": "pipelines.store.lmdb_store:LmdbStore",
    "redis": "pipelines.store.redis_store:RedisStore",
    "rediss": "pipelines.store.redis_store:RedisStore",
    "redis-cluster": "pipelines.store.redis_cluster:RedisClusterStore",
}

_COMMON = ("max_age", "expire_after", "encoding")
_EXAMPLES = (
    "lmdb:///path/to/dir, a plain directory path, redis://127.0.0.1:16379/0, "
    "redis-cluster://127.0.0.1:17000 or package.module:StoreClass://..."
)
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z_][A-Za-z0-9_+.\-]*(?::[A-Za-z_][A-Za-z0-9_]*)?)://(?P<rest>.*)$", re.DOTALL)


@dataclass(frozen=True)
class StoreSpec:
    """A parsed store URI: the scheme (or dotted path) it named, its backend class, the backend's
    config and the shared options."""

    backend: str
    store_class: type[OnlineStore]
    config: object
    options: StoreOptions


def parse_store_uri(uri: str) -> StoreSpec:
    """Parse ``uri`` (see the module docstring); :class:`ConfigError` naming ``--store`` if bad."""
    if not uri or not uri.strip():
        raise ConfigError(FLAG, "the store URI is empty", f"give one of {_EXAMPLES}")
    register_uri(uri)  # its password is masked in every message from now on
    scheme, rest = _split(uri)
    register_uri(f"store://{rest}")  # the same, where the scheme is a dotted path urlsplit cannot read
    cls = backend_class(scheme, uri)
    location, _, query_text = rest.partition("?")
    query = dict(parse_qsl(query_text, keep_blank_values=True))
    allowed = _COMMON + tuple(cls.uri_options)
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise ConfigError(FLAG, f"unknown option(s) {unknown} in {uri!r}", f"use only {list(allowed)}")
    common = {name: query.pop(name) for name in _COMMON if name in query}
    try:
        config = cls.config_from_uri(uri, location, query)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r}: {exc}", f"see the URI forms of {cls.__name__}") from exc
    return StoreSpec(scheme, cls, config, _options(common, uri))


def backend_class(scheme: str, uri: str = "") -> type[OnlineStore]:
    """The backend a scheme names: a :data:`BACKENDS` entry, else a dotted path
    ``package.module:Class`` or ``package.module.Class``."""
    target = BACKENDS.get(scheme.lower())
    if target is None:
        if "." not in scheme and ":" not in scheme:
            raise ConfigError(FLAG, f"unknown store scheme {scheme!r} in {uri!r}", f"use {_EXAMPLES}")
        target = scheme
    module, _, name = target.partition(":") if ":" in target else target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            FLAG,
            f"cannot import the store backend {target!r} ({exc})",
            "give an importable package.module:Class (installed, or on PYTHONPATH)",
        ) from exc
    if not (isinstance(found, type) and issubclass(found, OnlineStore)):
        raise ConfigError(
            FLAG, f"{target!r} is not an OnlineStore subclass", "point the scheme at a subclass of OnlineStore"
        )
    return found


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
    make: Callable[..., OnlineStore] = spec.store_class  # Backend(config, options, clock)
    return make(spec.store_class.reader_config(spec.config) if reader else spec.config, options, clock)


def check_store(uri: str) -> dict[str, object]:
    """Open the store at ``uri``, prove it usable (:meth:`OnlineStore.check`: reached, authenticated,
    a supported version, room to write) and close it: the check a command runs before any work."""
    store = open_store(uri)
    try:
        return store.check()
    finally:
        store.close()


def _split(uri: str) -> tuple[str, str]:
    """(scheme, the rest after ``scheme://``); a plain path and ``lmdb:path`` are LMDB's."""
    match = _SCHEME.match(uri)
    if match:
        return match["scheme"], match["rest"]
    if uri[:5].lower() == "lmdb:":
        return "lmdb", uri[5:]
    return "lmdb", uri


def _options(options: dict[str, str], uri: str) -> StoreOptions:
    encoding = options.get("encoding", "float16")
    if encoding not in ENCODINGS:
        raise ConfigError(FLAG, f"encoding={encoding!r} in {uri!r}", f"use one of {list(ENCODINGS)}")
    max_age = duration(options["max_age"], "max_age", uri) if "max_age" in options else None
    expire = duration(options["expire_after"], "expire_after", uri) if "expire_after" in options else None
    try:
        return StoreOptions(max_age_s=max_age, expire_after_s=expire, encoding=cast(Encoding, encoding))
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r}: {exc}", "fix max_age / expire_after") from exc
