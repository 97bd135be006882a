"""Target-matched history counts: a hard search of the history for the target ad.

After SIM's "hard search" (Pi et al., 2020): the events of the history that share the
target's item, advertiser or category, counted per event type. Computed in the model
from the jagged history it reads (the last ``max_len`` events), so it is point-in-time
by construction and costs O(L). ``match_features(batch) -> (B, NUM_MATCH_FEATURES)``:
log1p of the per-(key, event type) counts, log1p of the per-key totals, and the log
share of the history each key matches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelines.model.inputs import GemBatch
from pipelines.schemas.enums import EVENT_TYPES

MATCH_KEYS = ("item", "advertiser", "category")
NUM_MATCH_FEATURES = len(MATCH_KEYS) * (len(EVENT_TYPES) + 2)


def match_features(batch: GemBatch) -> torch.Tensor:
    """``(B, NUM_MATCH_FEATURES) float32``; rows without a target (id -1) match nothing."""
    lengths = batch.lengths
    rows = lengths.numel()
    owner = torch.repeat_interleave(torch.arange(rows, device=lengths.device), lengths)
    pairs = (
        (batch.item_id, batch.target_item),
        (batch.advertiser_id, batch.target_advertiser),
        (batch.category, batch.target_category),
    )
    same = torch.stack([(seq == target[owner]) & (seq >= 0) for seq, target in pairs], dim=1).float()  # (L, 3)
    types = F.one_hot(batch.event_type.clamp(0, len(EVENT_TYPES) - 1), len(EVENT_TYPES)).float()  # (L, E)
    per_type = (same[:, :, None] * types[:, None, :]).flatten(1)  # (L, 3E)
    counts = same.new_zeros(rows, per_type.shape[1]).index_add(0, owner, per_type)
    totals = same.new_zeros(rows, len(MATCH_KEYS)).index_add(0, owner, same)
    share = torch.log((totals + 1) / (lengths[:, None].to(totals.dtype) + 1))
    return torch.cat([torch.log1p(counts), torch.log1p(totals), share], dim=1)
