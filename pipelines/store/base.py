"""The online store interface: write and read representations in batches, with ages.

A backend implements five byte-level methods (``_put``, ``_get``, ``_delete``,
``_versions``, ``clear``) and says how a ``--store`` URI configures it (``uri_options``,
``config_from_uri``); encoding, expiry and staleness live here once, so every backend
answers the same way and one test suite covers them all.

Semantics, identical on every backend:

- keys are ``(user_id, ad_id)``; ``ad_id`` None is the user-level representation;
- a write keeps the newest record: a row whose ``computed_at`` is older than the stored
  one is skipped (Beam retries and replays of an old snapshot cannot roll a key back);
  an equal or newer ``computed_at`` overwrites;
- ``age_s`` = clock() - computed_at. ``age_s > max_age_s`` is reported ``stale`` (data
  and age still returned, never ``fresh``); ``age_s > expire_after_s`` reads as missing
  (Redis also drops it physically, by its own clock, via ``PXAT``).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from pipelines.errors import PipelinesError
from pipelines.store.batch import RepresentationArrays
from pipelines.store.codec import (
    ENCODINGS,
    NULL_MS,
    DecodedRecords,
    Encoding,
    Key,
    computed_at_of,
    decode_context,
    encode_context_key,
    encode_contexts,
    encode_key,
    encode_keys,
    encode_records,
    version_id,
)
from pipelines.store.result import ContextRead, ReadResult, RequestRead

__all__ = [
    "Clock",
    "ManualClock",
    "OnlineStore",
    "StoreFullError",
    "StoreOptions",
    "StoreUnavailableError",
    "WriteReport",
    "pair_grid",
]

#: Seconds since the epoch, like ``time.time``.
Clock = Callable[[], float]


class StoreUnavailableError(PipelinesError, ConnectionError):
    """The store's server cannot be reached (the message says how to start it)."""


class StoreFullError(PipelinesError):
    """The store refused a write for lack of space (the message names the setting to raise)."""


