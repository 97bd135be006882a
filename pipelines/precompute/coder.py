"""A Beam coder for :class:`GemBatch`: a request's shared history once, numpy buffers, no torch pickling.

A request element repeats its user's history for every ad (one row per ad), so
pickling it copies the history once per ad, and torch tensors pickle slowly: at
the precompute bench's sizes, pickling the request elements costs a large share
of the time inference takes. This coder writes every
field as a numpy buffer (pickle protocol 5) and, when all rows read one history
(checked token by token), that history once; decoding tiles it back. Registered for ``GemBatch``, so typed
PCollections of them (and KV pairs) use it.
"""

from __future__ import annotations

import pickle
from dataclasses import fields
from typing import Any

import apache_beam as beam
import numpy as np
import torch

from pipelines.model.inputs import SEQUENCE_FIELDS, GemBatch, same_values
from pipelines.precompute.batching import approx_bytes

__all__ = ["GemBatchCoder", "register"]


def _numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().cpu().numpy()


def _one_history(batch: GemBatch) -> int | None:
    """The length of the history every row reads, when all rows read the same one (a request's
    ads: same user, time and length, and every token of every field equal); else None."""
    lengths, users, times = _numpy(batch.lengths), _numpy(batch.user_id), _numpy(batch.request_time_ms)
    if batch.num_rows < 2 or (lengths != lengths[0]).any() or (users != users[0]).any() or (times != times[0]).any():
        return None
    n = int(lengths[0])
    for name in SEQUENCE_FIELDS:
        rows = getattr(batch, name).reshape(batch.num_rows, n)
        if not same_values(rows, rows[:1]):
            return None
    return n


class GemBatchCoder(beam.coders.Coder):
    """Encodes a :class:`GemBatch`; when every row reads one history, that history is stored once."""

    def encode(self, value: GemBatch) -> bytes:
        shared = _one_history(value)
        parts: dict[str, Any] = {"shared_length": shared}
        for f in fields(GemBatch):
            tensor = getattr(value, f.name)  # None: labels of an inference batch
            array = None if tensor is None else _numpy(tensor)
            if array is not None and shared is not None and f.name in SEQUENCE_FIELDS:
                array = array[:shared]
            parts[f.name] = array
        return pickle.dumps(parts, protocol=5)

    def decode(self, encoded: bytes) -> GemBatch:
        parts = pickle.loads(encoded)
        shared = parts.pop("shared_length")
        rows = len(parts["offsets"]) - 1
        values: dict[str, Any] = {}
        for name, array in parts.items():
            if shared is not None and name in SEQUENCE_FIELDS:
                array = np.tile(array, rows)
            values[name] = None if array is None else torch.from_numpy(array)
        return GemBatch(**values)

    def estimate_size(self, value: GemBatch) -> int:
        return approx_bytes(value)  # Beam samples sizes for metrics: encoding to measure would double the cost

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> type:
        return GemBatch


def register() -> None:
    """Make Beam use :class:`GemBatchCoder` for every PCollection typed ``GemBatch``."""
    beam.coders.registry.register_coder(GemBatch, GemBatchCoder)


register()
