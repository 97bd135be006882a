"""The Redis Cluster backend (``redis-cluster://host:port``): the store past one Redis node.

One node's address is enough: the others are discovered (``CLUSTER SLOTS``, through
redis-py's :class:`redis.cluster.RedisCluster`). Records, values and the newest-wins
script are the single-node backend's (:mod:`redis_store`); what differs is where keys go.

Key layout (``layout=``):

- ``user`` (the default): ``<namespace>r:{<user_id>}<rest of the codec key>``. The hash tag
  ``{<user_id>}`` puts a user's records (user-level, every pair, the context record) in one
  slot, so one request's 200 candidate pairs, the user record and the context are one MGET
  on one node: one round trip.
- ``pair``: ``<namespace>r:<codec key>``, each key in a slot of its own (for comparison).

Every multi-key command stays within one slot (a cluster refuses others with CROSSSLOT):
reads are one MGET per slot and writes one newest-wins script call per slot, grouped by
the node that serves the slot; each node's commands go in one pipeline, and all nodes'
pipelines are written before any reply is read, so a read of keys on three nodes costs
about one round trip, not three.

Failover: a write counts only when every replica the master has acknowledged it
(``WAIT``), so a promoted replica holds every write the store reported. A command that
meets a dead node, a moved slot or a cluster still electing is retried, the slot map
refreshed, until ``failover_timeout``; writes are idempotent (the newest record wins,
a tie overwrites), so a retried batch stores the same records. Past the timeout the
store raises :class:`StoreUnavailableError`, naming the cluster and the fix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from hashlib import sha1
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

from pipelines.errors import ConfigError
from pipelines.optional import require_on_use
from pipelines.redact import redact
from pipelines.store.base import Clock, OnlineStore, StoreOptions, StoreUnavailableError
from pipelines.store.redis_store import _PUT, RedisConfig, RedisStore, redis_uri_parts
from pipelines.store.uri import FLAG, duration

if TYPE_CHECKING:
    import redis
    from redis.cluster import ClusterNode, RedisCluster
else:
    redis = require_on_use("redis", "redis", "The Redis Cluster store (redis-cluster:// URIs)")

__all__ = [
    "DEFAULT_REDIS_CLUSTER_URL",
    "RedisClusterConfig",
    "RedisClusterStore",
    "default_redis_cluster_url",
]

log = logging.getLogger(__name__)

#: Where ``make redis-cluster-up`` (scripts/redis-cluster.sh) starts the project's cluster.
DEFAULT_REDIS_CLUSTER_URL = "redis-cluster://127.0.0.1:17000"
Layout = Literal["user", "pair"]
LAYOUTS: tuple[Layout, ...] = ("user", "pair")
_PUT_SHA = sha1(_PUT.encode()).hexdigest()
T = TypeVar("T")
#: One node's commands: (command args, the request rows it answers).
_Plan = dict[str, tuple["ClusterNode", list[tuple[tuple[Any, ...], list[int]]]]]


def default_redis_cluster_url() -> str:
    """``$GEM_REDIS_CLUSTER_URL``, else :data:`DEFAULT_REDIS_CLUSTER_URL`."""
    import os

    return os.environ.get("GEM_REDIS_CLUSTER_URL") or DEFAULT_REDIS_CLUSTER_URL


@dataclass(frozen=True)
class RedisClusterConfig(RedisConfig):
    """:class:`RedisConfig` (``url``: one node, as a redis-py ``redis://`` URL, db 0), ``seeds`` (more
    nodes to start from, ``host:port``), ``layout`` (``user``: a hash tag per user; ``pair``: a slot
    per key), ``failover_timeout_s`` (how long a command keeps retrying while the cluster fails over)."""

    url: str = "redis://127.0.0.1:17000/0"
    layout: Layout = "user"
    failover_timeout_s: float = 30.0
    seeds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if "{" in self.namespace or "}" in self.namespace:
            raise ValueError(f"namespace {self.namespace!r} holds a brace: it would put every key in one slot")
        if not self.failover_timeout_s > 0:
            raise ValueError(f"failover_timeout_s must be positive, got {self.failover_timeout_s}")


class _NotReplicated(Exception):
    """A master's replicas did not all acknowledge a write in time (retried)."""


