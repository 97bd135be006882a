"""Jagged model batches: concatenation, and the sizes the token-budget batcher uses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import torch

from pipelines.model.inputs import GemBatch


def batch_tokens(batch: GemBatch) -> int:
    """What one element costs the model: its history tokens, at least one per row."""
    return max(batch.num_tokens, batch.num_rows)


def approx_bytes(batch: GemBatch) -> int:
    """What a batch weighs in memory, roughly (for Beam's size metrics, without encoding it)."""
    return 40 * batch.num_tokens + 120 * batch.num_rows


def concat_batches(batches: Sequence[GemBatch]) -> GemBatch:
    """One :class:`GemBatch` holding every row of ``batches``, in order (no padding).

    ``offsets: (B+1,)`` are re-based onto the concatenated ``(L,)`` token arrays.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return batches[0]
    lengths = torch.cat([b.lengths for b in batches])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    merged: dict[str, torch.Tensor | None] = {"offsets": offsets}
    for f in fields(GemBatch):
        if f.name == "offsets":
            continue
        values = [getattr(b, f.name) for b in batches]
        merged[f.name] = None if any(v is None for v in values) else torch.cat(values)
    return GemBatch(**merged)  # type: ignore[arg-type]
