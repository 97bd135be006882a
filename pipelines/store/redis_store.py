"""The Redis backend (``redis://host:port/db``): the store a fleet of ranking servers shares.

Keys: ``<namespace>r:<codec key>`` (binary), values the codec's records; model versions
in the hash ``<namespace>v``. Reads are MGETs sent in one pipeline (one round trip);
writes go through a Lua script that keeps the newer record per key (compares the
``computed_at_ms`` at byte 24 of the stored and the new value) and, with
``expire_after_s``, sets ``PXAT computed_at + expire_after`` so Redis drops expired
records by its own clock.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast
from urllib.parse import quote, urlsplit, urlunsplit

from pipelines.errors import ConfigError
from pipelines.optional import require_on_use
from pipelines.redact import redact
from pipelines.secrets import REDIS_PASSWORD
from pipelines.store.base import Clock, OnlineStore, StoreFullError, StoreOptions, StoreUnavailableError
from pipelines.store.codec import COMPUTED_AT_OFFSET
from pipelines.store.uri import FLAG, duration

if TYPE_CHECKING:
    import redis
else:  # imported with every store (lmdb too): a missing redis extra fails when a RedisStore is made
    redis = require_on_use("redis", "redis", "The Redis store (redis:// URIs)")

__all__ = ["DEFAULT_REDIS_URL", "RedisConfig", "RedisStore", "default_redis_url"]

#: Where ``make redis-up`` (scripts/redis.sh) starts the project's server.
DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"

_PUT = f"""
local expire_ms = tonumber(ARGV[1])
local written = 0
for i, key in ipairs(KEYS) do
  local new = ARGV[i + 1]
  local at = struct.unpack('<i8', new, {COMPUTED_AT_OFFSET + 1})
  local old = redis.call('GET', key)
  if (not old) or struct.unpack('<i8', old, {COMPUTED_AT_OFFSET + 1}) <= at then
    if expire_ms > 0 then
      redis.call('SET', key, new, 'PXAT', at + expire_ms)
    else
      redis.call('SET', key, new)
    end
    written = written + 1
  end
