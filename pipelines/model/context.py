"""A user's *context*: the non-sequence user side of a small ranker's inputs, kept with the user's
representation so that a request needs no history decoding.

As of a time ``at``: the last :data:`WINDOW` events before ``at`` (category, event type, surface,
item; -1 = padding) and the prefix totals the count features come from
(:meth:`HistoryIndex.prefix_totals`: each event type's count with evicted events, their sum, the
last event's time). The precompute step writes it as the user's context record
(``precompute --contexts``, ``OnlineStore.write_contexts``); the downstream ranker's inputs are
built from it by ``pipelines.transfer.context.context_inputs``.

A context record's payload is the context's bytes, optionally followed by the user's last L
historical representations (``(L, R)`` float16, :mod:`pipelines.model.rep_history`), so a ranker
that reads them gets them in the same round trip.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import torch

from pipelines.model.inputs import GemBatch, HistoryIndex, build_candidate_batch
from pipelines.schemas.enums import EVENT_TYPES

__all__ = [
    "WINDOW",
    "context_dtype",
    "decode_contexts",
    "decode_sequences",
    "encode_contexts",
    "last_events",
    "user_contexts",
]

#: Events in a context's window (the downstream ranker's pooled window).
WINDOW = 32
_WINDOW_FIELDS = ("category", "event_type", "surface", "item_id")


def last_events(b: GemBatch, window: int = WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seq (N, W, 4) int64, valid (N, W) bool)``: each row's last ``window`` events of a batch cut
    with ``max_len=window`` (category, event type, surface, item; -1 where ``valid`` is False)."""
    n = b.num_rows
    pos = torch.arange(window)[None, :]
    valid = pos < b.lengths[:, None]
    flat = (b.offsets[:-1, None] + pos).clamp(max=max(b.num_tokens - 1, 0))
    seq = torch.full((n, window, 4), -1, dtype=torch.int64)
    for j, name in enumerate(_WINDOW_FIELDS):
        if b.num_tokens:
            seq[:, :, j] = torch.where(valid, getattr(b, name)[flat], torch.full_like(flat, -1))
    return seq, valid


def context_dtype(window: int = WINDOW) -> np.dtype:
    """One user's context: ``window (W, 4) int64`` (-1 = padding), ``totals (T+1,) float64``
    (``HistoryIndex.prefix_totals``), ``last_ms int64`` (``NULL_LAST_MS`` without events)."""
    return np.dtype([("window", "<i8", (window, 4)), ("totals", "<f8", (len(EVENT_TYPES) + 1,)), ("last_ms", "<i8")])


def user_contexts(index: HistoryIndex, user_ids: np.ndarray, at_ms: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """``(N,)`` contexts of ``user_ids`` (N,) as of ``at_ms`` (N,) (events strictly before it)."""
    users = np.asarray(user_ids, np.int64)
    at = np.asarray(at_ms, np.int64)
    probe = pa.table(
        {
            "user_id": pa.array(users, pa.int64()),
            "surface": pa.nulls(len(users), pa.int8()),
            "request_time": pa.array(at, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "ad_ids": pa.array([[0]] * len(users), pa.list_(pa.int64())),
        }
    )
    out = np.zeros(len(users), dtype=context_dtype(window))
    out["window"] = last_events(build_candidate_batch(index, probe, max_len=window), window)[0].numpy()
    rows = index.rows_of(users)
    out["totals"], out["last_ms"] = index.prefix_totals(rows, index.ends_before(rows, at))
    return out


def encode_contexts(contexts: np.ndarray, sequences: np.ndarray | None = None) -> list[bytes]:
    """One payload per context (its dtype's bytes), each followed by its row of ``sequences``
    ``(N, L, R)`` (historical representations, stored as float16) when given."""
    if sequences is None:
        return [c.tobytes() for c in contexts]
    if len(sequences) != len(contexts):
        raise ValueError(f"{len(sequences)} sequences for {len(contexts)} contexts")
    halves = np.asarray(sequences, np.float16)
    return [c.tobytes() + s.tobytes() for c, s in zip(contexts, halves, strict=True)]


def _check_sizes(blobs: list[bytes], expected: int, window: int, what: str) -> None:
    if any(len(b) != expected for b in blobs):
        raise ValueError(
            f"context payloads of {sorted({len(b) for b in blobs})} bytes, expected {expected} ({what}, "
            f"window {window}); rewrite the contexts with this version's precompute --contexts"
        )


def decode_contexts(payloads: Iterable[bytes], window: int = WINDOW, sequence: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Inverse of :func:`encode_contexts` for the contexts; ``sequence = (L, R)`` the shape of the
    representations that follow each (none by default). Raises ValueError on another layout."""
    dtype = context_dtype(window)
    blobs = list(payloads)
    tail = 2 * sequence[0] * sequence[1]
    _check_sizes(blobs, dtype.itemsize + tail, window, f"with a {sequence} sequence" if tail else "no sequence")
    return np.frombuffer(b"".join(b[: dtype.itemsize] for b in blobs), dtype=dtype).copy()


def decode_sequences(payloads: Iterable[bytes], length: int, dim: int, window: int = WINDOW) -> np.ndarray:
    """``(N, length, dim) float32``: the historical representations stored after each context."""
    head = context_dtype(window).itemsize
    blobs = list(payloads)
    _check_sizes(blobs, head + 2 * length * dim, window, f"with a ({length}, {dim}) sequence")
    halves = np.frombuffer(b"".join(b[head:] for b in blobs), dtype=np.float16)
    return halves.reshape(len(blobs), length, dim).astype(np.float32)
