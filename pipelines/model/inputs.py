"""The model's input batch, and its construction from Arrow history rows.

A :class:`GemBatch` holds B rows (an impression to score, or a (user, candidate ad)
pair) and the jagged history prefix each row may see. :class:`HistoryIndex` flattens
a table in the ``history`` layout once; its methods cut point-in-time prefixes for
training examples (``history_end``), for candidate requests (events strictly before
``request_time``) or for whole users. The module-level ``build_*`` functions are the
one-call forms the training loop and the precompute stage use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipelines.model.jagged import gather_index
from pipelines.schemas.enums import EVENT_TYPES

__all__ = [
    "AdLookup",
    "ExampleSet",
    "GemBatch",
    "HistoryIndex",
    "ad_catalog",
    "build_candidate_batch",
    "build_example_batch",
    "build_user_batch",
    "count_features",
    "lookup_ads",
]

_TIME_BITS = 41  # ~70 years of milliseconds; leaves 22 bits (4M history rows) for the row
#: Dense per-row features: log1p of the prefix's count of each event type (evicted
#: events included), log1p of the prefix length, log1p seconds since the last event.
COUNT_FEATURES: tuple[str, ...] = (*(f"log_{t}s" for t in EVENT_TYPES), "log_events", "log_seconds_since_last")
NUM_COUNT_FEATURES = len(COUNT_FEATURES)
#: ``last_ms`` of an empty prefix in :meth:`HistoryIndex.prefix_totals`.
NULL_LAST_MS = np.iinfo(np.int64).min
SEQUENCE_FIELDS = ("item_id", "advertiser_id", "category", "is_ad", "surface", "event_type", "age_s", "value")


@dataclass
class GemBatch:
    """B rows and their jagged history prefixes (L tokens in all).

    History (jagged): ``offsets: (B+1,)``; ``item_id, advertiser_id, category, is_ad,
    surface, event_type: (L,) int64`` (-1 = null); ``age_s: (L,) float32`` seconds
    between the event and the row's request time; ``value: (L,) float32`` (NaN = null).
    Rows: ``user_id, request_surface, device, history_length, request_time_ms,
    target_item, target_advertiser, target_category, target_is_ad: (B,) int64``;
    ``counts: (B, NUM_COUNT_FEATURES) float32`` dense features of the WHOLE prefix
    before the request (not only the last ``max_len`` events; see :data:`COUNT_FEATURES`);
    labels ``clicked, converted: (B,) float32`` or None. A target of -1 means "no ad"
    (a user-level row).
    """

    offsets: torch.Tensor
    item_id: torch.Tensor
    advertiser_id: torch.Tensor
    category: torch.Tensor
    is_ad: torch.Tensor
    surface: torch.Tensor
    event_type: torch.Tensor
    age_s: torch.Tensor
    value: torch.Tensor
    user_id: torch.Tensor
    request_surface: torch.Tensor
    device: torch.Tensor
    history_length: torch.Tensor
    request_time_ms: torch.Tensor
    target_item: torch.Tensor
    target_advertiser: torch.Tensor
    target_category: torch.Tensor
    target_is_ad: torch.Tensor
    counts: torch.Tensor
    clicked: torch.Tensor | None = None
    converted: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.offsets.numel() - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.item_id.numel())

    @property
    def lengths(self) -> torch.Tensor:
        """``(B,)`` history tokens per row."""
        return self.offsets[1:] - self.offsets[:-1]

    def to(self, device: torch.device | str) -> GemBatch:
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = None if value is None else value.to(device, non_blocking=True)
        return GemBatch(**moved)

    def slice(self, start: int, stop: int) -> GemBatch:
        """Rows ``[start, stop)``, histories included: what :meth:`select` gives for a contiguous
        range, by copying slices instead of gathering (copies: a view would keep the whole batch
        alive, and made the precompute bench's loop slower)."""
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        out: dict[str, Any] = {"offsets": self.offsets[start : stop + 1] - first}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "offsets" or value is None:
                continue
            out[f.name] = (value[first:last] if f.name in SEQUENCE_FIELDS else value[start:stop]).clone()
        return GemBatch(**out)

    def select(self, rows: np.ndarray | torch.Tensor) -> GemBatch:
        """The sub-batch of ``rows`` (an index array), histories included."""
        rows_t = torch.as_tensor(np.asarray(rows), dtype=torch.int64, device=self.offsets.device)
        token_index, offsets = gather_index(self.offsets, rows_t)
        out: dict[str, Any] = {"offsets": offsets}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "offsets" or value is None:
                continue
            out[f.name] = value[token_index] if f.name in SEQUENCE_FIELDS else value[rows_t]
        return GemBatch(**out)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal everywhere (broadcasting), NaN equal to NaN: whether two histories hold the same tokens."""
    return bool(((a == b) | (a != a) & (b != b)).all())


def _np(column: pa.ChunkedArray | pa.Array, fill: int | float | None = None) -> np.ndarray:
    if fill is not None:
        column = pc.fill_null(column, fill)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    if pa.types.is_boolean(column.type):
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.asarray(column.to_numpy(zero_copy_only=False))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each pair, vectorised."""
    total = int(lengths.sum())
    out_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else np.zeros(0, np.int64)
    return np.repeat(starts - out_start, lengths) + np.arange(total, dtype=np.int64)


class HistoryIndex:
    """A ``history``-layout table flattened to numpy once, for fast prefix cuts.

    ``events[k]`` columns are flat arrays over all users; user row ``r`` owns
    ``[offsets[r], offsets[r+1])``, ordered oldest to newest.
    """

    def __init__(self, histories: pa.Table) -> None:
        events = histories.column("events").combine_chunks()
        lengths = _np(pc.list_value_length(events), 0).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = events.flatten()
        self.columns: dict[str, np.ndarray] = {
            "item_id": _np(flat.field("item_id"), -1).astype(np.int64),
            "advertiser_id": _np(flat.field("advertiser_id"), -1).astype(np.int64),
            "category": _np(flat.field("item_category"), -1).astype(np.int64),
            "is_ad": _np(flat.field("is_ad"), False).astype(np.int64),
            "surface": _np(flat.field("surface"), -1).astype(np.int64),
            "event_type": _np(flat.field("event_type"), 0).astype(np.int64),
            "value": _np(flat.field("value"), float("nan")).astype(np.float32),
        }
        self.event_time = _np(flat.field("event_time")).astype(np.int64)
        self.user_ids = _np(histories.column("user_id")).astype(np.int64)
        self.num_events_total = _np(histories.column("num_events_total")).astype(np.int64)
        summary = histories.column("summary").combine_chunks()
        evicted = _np(pc.list_flatten(summary.field("event_type_counts")), 0).astype(np.int64)
        self.evicted_type_counts = evicted.reshape(len(self.user_ids), len(EVENT_TYPES))
        self._order = np.argsort(self.user_ids, kind="stable")
        self._sorted_ids = self.user_ids[self._order]

    @property
    def num_events(self) -> int:
        return int(self.offsets[-1])

    def rows_of(self, user_ids: np.ndarray) -> np.ndarray:
        """History row of each user id, -1 where the user has no history."""
        user_ids = np.asarray(user_ids, dtype=np.int64)
        if len(self._sorted_ids) == 0:
            return np.full(len(user_ids), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted_ids, user_ids), len(self._sorted_ids) - 1)
        return np.where(self._sorted_ids[pos] == user_ids, self._order[pos], -1)

    @cached_property
    def _time_keys(self) -> tuple[np.ndarray, int]:
        base = int(self.event_time.min()) if self.num_events else 0
        event_rows = np.repeat(np.arange(len(self.offsets) - 1, dtype=np.int64), np.diff(self.offsets))
        return (event_rows << _TIME_BITS) + (self.event_time - base), base

    def ends_before(self, rows: np.ndarray, request_ms: np.ndarray) -> np.ndarray:
        """Per row, the number of stored events strictly before ``request_ms`` (0 for row -1).

        One ``searchsorted`` over a joint (row, time) key: events are sorted by row and,
        within a row, by time.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if self.num_events == 0:
            return np.zeros(len(rows), dtype=np.int64)
        keys, base = self._time_keys
        query = np.clip(np.asarray(request_ms, dtype=np.int64) - base, 0, (1 << _TIME_BITS) - 1)
        pos = np.searchsorted(keys, (np.maximum(rows, 0) << _TIME_BITS) + query, side="left")
        return np.where(rows >= 0, pos - self.offsets[np.maximum(rows, 0)], 0)

    @cached_property
    def _type_cumsum(self) -> np.ndarray:
        """``(N+1, E) int32``: running count of each event type over the flat events."""
        one_hot = np.zeros((self.num_events + 1, len(EVENT_TYPES)), dtype=np.int32)
        types = self.columns["event_type"]
        ok = (types >= 0) & (types < len(EVENT_TYPES))
        one_hot[1:][np.flatnonzero(ok), types[ok]] = 1
        return np.cumsum(one_hot, axis=0, dtype=np.int32)

    def prefix_counts(self, rows: np.ndarray, ends: np.ndarray, request_ms: np.ndarray) -> np.ndarray:
        """``(B, NUM_COUNT_FEATURES) float32`` for ``events[:end]`` of each row (see COUNT_FEATURES)."""
        return count_features(*self.prefix_totals(rows, ends), request_ms)

    def prefix_totals(self, rows: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What :meth:`prefix_counts` reads of ``events[:end]``, before the request time enters:
        ``per_type (B, len(EVENT_TYPES)+1) float64`` (each type's count, then their sum) and
        ``last_ms (B,) int64`` (the last event's time, NULL_LAST_MS for an empty prefix).

        Evicted events count only when the prefix is non-empty: they are all older than
        every stored event, so then (and only then) they all precede the request.
        """
        safe = np.maximum(rows, 0)
        start = self.offsets[safe]
        end = start + np.where(rows >= 0, ends, 0)
        per_type = (self._type_cumsum[end] - self._type_cumsum[start]).astype(np.float64)
        per_type += np.where((end > start)[:, None], self.evicted_type_counts[safe], 0)
        last = np.where(end > start, self.event_time[np.maximum(end - 1, 0)], NULL_LAST_MS)
        return np.concatenate([per_type, per_type.sum(axis=1, keepdims=True)], axis=1), last.astype(np.int64)

    def batch(
        self,
        rows: np.ndarray,
        ends: np.ndarray,
        request_ms: np.ndarray,
        max_len: int,
        row_fields: dict[str, np.ndarray],
    ) -> GemBatch:
        """Cut ``events[max(0, end - max_len):end]`` of history ``rows`` (-1 = none).

        ``row_fields`` holds the (B,) arrays of :class:`GemBatch`'s row fields other
        than ``request_time_ms``; labels may be absent.
        """
        rows = np.asarray(rows, dtype=np.int64)
        ends = np.where(rows >= 0, np.asarray(ends, dtype=np.int64), 0)
        stored = np.where(rows >= 0, self.offsets[rows + 1] - self.offsets[np.maximum(rows, 0)], 0)
        if np.any(ends > stored) or np.any(ends < 0):
            bad = int(np.flatnonzero((ends > stored) | (ends < 0))[0])
            raise ValueError(
                f"history_end {ends[bad]} outside the {stored[bad]} stored events of "
                f"user row {rows[bad]}: examples and histories come from different snapshots"
            )
        starts = np.maximum(ends - max_len, 0)
        lengths = ends - starts
        index = _ranges(self.offsets[np.maximum(rows, 0)] + starts, lengths)
        request_ms = np.asarray(request_ms, dtype=np.int64)
        age = (np.repeat(request_ms, lengths) - self.event_time[index]).astype(np.float32) / 1000.0
        seq = {name: torch.from_numpy(np.ascontiguousarray(col[index])) for name, col in self.columns.items()}
        seq["age_s"] = torch.from_numpy(np.maximum(age, 0.0))
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        per_row = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in row_fields.items()}
        per_row["request_time_ms"] = torch.from_numpy(request_ms.copy())
        per_row["counts"] = torch.from_numpy(self.prefix_counts(rows, ends, request_ms))
        return GemBatch(offsets=offsets, **seq, **per_row)