class ManualClock:
    """A clock that moves only when told to: ``clock.advance(3600)``. For tests and replays."""

    def __init__(self, now_s: float | None = None) -> None:
        self.now_s = time.time() if now_s is None else float(now_s)

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass(frozen=True)
class StoreOptions:
    """Behaviour shared by every backend.

    ``max_age_s``: older records read as stale (None: never stale). ``expire_after_s``:
    older records read as missing and Redis expires them (None: kept forever); must be
    at least ``max_age_s``. ``encoding``: how embeddings are stored (``float16`` or
    ``int8`` with a per-record scale).
    """

    max_age_s: float | None = None
    expire_after_s: float | None = None
    encoding: Encoding = "float16"

    def __post_init__(self) -> None:
        for name in ("max_age_s", "expire_after_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_age_s and self.expire_after_s and self.expire_after_s < self.max_age_s:
            raise ValueError(
                f"expire_after_s ({self.expire_after_s}) is below max_age_s ({self.max_age_s}): "
                "stale records would vanish before they could be reported stale"
            )
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")


@dataclass(frozen=True)
class WriteReport:
    """``written`` records stored, ``skipped_older`` kept out by a newer stored record."""

    written: int
    skipped_older: int
    value_bytes: int


class OnlineStore(abc.ABC):
    """Representations by (user_id, ad_id|None). Open one with ``pipelines.store.open_store``."""

    #: The backend's own ``--store`` URI query options (beside max_age, expire_after, encoding).
    uri_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: StoreOptions | None = None, clock: Clock | None = None) -> None:
        self.options = options or StoreOptions()
        self.clock: Clock = clock or time.time
        self._version_names: dict[int, str] = {}

    # -- the backend's part ------------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> Any:
        """The config this backend is made with (``Backend(config, options, clock)``), from ``uri``:
        ``location`` is its part after ``scheme://`` and before ``?``, ``options`` its query options
        named in :attr:`uri_options` (the shared ones taken out). No I/O; raise ``ConfigError`` (or
        ``ValueError``) naming the fix."""

    @classmethod
    def reader_config(cls, config: Any) -> Any:
        """``config`` for a reader, which never creates a store (``open_store(reader=True)``); a backend
        that creates its store on opening (LMDB) returns one that refuses to."""
        return config

    @abc.abstractmethod
    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        """Store values unless the stored record is newer; record ``versions``; one round trip."""

    @abc.abstractmethod
    def _get(self, keys: list[bytes]) -> list[bytes]:
        """The stored values, empty (``b""``) where absent; one round trip."""

    @abc.abstractmethod
    def _delete(self, keys: list[bytes]) -> int:
        """Remove keys; the number that existed."""

    @abc.abstractmethod
    def _versions(self, ids: list[int]) -> dict[int, str]:
        """The model_version strings of ``ids`` (only called for ids not seen before)."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove every record and version of this store (its namespace or file)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and file handles."""

    def check(self) -> dict[str, object]:
        """Prove the store usable before any work (reached, authenticated, a supported version, room
        to write where knowable); raise a :class:`PipelinesError` naming the fix. Returns what it found."""
        return {}

    # -- the public part -----------------------------------------------------------------
    def write_batch(self, batch: pa.Table | pa.RecordBatch | RepresentationArrays) -> WriteReport:
        """Write representations (REPRESENTATION layout table, or arrays) in one round trip."""
        arrays = batch if isinstance(batch, RepresentationArrays) else RepresentationArrays.from_arrow(batch)
        if len(arrays) == 0:
            return WriteReport(0, 0, 0)
        rows = arrays.model_version.tolist()
        id_of = {v: version_id(v) for v in set(rows)}
        names = {vid: v for v, vid in id_of.items()}
        ids = np.fromiter((id_of[v] for v in rows), np.uint64, len(rows))
        int8 = arrays.int8_codes() if self.options.encoding == "int8" else None
        values = encode_records(
            encoding=self.options.encoding,
            values=arrays.values(),
            codes=None if int8 is None else int8[0],
            scale=None if int8 is None else int8[1],
            p_click=arrays.p_click,
            p_conversion=arrays.p_conversion,
            version_ids=ids,
            computed_at_ms=arrays.computed_at_ms,
            history_watermark_ms=arrays.history_watermark_ms,
        )
        keys = encode_keys(arrays.user_id, arrays.ad_id, arrays.has_ad)
        keys, values = _last_per_key(keys, values)
        written = self._put(keys, values, names)
        self._version_names.update(names)
        return WriteReport(written, len(keys) - written, sum(map(len, values)))

    def read_batch(self, keys: Sequence[Key], *, max_age_s: float | None = None) -> ReadResult:
        """Read ``keys`` in one round trip; ``max_age_s`` overrides the store's bound for this read."""
        n = len(keys)
        user_id = np.fromiter((user for user, _ in keys), dtype=np.int64, count=n)
        ad_id = np.fromiter((0 if ad is None else ad for _, ad in keys), dtype=np.int64, count=n)
        has_ad = np.fromiter((ad is not None for _, ad in keys), dtype=bool, count=n)
        return self.read_arrays(user_id, ad_id, has_ad, max_age_s=max_age_s)

    def read_arrays(
        self,
        user_id: np.ndarray,
        ad_id: np.ndarray,
        has_ad: np.ndarray,
        *,
        order: np.ndarray | None = None,
        max_age_s: float | None = None,
    ) -> ReadResult:
        """:meth:`read_batch` of keys given as columns: ``user_id``, ``ad_id`` int64 (N,) (``ad_id``
        ignored where ``has_ad`` (N,) bool is False: a user-level key). No Python object per key but
        the encoded key and the stored value. Keys are read sorted by (user, ad), so a user's keys come
        together (LMDB then finds most of them on the page it is on); ``order`` (N,), the rows in that
        order, spares the sort when the caller knows it (e.g. from :func:`pair_grid`)."""
        return self._read(user_id, ad_id, has_ad, order=order, max_age_s=max_age_s)[0]

    def _read(
        self,
        user_id: np.ndarray,
        ad_id: np.ndarray,
        has_ad: np.ndarray,
        *,
        order: np.ndarray | None,
        max_age_s: float | None,
        extra: Sequence[bytes] = (),
    ) -> tuple[ReadResult, list[bytes]]:
        """:meth:`read_arrays`, and the raw values of ``extra`` keys read in the same round trip."""
        user_id = np.asarray(user_id, dtype=np.int64)
        ad_id = np.where(has_ad, np.asarray(ad_id, dtype=np.int64), 0)
        has_ad = np.asarray(has_ad, dtype=bool)
        if order is None:
            order = np.lexsort((ad_id, user_id))
        values = self._get(encode_keys(user_id[order], ad_id[order], has_ad[order]) + list(extra))
        n = len(user_id)
        decoded = DecodedRecords(values[:n])
        unknown = sorted(set(decoded.versions[0].tolist()) - self._version_names.keys())
        if unknown:
            self._version_names.update(self._versions(unknown))
        result = ReadResult.build(
            user_id,
            ad_id,
            has_ad,
            decoded,
            order,
            self._version_names,
            now_s=self.clock(),
            max_age_s=self.options.max_age_s if max_age_s is None else max_age_s,
            expire_after_s=self.options.expire_after_s,
        )
        return result, values[n:]

    def read_for_request(
        self,
        user_id: int,
        ad_ids: Iterable[int],
        neighbor_ids: Iterable[int] = (),
        *,
        max_age_s: float | None = None,
        with_context: bool = False,
    ) -> RequestRead:
        """A request's exact pairs, the user-level record and neighbours' pairs, in one round trip;
        ``with_context``: also the user's context record (:meth:`write_contexts`), in the same trip."""
        ads, neighbors = _int64s(ad_ids), _int64s(neighbor_ids)
        a = len(ads)
        users, ad_col, order = pair_grid(np.concatenate([[user_id], neighbors]).astype(np.int64), ads)
        n = len(users)  # rows: the user's pairs, the neighbours' pairs, the user-level key last
        has_ad = np.ones(n + 1, dtype=bool)
        has_ad[n] = False
        result, extra = self._read(
            np.append(users, user_id),
            np.append(ad_col, 0),
            has_ad,
            order=np.concatenate([[n], order]),
            max_age_s=max_age_s,
            extra=[encode_context_key(user_id)] if with_context else [],
        )
        return RequestRead(
            user_id=user_id,
            ad_ids=ads,
            neighbor_ids=neighbors,
            pairs=result.take(slice(0, a)),
            user=result.take(slice(n, n + 1)),
            neighbor_pairs=result.take(slice(a, n)),
            context=self._context(extra[0], max_age_s) if with_context else None,
        )

    def write_contexts(
        self,
        user_id: np.ndarray,
        payloads: Sequence[bytes],
        *,
        model_version: str,
        computed_at_ms: np.ndarray,
        history_watermark_ms: np.ndarray | None = None,
    ) -> WriteReport:
        """Write each user's context record (opaque ``payloads``, one per ``user_id`` (N,)) in one round
        trip, with the representations' semantics: the newest ``computed_at_ms`` (N,) wins, ages and
        expiry as for a representation."""
        n = len(payloads)
        if len(user_id) != n or len(computed_at_ms) != n:
            raise ValueError(f"write_contexts: {len(user_id)} users, {n} payloads, {len(computed_at_ms)} times")
        if n == 0:
            return WriteReport(0, 0, 0)
        vid = version_id(model_version)
        watermark = np.full(n, NULL_MS, np.int64) if history_watermark_ms is None else history_watermark_ms
        values = encode_contexts(payloads, np.full(n, vid, np.uint64), computed_at_ms, watermark)
        keys, values = _last_per_key([encode_context_key(int(u)) for u in user_id], values)
        written = self._put(keys, values, {vid: model_version})
        self._version_names[vid] = model_version
        return WriteReport(written, len(keys) - written, sum(map(len, values)))

    def read_contexts(self, user_ids: Iterable[int], *, max_age_s: float | None = None) -> list[ContextRead]:
        """The context records of ``user_ids``, in one round trip."""
        values = self._get([encode_context_key(int(u)) for u in user_ids])
        return [self._context(v, max_age_s) for v in values]

    def _context(self, value: bytes, max_age_s: float | None) -> ContextRead:
        bound = self.options.max_age_s if max_age_s is None else max_age_s
        if not value:
            return ContextRead.missing()
        head, payload = decode_context(value)
        age = self.clock() - int(head["computed_at_ms"]) / 1000.0
        if self.options.expire_after_s is not None and age > self.options.expire_after_s:
            return ContextRead.missing()
        vid = int(head["version_id"])
        if vid not in self._version_names:
            self._version_names.update(self._versions([vid]))
        return ContextRead(True, payload, age, bound is not None and age > bound, self._version_names.get(vid))

    def delete_batch(self, keys: Sequence[Key]) -> int:
        """Remove ``keys``; returns how many existed."""
        return self._delete([encode_key(user, ad) for user, ad in keys]) if keys else 0

    def __enter__(self) -> OnlineStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def pair_grid(user_ids: np.ndarray, ad_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys of every (user, ad) pair, row ``i * len(ad_ids) + j`` for ``(user_ids[i], ad_ids[j])``, as
    ``(users, ads, order)``: two int64 columns and their rows sorted by (user, ad) (for
    :meth:`OnlineStore.read_arrays`), from two small sorts instead of one over every pair."""
    users, ads = np.asarray(user_ids, dtype=np.int64), np.asarray(ad_ids, dtype=np.int64)
    order = np.argsort(users, kind="stable")[:, None] * len(ads) + np.argsort(ads, kind="stable")[None, :]
    return np.repeat(users, len(ads)), np.tile(ads, len(users)), order.ravel()


def _int64s(values: Iterable[int]) -> np.ndarray:
    if isinstance(values, np.ndarray | list | tuple):
        return np.asarray(values, dtype=np.int64).reshape(-1)
    return np.fromiter(values, dtype=np.int64)


def _last_per_key(keys: list[bytes], values: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Keep one value per key: the newest, the later row on a tie (as if written in order)."""
    if len(set(keys)) == len(keys):
        return keys, values
    best: dict[bytes, bytes] = {}
    for key, value in zip(keys, values, strict=True):
        old = best.get(key)
        if old is None or computed_at_of(old) <= computed_at_of(value):
            best[key] = value
    return list(best), list(best.values())
