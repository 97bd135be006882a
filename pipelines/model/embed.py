"""Token embeddings: hashed ids, enum codes, log time-gap and value buckets.

Sequence tokens (one per history event) and non-sequence tokens (user, request
context, counts and the target ad) share the id tables, so an item looks the same
in the history and as the target.
"""

from __future__ import annotations

import torch
from torch import nn

from pipelines.model.config import GemConfig
from pipelines.model.inputs import NUM_COUNT_FEATURES, GemBatch

_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
CATEGORY_SALT = 0xCA7E60
_SALTS = {"item": 0x51ED27, "advertiser": 0xAD7E57, "category": CATEGORY_SALT, "user": 0x05E125}

#: Non-sequence tokens, in order: user, request surface, device, history count,
#: dense prefix counts; then target item, target advertiser, target category, target is_ad.
NUM_CONTEXT_TOKENS = 5
NUM_TARGET_TOKENS = 4


def hash_ids(ids: torch.Tensor, salt: int, size: int) -> torch.Tensor:
    """Non-negative ids -> buckets ``1 .. size-1``; negative (null) ids -> bucket 0.

    ``ids: (N,) int64`` -> ``(N,) int64``. Multiplicative hashing with wrap-around
    int64 arithmetic, identical on CPU and CUDA.
    """
    mixed = (ids ^ salt) * _MIX
    mixed = mixed ^ (mixed >> 29)
    return torch.where(ids < 0, torch.zeros_like(ids), 1 + torch.remainder(mixed, size - 1))


def log_buckets(x: torch.Tensor, scale: float, num: int) -> torch.Tensor:
    """``floor(scale * log2(1 + max(x, 0)))`` clamped to ``0 .. num-1``; ``x: (N,) float``."""
    return torch.clamp(torch.floor(scale * torch.log2(1.0 + x.clamp_min(0.0))), 0, num - 1).long()


def value_buckets(value: torch.Tensor, num: int) -> torch.Tensor:
    """Event values (NaN = null) -> buckets; null is bucket 0. ``value: (L,) float``."""
    present = ~torch.isnan(value)
    bucket = 1 + log_buckets(torch.nan_to_num(value, nan=0.0), 2.0, num - 1)
    return torch.where(present, bucket, torch.zeros_like(bucket))


def previous_gaps(age_s: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Seconds since the previous event of the same user, and whether one exists.

    ``age_s: (L,)`` (seconds before the request, non-increasing within a user),
    ``offsets: (B+1,)`` -> ``gap: (L,)``, ``has_previous: (L,) bool``.
    """
    positions = torch.arange(age_s.numel(), device=age_s.device)
    first = torch.zeros_like(positions, dtype=torch.bool)
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]
    first[starts] = True
    gap = torch.roll(age_s, 1) - age_s
    return torch.where(first, torch.zeros_like(gap), gap), ~first


class TokenEmbedder(nn.Module):
    """Turns a :class:`GemBatch` into tokens.

    ``sequence(batch) -> (L, D)``; ``context(batch) -> (B, 5, D)`` (user, surface,
    device, history count, dense prefix counts); ``target(batch) -> (B, 4, D)``
    (item, advertiser, category, is_ad).
    """

    def __init__(self, config: GemConfig) -> None:
        super().__init__()
        d, sizes = config.d_model, config.hash_sizes
        self.config = config
        self.item = nn.Embedding(sizes["item"], d)
        self.advertiser = nn.Embedding(sizes["advertiser"], d)
        self.category = nn.Embedding(sizes["category"], d)
        self.user = nn.Embedding(sizes["user"], d)
        self.is_ad = nn.Embedding(2, d)
        self.surface = nn.Embedding(config.num_surfaces + 1, d)  # + null
        self.event_type = nn.Embedding(config.num_event_types, d)
        self.device = nn.Embedding(config.num_devices + 1, d)  # + null
        self.age = nn.Embedding(config.time_buckets, d)
        self.gap = nn.Embedding(config.time_buckets + 1, d)  # + "first event"
        self.value = nn.Embedding(config.value_buckets, d)
        self.count = nn.Embedding(config.count_buckets, d)
        self.dense = nn.Linear(NUM_COUNT_FEATURES, d)
        self.seq_norm = nn.LayerNorm(d)
        self.ctx_norm = nn.LayerNorm(d)
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=d**-0.5)

    def _hashed(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        embedding: nn.Embedding = getattr(self, table)
        return embedding(hash_ids(ids, _SALTS[table], embedding.num_embeddings))

    def sequence_ids(self, batch: GemBatch) -> torch.Tensor:
        """The discrete inputs of each history token: ``(L, 9) int64`` of raw item, advertiser and
        category ids, is_ad, surface, event type, age bucket, gap bucket and value bucket. Two tokens
        with equal rows embed equally, so equal rows over a history mean an equal encoding."""
        cfg = self.config
        gap, has_prev = previous_gaps(batch.age_s, batch.offsets)
        gap_bucket = torch.where(
            has_prev, log_buckets(gap, 1.5, cfg.time_buckets), torch.full_like(gap, cfg.time_buckets, dtype=torch.long)
        )
        columns = [
            batch.item_id,
            batch.advertiser_id,
            batch.category,
            batch.is_ad,
            batch.surface.clamp(0, cfg.num_surfaces),
            batch.event_type.clamp(0, cfg.num_event_types - 1),
            log_buckets(batch.age_s, 1.5, cfg.time_buckets),
            gap_bucket,
            value_buckets(batch.value, cfg.value_buckets),
        ]
        return torch.stack([column.long() for column in columns], dim=1)

    def sequence(self, batch: GemBatch, ids: torch.Tensor | None = None) -> torch.Tensor:
        """``(L, D)`` history tokens, from ``ids`` (:meth:`sequence_ids` of ``batch``) when given."""
        ids = self.sequence_ids(batch) if ids is None else ids
        item, advertiser, category, is_ad, surface, event_type, age, gap, value = ids.unbind(1)
        tokens = (
            self._hashed("item", item)
            + self._hashed("advertiser", advertiser)
            + self._hashed("category", category)
            + self.is_ad(is_ad)
            + self.surface(surface)
            + self.event_type(event_type)
            + self.age(age)
            + self.gap(gap)
            + self.value(value)
        )
        return self.seq_norm(tokens)

    def context(self, batch: GemBatch) -> torch.Tensor:
        cfg = self.config
        surface = torch.where(batch.request_surface < 0, cfg.num_surfaces, batch.request_surface)
        device = torch.where(batch.device < 0, cfg.num_devices, batch.device)
        count = log_buckets(batch.history_length.float(), 1.5, cfg.count_buckets)
        tokens = [
            self._hashed("user", batch.user_id),
            self.surface(surface.clamp(0, cfg.num_surfaces)),
            self.device(device.clamp(0, cfg.num_devices)),
            self.count(count),
            self.dense(batch.counts),
        ]
        return self.ctx_norm(torch.stack(tokens, dim=1))

    def target(self, batch: GemBatch) -> torch.Tensor:
        tokens = [
            self._hashed("item", batch.target_item),
            self._hashed("advertiser", batch.target_advertiser),
            self._hashed("category", batch.target_category),
            self.is_ad(batch.target_is_ad),
        ]
        return self.ctx_norm(torch.stack(tokens, dim=1))