class RedisClusterStore(RedisStore):
    """Representations in a Redis Cluster, under one key namespace."""

    uri_options: ClassVar[tuple[str, ...]] = ("namespace", "timeout", "layout", "failover_timeout")
    START_HINT: ClassVar[str] = "`make redis-cluster-up` or point --store / GEM_REDIS_CLUSTER_URL at a running one"
    config: RedisClusterConfig

    @classmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> RedisClusterConfig:
        """``redis-cluster://[[user]:password@]host:port[,host:port...]``: one node, or several so that a
        client can start while one is down; options ``namespace``, ``timeout``, ``layout``,
        ``failover_timeout``."""
        form, example = "redis-cluster://host:port[,host:port...]", DEFAULT_REDIS_CLUSTER_URL
        netloc, slash, path = location.partition("/")
        auth, at, hosts = netloc.rpartition("@")
        first, *others = hosts.split(",")
        parts, kwargs = redis_uri_parts(uri, f"{auth}{at}{first}{slash}{path}", options, form, example)
        for host in others:
            redis_uri_parts(uri, host, {}, form, example)  # each names a host and a valid port
        if parts.path.strip("/") not in ("", "0"):
            raise ConfigError(
                FLAG, f"{uri!r} names database {parts.path.strip('/')}", f"a cluster has only db 0: {form}"
            )
        layout = options.get("layout", "user")
        if layout not in LAYOUTS:
            raise ConfigError(FLAG, f"layout={layout!r} in {uri!r}", f"use one of {list(LAYOUTS)}")
        wait = duration(options.get("failover_timeout", "30s"), "failover_timeout", uri)
        if "{" in kwargs["namespace"] or "}" in kwargs["namespace"]:
            raise ConfigError(FLAG, f"namespace in {uri!r} holds a brace", "give a namespace without { or }")
        url = urlunsplit(("redis", parts.netloc, "/0", "", ""))
        return RedisClusterConfig(url, layout=layout, failover_timeout_s=wait, seeds=tuple(others), **kwargs)

    def __init__(
        self, config: RedisClusterConfig, options: StoreOptions | None = None, clock: Clock | None = None
    ) -> None:
        OnlineStore.__init__(self, options, clock)
        self.config = config
        self._prefix = config.namespace.encode() + b"r:"
        self._versions_key = config.namespace.encode() + b"v"
        self._loaded: set[str] = set()  # nodes known to hold the newest-wins script
        with self._errors(), self._auth_errors():
            try:
                from redis.cluster import ClusterNode

                seeds = [ClusterNode(u.hostname, u.port) for u in (urlsplit("//" + host) for host in config.seeds)]
                self._cluster: RedisCluster = redis.RedisCluster.from_url(
                    config.url,
                    startup_nodes=seeds,
                    socket_timeout=config.timeout_s,
                    socket_connect_timeout=config.timeout_s,
                )
            except redis.exceptions.RedisClusterException as exc:
                if any(word in str(exc) for word in ("AUTH", "WRONGPASS", "invalid username-password")):
                    raise redis.AuthenticationError(str(exc)) from exc
                raise redis.ConnectionError(str(exc)) from exc
        self._client = self._cluster  # type: ignore[assignment]  # RedisStore's ping, close, _errors

    # -- keys and routing ---------------------------------------------------------------
    def _key(self, key: bytes) -> bytes:
        """The cluster key of a codec key (its first 8 bytes are the user id)."""
        return self._route([key])[0][0]

    def _route(self, keys: list[bytes]) -> tuple[list[bytes], dict[int, list[int]]]:
        """The cluster keys of codec keys (their first 8 bytes are the user id), and slot -> the rows
        in that slot. With a hash tag per user, the tag and its slot are made once per user."""
        from redis.crc import key_slot

        groups: dict[int, list[int]] = {}
        if self.config.layout == "pair":
            full = [self._prefix + key for key in keys]
            for i, key in enumerate(full):
                groups.setdefault(key_slot(key), []).append(i)
            return full, groups
        users = [key[:8] for key in keys]
        tags = {u: b"%s{%d}" % (self._prefix, int.from_bytes(u, "big", signed=True)) for u in dict.fromkeys(users)}
        full = [tags[u] + key[8:] for u, key in zip(users, keys, strict=True)]
        if len(tags) == 1:  # one user's request: every key in one slot
            return full, {key_slot(next(iter(tags.values()))): list(range(len(keys)))}
        slot_of = {u: key_slot(tag) for u, tag in tags.items()}
        for i, u in enumerate(users):
            groups.setdefault(slot_of[u], []).append(i)
        return full, groups

    def _plan(self, groups: dict[int, list[int]], command: Callable[[list[int]], tuple[Any, ...]]) -> _Plan:
        """Each slot's rows, in chunks, as ``command(rows)`` on the master serving the slot."""
        plan: _Plan = {}
        manager = self._cluster.nodes_manager
        for slot, rows in groups.items():
            node = manager.get_node_from_slot(slot)
            cmds = plan.setdefault(node.name, (node, []))[1]
            for i in range(0, len(rows), self.config.chunk):
                chunk = rows[i : i + self.config.chunk]
                cmds.append((command(chunk), chunk))
        return plan

    def _send(self, plan: _Plan) -> dict[str, list[Any]]:
        """Each node's commands in one pipeline on one connection; every node's written before any
        reply is read. Replies in order, an error reply as its exception."""
        held = []
        try:
            for node, cmds in plan.values():
                pool = self._cluster.get_redis_connection(node).connection_pool
                conn = pool.get_connection()
                held.append((pool, conn))
                conn.send_packed_command(_pack(conn, [args for args, _ in cmds]))
            out: dict[str, list[Any]] = {}
            for (name, (_, cmds)), (_, conn) in zip(plan.items(), held, strict=False):
                out[name] = [_reply(conn) for _ in cmds]
        except BaseException:
            for _, conn in held:
                conn.disconnect()  # unread replies would answer the connection's next user
            raise
        finally:
            for pool, conn in held:
                pool.release(conn)
        return out

    def _failover(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, retried while the cluster fails over (a dead node, a moved slot, an election,
        a write not yet on every replica), the slot map refreshed before each retry, until
        ``failover_timeout_s``; then :class:`StoreUnavailableError`."""
        retryable = _retryable()
        deadline = time.monotonic() + self.config.failover_timeout_s
        delay, tries = 0.05, 0
        while True:
            try:
                with self._errors(retry=False):
                    return attempt()
            except retryable as exc:
                tries += 1
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailableError(
                        f"Redis Cluster at {redact(self.config.url)}: {what} still failing after "
                        f"{self.config.failover_timeout_s:g}s and {tries} tries ({redact(str(exc))}). Fix: check "
                        "the cluster (redis-cli --cluster check HOST:PORT; every slot needs a live master), start it "
                        f"with {self.START_HINT}, or raise failover_timeout in --store; then rerun (writes are "
                        "idempotent)"
                    ) from exc
                log.warning("redis cluster: %s failed (%s); retrying in %.2fs", what, redact(str(exc)), delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                self._refresh()

    def _refresh(self) -> None:
        try:
            self._cluster.nodes_manager.initialize()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            log.warning("redis cluster: slot map refresh failed (%s)", redact(str(exc)))
        self._loaded.clear()

    def _replicas(self, node: ClusterNode) -> int:
        """How many live replicas the slot map gives ``node`` (a master)."""
        for nodes in self._cluster.nodes_manager.slots_cache.values():
            if nodes and nodes[0].name == node.name:
                return len(nodes) - 1
        return 0

    # -- the backend's part ---------------------------------------------------------------
    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        expire_ms = int(self.options.expire_after_s * 1000) if self.options.expire_after_s else 0
        full, groups = self._route(keys)

        def script(rows: list[int]) -> tuple[Any, ...]:
            return ("EVALSHA", _PUT_SHA, len(rows), *[full[i] for i in rows], expire_ms, *[values[i] for i in rows])

        def attempt() -> int:
            plan = self._plan(groups, script)
            if versions:
                from redis.crc import key_slot

                node = self._cluster.nodes_manager.get_node_from_slot(key_slot(self._versions_key))
                mapping = [part for vid, name in versions.items() for part in (str(vid), name)]
                plan.setdefault(node.name, (node, []))[1].append((("HSET", self._versions_key, *mapping), []))
            waits = {}
            for name, (node, cmds) in plan.items():
                self._load_script(node)
                waits[name] = self._replicas(node)
                if waits[name]:
                    cmds.append((("WAIT", waits[name], int(self.config.timeout_s * 1000)), []))
            written = 0
            for name, replies in self._send(plan).items():
                cmds = plan[name][1]
                for (args, _), reply in zip(cmds, replies, strict=True):
                    if isinstance(reply, Exception):
                        if isinstance(reply, redis.exceptions.NoScriptError):
                            self._loaded.discard(name)
                        raise reply
                    if args[0] == "EVALSHA":
                        written += int(reply)
                    elif args[0] == "WAIT" and int(reply) < waits[name]:
                        raise _NotReplicated(f"{reply} of {waits[name]} replicas of {name} acknowledged a write")
            return written

        return self._failover("a write", attempt)

    def _load_script(self, node: ClusterNode) -> None:
        if node.name not in self._loaded:
            self._cluster.get_redis_connection(node).script_load(_PUT)
            self._loaded.add(node.name)

    def _get(self, keys: list[bytes]) -> list[bytes]:
        full, groups = self._route(keys)

        def attempt() -> list[bytes]:
            plan = self._plan(groups, lambda rows: ("MGET", *[full[i] for i in rows]))
            out = [b""] * len(keys)
            for name, replies in self._send(plan).items():
                for (_, rows), reply in zip(plan[name][1], replies, strict=True):
                    if isinstance(reply, Exception):
                        raise reply
                    for i, value in zip(rows, reply, strict=True):
                        out[i] = value or b""
            return out

        return self._failover("a read", attempt)

    def _delete(self, keys: list[bytes]) -> int:
        full, groups = self._route(keys)

        def attempt() -> int:
            plan = self._plan(groups, lambda rows: ("DEL", *[full[i] for i in rows]))
            replies = [r for rs in self._send(plan).values() for r in rs]
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return sum(int(r) for r in replies)

        return self._failover("a delete", attempt)

    def _versions(self, ids: list[int]) -> dict[int, str]:
        names = cast(
            list[bytes | None],
            self._failover("a version read", lambda: self._cluster.hmget(self._versions_key, [str(i) for i in ids])),
        )
        return {vid: name.decode() for vid, name in zip(ids, names, strict=True) if name is not None}

    def _scan(self, pattern: bytes, limit: int | None = None) -> Iterator[tuple[Any, bytes]]:
        """(node client, key) of the keys matching ``pattern`` on every master."""
        found = 0
        for node in self._cluster.get_primaries():
            client = self._cluster.get_redis_connection(node)
            for key in client.scan_iter(match=pattern, count=1000):
                yield client, key
                found += 1
                if limit is not None and found >= limit:
                    return

    def clear(self) -> None:
        import re

        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", self.config.namespace.encode()) + b"*"
        with self._errors():
            pipes: dict[int, Any] = {}
            for client, key in self._scan(pattern):
                pipe = pipes.setdefault(id(client), client.pipeline(transaction=False))
                pipe.unlink(key)  # one key per command: a multi-key UNLINK must stay in one slot
            for pipe in pipes.values():
                pipe.execute()
        self._version_names.clear()

    def memory_per_record(self, sample: int = 200) -> float:
        import re

        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", self._prefix) + b"*"
        with self._errors():
            usage = [int(client.memory_usage(key) or 0) for client, key in self._scan(pattern, sample)]
        return sum(usage) / len(usage) if usage else 0.0

    def check(self) -> dict[str, object]:
        """Reached and authenticated (when opened), ``cluster_state:ok``, and every master's version and
        memory as for a single node."""
        with self._errors(), self._auth_errors():
            state = self._cluster.cluster_info()
            primaries = self._cluster.get_primaries()
            infos = {node.name: self._cluster.get_redis_connection(node).info() for node in primaries}
        if state.get("cluster_state") != "ok":
            raise StoreUnavailableError(
                f"Redis Cluster at {redact(self.config.url)} reports cluster_state:{state.get('cluster_state')} "
                f"({state.get('cluster_slots_ok')} of 16384 slots ok). Fix: restart its failed nodes "
                f"(`make redis-cluster-up` for the project's) and check it with redis-cli --cluster check"
            )
        found: dict[str, object] = {"masters": len(primaries), "cluster_state": "ok"}
        for name, info in infos.items():
            found[name] = self._check_server(info, f"{self.config.url} ({name})")
        return found

    def ping(self) -> None:
        with self._errors():
            self._cluster.ping()

    def __repr__(self) -> str:
        return (
            f"RedisClusterStore({redact(self.config.url)!r}, namespace={self.config.namespace!r}, "
            f"layout={self.config.layout!r})"
        )


def _pack(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """``commands`` in the wire protocol. Our commands' arguments are already bytes or str, so with
    hiredis installed each goes straight to its C packer (the one redis-py's own hiredis serializer
    ends in) without redis-py's per-argument Python pass; else redis-py packs them."""
    from redis.connection import HiredisRespSerializer

    if isinstance(getattr(conn, "_command_packer", None), HiredisRespSerializer):
        import hiredis

        return [hiredis.pack_command(args) for args in commands]
    return cast(list[bytes], conn.pack_commands(commands))


def _reply(conn: Any) -> Any:
    """One reply from ``conn``; an error reply returned as its exception, not raised."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


def _retryable() -> tuple[type[BaseException], ...]:
    from redis import exceptions as e

    return (
        e.ConnectionError,
        e.TimeoutError,
        e.ClusterDownError,
        e.TryAgainError,
        e.AskError,  # and MovedError, its subclass
        e.ReadOnlyError,
        e.NoScriptError,
        e.SlotNotCoveredError,
        _NotReplicated,
    )
