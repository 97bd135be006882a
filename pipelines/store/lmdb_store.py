"""The embedded, file-backed default backend: LMDB (``lmdb:///path/to/dir`` or a plain path).

Why LMDB: a read is a B+tree walk over a memory-mapped file, with no server, no SQL
layer and no copy into a page cache of our own, so one request of 200 keys costs
well under a millisecond; readers never block and many processes (Beam's workers,
the resolver) can read one directory while one writer commits, each write batch an
atomic, crash-safe copy-on-write transaction. SQLite would serialise through its SQL
layer and a database-wide write lock; RocksDB is not in the environment and its
compactions are more machinery than a precompute cache needs.

The directory holds ``data.mdb`` and ``lock.mdb``; two named databases: ``records``
(key -> record, see ``codec``) and ``versions`` (version id -> model_version).
LMDB forbids opening one environment twice in a process, so environments are shared
per resolved path and reference-counted.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from typing import ClassVar

import lmdb

from pipelines.errors import ConfigError, InputNotFoundError
from pipelines.store.base import Clock, OnlineStore, StoreFullError, StoreOptions
from pipelines.store.codec import computed_at_of
from pipelines.store.lmdb_file import check_data_file
from pipelines.store.uri import FLAG, positive_number

__all__ = ["LmdbConfig", "LmdbStore"]

#: ``check`` refuses a store whose file system has less free space than this.
MIN_FREE_BYTES = 64 << 20
_ENVS: dict[str, tuple[lmdb.Environment, int]] = {}
_ENVS_LOCK = threading.Lock()


@dataclass(frozen=True)
class LmdbConfig:
    """``path``: the store's directory (created for a writer). ``map_size_gb``: the most the file may
    grow to (address space reserved, not disk used). ``create``: False for a reader, which never
    creates a store: a missing one is an error naming the path."""

    path: str
    map_size_gb: float = 16.0
    create: bool = True

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("LMDB store path is empty")
        if not self.map_size_gb > 0:
            raise ValueError(f"map_size_gb must be positive, got {self.map_size_gb}")


class LmdbStore(OnlineStore):
    """Representations in a local LMDB directory."""

    uri_options: ClassVar[tuple[str, ...]] = ("map_size_gb",)

    @classmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> LmdbConfig:
        """``lmdb:///abs/dir``, ``lmdb://rel/dir`` or a plain path; option ``map_size_gb``."""
        if not location:
            raise ConfigError(FLAG, f"{uri!r} names no directory", "use lmdb:///path/to/dir or a plain path")
        size = options.get("map_size_gb")
        return LmdbConfig(
            location, LmdbConfig.map_size_gb if size is None else positive_number(size, "map_size_gb", uri)
        )

    @classmethod
    def reader_config(cls, config: LmdbConfig) -> LmdbConfig:
        return replace(config, create=False)

    def __init__(self, config: LmdbConfig, options: StoreOptions | None = None, clock: Clock | None = None):
        super().__init__(options, clock)
        self.config = config
        self._path = os.path.realpath(config.path)
        self._env = _acquire(self._path, config.map_size_gb, create=config.create)
        self._records = self._env.open_db(b"records")
        self._names = self._env.open_db(b"versions")
        self._closed = False

    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        written = 0
        order = sorted(range(len(keys)), key=keys.__getitem__)  # B+tree locality
        try:
            with self._env.begin(write=True) as txn:
                for i in order:
                    old = txn.get(keys[i], db=self._records)
                    if old is None or computed_at_of(old) <= computed_at_of(values[i]):
                        txn.put(keys[i], values[i], db=self._records)
                        written += 1
                for vid, name in versions.items():
                    txn.put(vid.to_bytes(8, "little"), name.encode(), db=self._names)
        except lmdb.MapFullError as exc:
            raise StoreFullError(
                f"LMDB store {self._path} reached map_size_gb={self.config.map_size_gb}; "
                f"reopen it with a larger one, e.g. lmdb://{self._path}?map_size_gb="
                f"{self.config.map_size_gb * 4:g}"
            ) from exc
        return written

    def _get(self, keys: list[bytes]) -> list[bytes]:
        """One cursor for all keys: LMDB looks a key up on the cursor's current leaf page first and
        walks down from the root only when it is not there, so keys in order share their pages."""
        with self._env.begin(db=self._records) as txn:
            cursor = txn.cursor()
            seek, value = cursor.set_key, cursor.value
            return [value() if seek(key) else b"" for key in keys]

    def _delete(self, keys: list[bytes]) -> int:
        with self._env.begin(write=True, db=self._records) as txn:
            return sum(bool(txn.delete(key)) for key in keys)

    def _versions(self, ids: list[int]) -> dict[int, str]:
        with self._env.begin(db=self._names) as txn:
            found = {vid: txn.get(vid.to_bytes(8, "little")) for vid in ids}
        return {vid: name.decode() for vid, name in found.items() if name is not None}

    def clear(self) -> None:
        with self._env.begin(write=True) as txn:
            txn.drop(self._records, delete=False)
            txn.drop(self._names, delete=False)
        self._version_names.clear()

    def count(self) -> int:
        """The number of stored records (expired ones included)."""
        with self._env.begin(db=self._records) as txn:
            return int(txn.stat(self._records)["entries"])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release(self._path)

    def check(self) -> dict[str, object]:
        """The data file was checked when opened; here: the file system has room to grow
        (at least :data:`MIN_FREE_BYTES` free) and the store can be written."""
        stat = os.statvfs(self._path)
        free = stat.f_bavail * stat.f_frsize
        if free < MIN_FREE_BYTES:
            raise StoreFullError(
                f"LMDB store {self._path}: only {free / 2**20:.0f} MiB free on its file system (need at least "
                f"{MIN_FREE_BYTES / 2**20:.0f} MiB); free space there or point --store at another disk"
            )
        if not os.access(self._path, os.W_OK):
            raise StoreFullError(f"LMDB store {self._path} is not writable; fix its permissions or choose another")
        return {"free_bytes": free, "records": self.count()}

    def __repr__(self) -> str:
        return f"LmdbStore({self._path!r})"


def _acquire(path: str, map_size_gb: float, *, create: bool) -> lmdb.Environment:
    with _ENVS_LOCK:
        env, refs = _ENVS.get(path, (None, 0))
        if env is None:
            if not create and not os.path.isfile(os.path.join(path, "data.mdb")):
                raise InputNotFoundError(
                    f"--store: no LMDB store at {path} (no data.mdb there). Fix: pass the --store that "
                    "`precompute --store` or `solaris` wrote; a reader never creates one"
                )
            os.makedirs(path, exist_ok=True)
            check_data_file(path)  # a truncated file would raise SIGBUS once mapped
            env = lmdb.open(path, map_size=int(map_size_gb * 2**30), max_dbs=2, readahead=False, meminit=False)
        _ENVS[path] = (env, refs + 1)
        return env


def _release(path: str) -> None:
    with _ENVS_LOCK:
        env, refs = _ENVS[path]
        if refs > 1:
            _ENVS[path] = (env, refs - 1)
        else:
            del _ENVS[path]
            env.close()
