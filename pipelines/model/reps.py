"""The model's representations and click head at any chosen time, as the fallback evaluation, the
transfer stage's snapshots and the historical representations need them.

Pair representations are cut by the precompute stage's own batch builder
(``build_candidate_batch``: events strictly before the request time, device unknown),
one single-ad request per pair at any chosen time, so the evaluation can make fresh, day-old and neighbours'
representations of the same ad. The model's click head reads nothing but the pair
representation and the surface (``GemModel.heads``), so a fallback representation can be
fed to it in place of the exact one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from pipelines.model.embed import CATEGORY_SALT, hash_ids
from pipelines.model.gem import GemModel
from pipelines.model.inputs import GemBatch, HistoryIndex, build_candidate_batch

__all__ = ["PairQueries", "PairReps", "click_logits", "pair_reps", "user_ad_scores", "user_reps_at"]

CHUNK = 512


@dataclass(frozen=True)
class PairQueries:
    """N (user, ad) pairs to represent: ``user_id, ad_id, advertiser_id, category, surface (N,) int64``."""

    user_id: np.ndarray
    ad_id: np.ndarray
    advertiser_id: np.ndarray
    category: np.ndarray
    surface: np.ndarray

    def __len__(self) -> int:
        return len(self.user_id)

    def take(self, rows: np.ndarray) -> PairQueries:
        return PairQueries(
            self.user_id[rows], self.ad_id[rows], self.advertiser_id[rows], self.category[rows], self.surface[rows]
        )


@dataclass(frozen=True)
class PairReps:
    """``pair, user, ad (N, R) float32`` (``ad`` = the model's normalised ad vector), ``click_logit (N,)``."""

    pair: np.ndarray
    user: np.ndarray
    ad: np.ndarray
    click_logit: np.ndarray


def _batch(index: HistoryIndex, q: PairQueries, as_of_ms: np.ndarray, max_len: int, user_level: bool) -> GemBatch:
    """One single-ad candidate request per pair, cut by the precompute stage's own batch builder."""
    catalog = pa.table(
        {
            "item_id": pa.array(q.ad_id, pa.int64()),
            "advertiser_id": pa.array(q.advertiser_id, pa.int64(), mask=q.advertiser_id < 0),
            "item_category": pa.array(q.category, pa.int32(), mask=q.category < 0),
        }
    )
    surface = np.full(len(q), -1, np.int64) if user_level else q.surface
    requests = pa.table(
        {
            "user_id": pa.array(q.user_id, pa.int64()),
            "surface": pa.array(surface, pa.int8(), mask=surface < 0),
            "request_time": pa.array(np.asarray(as_of_ms, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
            "ad_ids": pa.ListArray.from_arrays(
                pa.array(np.arange(len(q) + 1, dtype=np.int32)), pa.array(np.maximum(q.ad_id, 0), pa.int64())
            ),
        }
    )
    return build_candidate_batch(index, requests, max_len=max_len, catalog=None if user_level else catalog)


@torch.inference_mode()
def pair_reps(
    model: GemModel,
    index: HistoryIndex,
    q: PairQueries,
    as_of_ms: np.ndarray,
    *,
    user_level: bool = False,
    chunk: int = CHUNK,
) -> PairReps:
    """Representations of ``q`` computed at ``as_of_ms (N,)`` (history strictly before it)."""
    device = next(model.parameters()).device
    parts: list[tuple[np.ndarray, ...]] = []
    as_of = np.broadcast_to(np.asarray(as_of_ms, np.int64), (len(q),))
    for start in range(0, len(q), chunk):
        rows = np.arange(start, min(start + chunk, len(q)))
        batch = _batch(index, q.take(rows), as_of[rows], model.config.max_len, user_level).to(device)
        out = model(batch)
        ad = model.ad_embedding(model.embed.target(batch))
        parts.append(
            tuple(t.float().cpu().numpy() for t in (out.pair_embedding, out.user_embedding, ad, out.click_logit))
        )
    r = model.config.representation_dim
    if not parts:
        empty = np.zeros((0, r), np.float32)
        return PairReps(empty, empty, empty, np.zeros(0, np.float32))
    pair_, user_, ad_, logit_ = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return PairReps(pair_, user_, ad_, logit_)


def user_reps_at(model: GemModel, index: HistoryIndex, as_of_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """``(user_ids (U,), user representations (U, R))`` of every user with a history, as of ``as_of_ms``."""
    users = index.user_ids.copy()
    none = np.full(len(users), -1, np.int64)
    q = PairQueries(users, none, none, none, none)
    return users, pair_reps(model, index, q, np.full(len(users), as_of_ms, np.int64), user_level=True).user


@torch.inference_mode()
def click_logits(model: GemModel, pair: np.ndarray, surface: np.ndarray) -> np.ndarray:
    """The model's click logit ``(N,)`` from pair representations ``(N, R)`` and surfaces ``(N,)``."""
    device = next(model.parameters()).device
    p = torch.as_tensor(np.array(pair, np.float32), device=device)
    s = torch.as_tensor(np.asarray(surface, np.int64), device=device)
    return model.heads(p, s)[0].float().cpu().numpy()


@torch.inference_mode()
def user_ad_scores(model: GemModel, user: np.ndarray, category: np.ndarray) -> np.ndarray:
    """``(N,)``: how a user-level representation ``(N, R)`` alone ranks ads, by the log-probability
    its interest head gives the ad's category ``(N,)`` (-1 = unknown: 0)."""
    device = next(model.parameters()).device
    log_p = model.interest_log_probs(torch.as_tensor(np.asarray(user, np.float32), device=device))
    cat = torch.as_tensor(np.asarray(category, np.int64), device=device)
    bucket = hash_ids(cat, CATEGORY_SALT, log_p.shape[1])
    scores = log_p.gather(1, bucket[:, None])[:, 0]
    return torch.where(cat < 0, torch.zeros_like(scores), scores).cpu().numpy()