def count_features(per_type: np.ndarray, last_ms: np.ndarray, request_ms: np.ndarray | int) -> np.ndarray:
    """The ``(B, NUM_COUNT_FEATURES) float32`` count features from :meth:`HistoryIndex.prefix_totals`
    and the request time (seconds since the last event; -1, clipped to 0, without one)."""
    empty = np.asarray(last_ms) == NULL_LAST_MS
    seconds = np.maximum(np.asarray(request_ms) - np.where(empty, request_ms, last_ms), 0) / 1000.0
    dense = np.concatenate([per_type, np.where(empty, -1.0, seconds)[:, None]], axis=1)
    return np.log1p(np.maximum(dense, 0.0)).astype(np.float32)


def _index(histories: pa.Table | HistoryIndex) -> HistoryIndex:
    return histories if isinstance(histories, HistoryIndex) else HistoryIndex(histories)


def _targets(
    item: np.ndarray, advertiser: np.ndarray, category: np.ndarray, is_ad: np.ndarray
) -> dict[str, np.ndarray]:
    return {
        "target_item": item.astype(np.int64),
        "target_advertiser": advertiser.astype(np.int64),
        "target_category": category.astype(np.int64),
        "target_is_ad": is_ad.astype(np.int64),
    }


class ExampleSet:
    """``training_example`` rows as numpy arrays, ready to be cut into batches.

    ``ExampleSet(index, examples).batch(rows, max_len)`` gives the :class:`GemBatch`
    of those example rows: each sees ``events[max(0, end - max_len):end]`` of its
    user's history, ``end`` = ``history_end`` (from the same snapshot), and carries
    its labels.
    """

    def __init__(self, histories: pa.Table | HistoryIndex, examples: pa.Table) -> None:
        self.index = _index(histories)
        user_ids = _np(examples.column("user_id")).astype(np.int64)
        self.rows = self.index.rows_of(user_ids)
        self.ends = _np(examples.column("history_end")).astype(np.int64)
        self.request_ms = _np(examples.column("event_time")).astype(np.int64)
        self.fields = {
            "user_id": user_ids,
            "request_surface": _np(examples.column("surface"), -1).astype(np.int64),
            "device": _np(examples.column("device"), -1).astype(np.int64),
            "history_length": _np(examples.column("history_length"), 0).astype(np.int64),
            **_targets(
                _np(examples.column("item_id")),
                _np(examples.column("advertiser_id"), -1),
                _np(examples.column("item_category"), -1),
                _np(examples.column("is_ad"), False),
            ),
            "clicked": _np(examples.column("clicked")).astype(np.float32),
            "converted": _np(examples.column("converted")).astype(np.float32),
        }

    def __len__(self) -> int:
        return len(self.rows)

    def prefix_lengths(self, max_len: int) -> np.ndarray:
        """``(N,)`` tokens each example's model input holds."""
        return np.minimum(np.where(self.rows >= 0, self.ends, 0), max_len)

    def batch(self, rows: np.ndarray | None = None, *, max_len: int) -> GemBatch:
        take = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        return self.index.batch(
            self.rows[take],
            self.ends[take],
            self.request_ms[take],
            max_len,
            {k: v[take] for k, v in self.fields.items()},
        )