end
return written
"""


def default_redis_url() -> str:
    """``$GEM_REDIS_URL``, else :data:`DEFAULT_REDIS_URL`."""
    return os.environ.get("GEM_REDIS_URL") or DEFAULT_REDIS_URL


@dataclass(frozen=True)
class RedisConfig:
    """``url``: redis-py URL. ``namespace``: key prefix, so several stores share a database.
    ``chunk``: keys per MGET / script call. ``timeout_s``: socket timeout."""

    url: str = DEFAULT_REDIS_URL
    namespace: str = "gem:rep:"
    chunk: int = 1000
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.chunk < 1 or not self.timeout_s > 0:
            raise ValueError(f"chunk ({self.chunk}) and timeout_s ({self.timeout_s}) must be positive")


class RedisStore(OnlineStore):
    """Representations in a Redis database, under one key namespace."""

    uri_options: ClassVar[tuple[str, ...]] = ("namespace", "timeout")
    #: How to start the project's server, in messages about an unreachable one.
    START_HINT: ClassVar[str] = "`make redis-up` or point --store / GEM_REDIS_URL at a running one"

    @classmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> RedisConfig:
        """``redis://[[user]:password@]host:port/db`` (``rediss://``: TLS); options ``namespace``, ``timeout``."""
        parts, kwargs = redis_uri_parts(uri, location, options, "redis://host:port/db", "redis://127.0.0.1:16379/0")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise ConfigError(FLAG, f"{uri!r} is not redis://host:port/db", "e.g. redis://127.0.0.1:16379/0")
        scheme = "rediss" if uri[:7].lower() == "rediss:" else "redis"
        return RedisConfig(urlunsplit((scheme, parts.netloc, parts.path, "", "")), **kwargs)

    def __init__(self, config: RedisConfig, options: StoreOptions | None = None, clock: Clock | None = None):
        super().__init__(options, clock)
        self.config = config
        self._client = redis.Redis.from_url(
            config.url, socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s
        )
        self._prefix = config.namespace.encode() + b"r:"
        self._versions_key = config.namespace.encode() + b"v"
        self._script = self._client.register_script(_PUT)

    def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` unless the server answers."""
        with self._errors():
            self._client.ping()

    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        expire_ms = int(self.options.expire_after_s * 1000) if self.options.expire_after_s else 0
        full = [self._prefix + key for key in keys]
        step = self.config.chunk
        with self._errors():
            pipe = self._client.pipeline(transaction=False)
            if versions:
                pipe.hset(self._versions_key, mapping={str(k): v for k, v in versions.items()})
            for i in range(0, len(full), step):
                self._script(keys=full[i : i + step], args=[expire_ms, *values[i : i + step]], client=pipe)
            replies = pipe.execute()
        return sum(int(r) for r in replies[1 if versions else 0 :])

    def _get(self, keys: list[bytes]) -> list[bytes]:
        full = [self._prefix + key for key in keys]
        step = self.config.chunk
        with self._errors():
            if len(full) <= step:
                replies = [cast(list[bytes | None], self._client.mget(full)) if full else []]
            else:
                pipe = self._client.pipeline(transaction=False)
                for i in range(0, len(full), step):
                    pipe.mget(full[i : i + step])
                replies = cast(list[list[bytes | None]], pipe.execute())
        return [value or b"" for reply in replies for value in reply]

    def _delete(self, keys: list[bytes]) -> int:
        full = [self._prefix + key for key in keys]
        with self._errors():
            pipe = self._client.pipeline(transaction=False)
            for i in range(0, len(full), self.config.chunk):
                pipe.delete(*full[i : i + self.config.chunk])
            return sum(int(n) for n in pipe.execute())

    def _versions(self, ids: list[int]) -> dict[int, str]:
        with self._errors():
            names = cast(list[bytes | None], self._client.hmget(self._versions_key, [str(vid) for vid in ids]))
        return {vid: name.decode() for vid, name in zip(ids, names, strict=True) if name is not None}

    def clear(self) -> None:
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", self.config.namespace.encode()) + b"*"
        with self._errors():
            batch: list[bytes] = []
            for key in self._client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)
        self._version_names.clear()

    def memory_per_record(self, sample: int = 200) -> float:
        """Mean ``MEMORY USAGE`` of up to ``sample`` record keys (value, key and Redis overhead)."""
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", self._prefix) + b"*"
        with self._errors():
            keys = list(itertools.islice(self._client.scan_iter(match=pattern, count=1000), sample))
            usage = [int(self._client.memory_usage(k) or 0) for k in keys]
        return sum(usage) / len(usage) if usage else 0.0

    def close(self) -> None:
        self._client.close()

    def check(self) -> dict[str, object]:
        """PING (reach and AUTH), the server version (>= 4.0: UNLINK, MEMORY USAGE, PXAT needs 6.2 with
        expire_after) and, with a ``maxmemory`` and no eviction, that memory is not already full."""
        with self._errors(), self._auth_errors():
            self._client.ping()
            info = self._client.info()
        return self._check_server(info, self.config.url)

    def _check_server(self, info: Mapping[str, Any], where: str) -> dict[str, object]:
        """The version and memory checks of :meth:`check` on one server's INFO."""
        version = str(info.get("redis_version", "0"))
        need = (6, 2) if self.options.expire_after_s else (4, 0)
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < need:
            raise StoreUnavailableError(
                f"Redis at {redact(where)} is version {version}; this store needs "
                f"{'.'.join(map(str, need))} or newer. Fix: upgrade the server or use {self.START_HINT}"
            )
        used, most = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        if most and used >= most and info.get("maxmemory_policy") == "noeviction":
            raise StoreFullError(
                f"Redis at {redact(where)} is full ({used:,} of maxmemory {most:,} bytes); raise its "
                "maxmemory (GEM_REDIS_MAXMEMORY for make redis-up) or set expire_after"
            )
        return {"redis_version": version, "used_memory": used, "maxmemory": most}

    @contextmanager
    def _auth_errors(self) -> Iterator[None]:
        """A refused AUTH (a wrong, missing or unexpected password) as :class:`StoreUnavailableError`."""
        try:
            yield
        except redis.AuthenticationError as exc:
            raise StoreUnavailableError(
                f"Redis at {redact(self.config.url)} refused the credentials ({redact(str(exc))}); "
                "fix the user:password in --store"
            ) from exc
        except redis.ResponseError as exc:  # NOAUTH, WRONGPASS, AUTH without a configured password
            raise StoreUnavailableError(
                f"Redis at {redact(self.config.url)} refused the connection ({redact(str(exc))}); "
                "fix the user:password in --store"
            ) from exc

    def __repr__(self) -> str:
        return f"RedisStore({redact(self.config.url)!r}, namespace={self.config.namespace!r})"

    @contextmanager
    def _errors(self, *, retry: bool = True) -> Iterator[None]:
        """Redis's errors as the store's: unreachable (unless ``retry``: left to a caller that retries
        them), out of memory."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not retry:
                raise
            raise StoreUnavailableError(
                f"cannot reach Redis at {redact(self.config.url)} ({redact(str(exc))}); start the project's "
                f"server with {self.START_HINT}"
            ) from exc
        except redis.ResponseError as exc:
            if str(exc).startswith("OOM"):
                raise StoreFullError(
                    f"Redis at {redact(self.config.url)} is out of memory ({exc}); raise its maxmemory "
                    "(GEM_REDIS_MAXMEMORY for make redis-up) or set expire_after"
                ) from exc
            raise


def redis_uri_parts(
    uri: str, location: str, options: dict[str, str], form: str, example: str
) -> tuple[Any, dict[str, Any]]:
    """``location`` (``[[user]:password@]host:port[/db]`` of ``uri``) split (``urlsplit``), checked to name
    a host and a valid port, and the ``namespace`` and ``timeout`` options as :class:`RedisConfig`
    keyword arguments; :class:`ConfigError` otherwise."""
    parts = urlsplit("//" + location)
    if parts.password is None and (password := REDIS_PASSWORD.read()) is not None:
        # no password in the URI (the CLI strips it before the pipeline is built): the environment's
        parts = urlsplit(
            f"//{quote(parts.username or '', safe='')}:{quote(password, safe='')}@{location.rpartition('@')[2]}"
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(FLAG, f"{uri!r} has a bad port", f"use {form}") from exc
    if not parts.hostname or (port is not None and port < 1):
        raise ConfigError(FLAG, f"{uri!r} is not {form}", f"e.g. {example}")
    namespace = options.get("namespace", RedisConfig.namespace)
    if not namespace:
        raise ConfigError(FLAG, f"{uri!r} has an empty namespace", "drop namespace= or give a prefix")
    return parts, {"namespace": namespace, "timeout_s": duration(options.get("timeout", "5s"), "timeout", uri)}
