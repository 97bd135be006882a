"""The online representation store: (user_id, ad_id|None) -> embedding, scores, version, age.

    from pipelines.store import open_store
    with open_store("lmdb:///tmp/reps?max_age=6h") as store:     # or redis://127.0.0.1:16379/0
        store.write_batch(representations_table)                # REPRESENTATION layout
        got = store.read_for_request(user_id, ad_ids, neighbor_ids)   # one round trip
        got.pairs.fresh, got.pairs.embedding, got.user.age_s, got.neighbor_pairs.stale

Backends: :class:`LmdbStore` (embedded, file-backed, the default), :class:`RedisStore` (one node)
and :class:`RedisClusterStore` (``redis-cluster://host:port``); a third-party backend by its dotted
path (``--store package.module:Class://...``, see ``registry``).
Records are a fixed binary layout (``codec``): 168 bytes for 64 float16 dims, 104 as int8.
A user's context record (opaque bytes for a downstream ranker) sits beside them:
``store.write_contexts(...)``, ``read_for_request(..., with_context=True)``.
"""

from __future__ import annotations

from pipelines.store.base import (
    Clock,
    ManualClock,
    OnlineStore,
    StoreFullError,
    StoreOptions,
    StoreUnavailableError,
    WriteReport,
    pair_grid,
)
from pipelines.store.batch import RepresentationArrays
from pipelines.store.codec import NULL_MS, Encoding, Key, record_nbytes
from pipelines.store.lmdb_store import LmdbConfig, LmdbStore
from pipelines.store.redis_cluster import (
    DEFAULT_REDIS_CLUSTER_URL,
    RedisClusterConfig,
    RedisClusterStore,
    default_redis_cluster_url,
)
from pipelines.store.redis_store import DEFAULT_REDIS_URL, RedisConfig, RedisStore, default_redis_url
from pipelines.store.registry import BACKENDS, StoreSpec, backend_class, check_store, open_store, parse_store_uri
from pipelines.store.result import ContextRead, ReadResult, RequestRead

__all__ = [
    "BACKENDS",
    "DEFAULT_REDIS_CLUSTER_URL",
    "DEFAULT_REDIS_URL",
    "NULL_MS",
    "Clock",
    "ContextRead",
    "Encoding",
    "Key",
    "LmdbConfig",
    "LmdbStore",
    "ManualClock",
    "OnlineStore",
    "ReadResult",
    "RedisClusterConfig",
    "RedisClusterStore",
    "RedisConfig",
    "RedisStore",
    "RepresentationArrays",
    "RequestRead",
    "StoreFullError",
    "StoreOptions",
    "StoreSpec",
    "StoreUnavailableError",
    "WriteReport",
    "backend_class",
    "check_store",
    "default_redis_cluster_url",
    "default_redis_url",
    "open_store",
    "pair_grid",
    "parse_store_uri",
    "record_nbytes",
]