def build_example_batch(histories: pa.Table | HistoryIndex, examples: pa.Table, *, max_len: int) -> GemBatch:
    """All rows of a ``training_example`` table as one batch (see :class:`ExampleSet`)."""
    return ExampleSet(histories, examples).batch(max_len=max_len)


def ad_catalog(histories: pa.Table | HistoryIndex) -> pa.Table:
    """``(item_id, advertiser_id, item_category)`` of every ad seen in the histories, one row per ad."""
    index = _index(histories)
    cols = index.columns
    ads = cols["is_ad"] == 1
    unique = np.unique(cols["item_id"][ads], return_index=True)
    items, first = np.asarray(unique[0]), np.asarray(unique[1])
    return pa.table(
        {
            "item_id": items,
            "advertiser_id": cols["advertiser_id"][ads][first],
            "item_category": cols["category"][ads][first].astype(np.int32),
        }
    )


@dataclass(frozen=True)
class AdLookup:
    """An ad catalog (see :func:`ad_catalog`) prepared once for many lookups: ``items`` (A,) sorted,
    ``advertiser`` and ``category`` (A,) int64 (-1 = null) in that order."""

    items: np.ndarray
    advertiser: np.ndarray
    category: np.ndarray

    @classmethod
    def from_table(cls, catalog: pa.Table | None) -> AdLookup:
        if catalog is None or catalog.num_rows == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        items = _np(catalog.column("item_id")).astype(np.int64)
        order = np.argsort(items, kind="stable")
        adv = _np(catalog.column("advertiser_id"), -1).astype(np.int64)[order]
        return cls(items[order], adv, _np(catalog.column("item_category"), -1).astype(np.int64)[order])

    def __call__(self, ad_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(advertiser, category) of each ad id; -1 where the catalog does not know it."""
        if len(self.items) == 0:
            return np.full(len(ad_ids), -1, np.int64), np.full(len(ad_ids), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.items, ad_ids), len(self.items) - 1)
        hit = self.items[pos] == ad_ids
        return np.where(hit, self.advertiser[pos], -1), np.where(hit, self.category[pos], -1)


def lookup_ads(catalog: pa.Table | AdLookup | None, ad_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(advertiser, category) of each ad id; -1 where the catalog does not know it."""
    return (catalog if isinstance(catalog, AdLookup) else AdLookup.from_table(catalog))(ad_ids)


def _no_histories() -> HistoryIndex:
    """An index with one one-event history of user -1 (no real id): lookups of row 0 and event 0 under a
    ``rows >= 0`` mask stay in bounds, and no candidate's user is found in it."""
    from pipelines.schemas.layouts import HISTORY

    row = {"user_id": -1, "events": [{"item_id": -1, "event_time": 0}], "num_events_total": 1}
    return HistoryIndex(pa.Table.from_pylist([row], HISTORY.schema))


def _evicted(index: HistoryIndex, rows: np.ndarray) -> np.ndarray:
    """Events folded out of each row's stored history (0 for a user without one: ``rows`` -1)."""
    safe = np.maximum(rows, 0)
    stored = index.offsets[safe + 1] - index.offsets[safe]
    return np.where(rows >= 0, index.num_events_total[safe] - stored, 0)


def build_candidate_batch(
    histories: pa.Table | HistoryIndex, candidates: pa.Table, *, max_len: int, catalog: pa.Table | None = None
) -> GemBatch:
    """One row per (request, ad) of a ``candidates`` table, request-major, ads in list order.

    Each row sees the user's stored events strictly before ``request_time`` (the most
    recent ``max_len``); a user without history gets an empty prefix. ``catalog``
    (see :func:`ad_catalog`) supplies each ad's advertiser and category; unknown ads
    get null ones. Devices are unknown at this stage (null).
    """
    index = _index(histories)
    if len(index.user_ids) == 0:  # a shard without a history file: every user starts from nothing
        index = _no_histories()
    counts = _np(pc.list_value_length(candidates.column("ad_ids")), 0).astype(np.int64)
    ad_ids = _np(pc.list_flatten(candidates.column("ad_ids"))).astype(np.int64)
    user_ids = np.repeat(_np(candidates.column("user_id")).astype(np.int64), counts)
    request_ms = np.repeat(_np(candidates.column("request_time")).astype(np.int64), counts)
    rows = index.rows_of(user_ids)
    ends = index.ends_before(rows, request_ms)
    advertiser, category = lookup_ads(catalog, ad_ids)
    fields_ = {
        "user_id": user_ids,
        "request_surface": np.repeat(_np(candidates.column("surface"), -1).astype(np.int64), counts),
        "device": np.full(len(ad_ids), -1, np.int64),
        "history_length": _evicted(index, rows) + ends,
        **_targets(ad_ids, advertiser, category, np.ones(len(ad_ids), np.int64)),
    }
    return index.batch(rows, ends, request_ms, max_len, fields_)


def build_user_batch(histories: pa.Table | HistoryIndex, *, max_len: int, surface: int = -1) -> GemBatch:
    """One user-level row per history row: the most recent ``max_len`` events, no target ad,
    as of just after the user's last event."""
    index = _index(histories)
    rows = np.arange(len(index.user_ids), dtype=np.int64)
    ends = np.diff(index.offsets)
    last = np.where(ends > 0, index.event_time[np.maximum(index.offsets[1:] - 1, 0)], 0)
    none = np.full(len(rows), -1, np.int64)
    fields_ = {
        "user_id": index.user_ids.copy(),
        "request_surface": np.full(len(rows), surface, np.int64),
        "device": none,
        "history_length": index.num_events_total.copy(),
        **_targets(none, none, none, np.zeros(len(rows), np.int64)),
    }
    return index.batch(rows, ends, last + 1, max_len, fields_)
