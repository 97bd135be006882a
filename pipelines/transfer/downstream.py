"""A downstream ranker the size of a live one: an MLP over the non-sequence features and a
pooled window of the user's last 32 events, optionally fed representation features and a
sequence of historical representations (LoopFM: pooled, or attended from the candidate ad),
trained on hard labels and optionally on a teacher's soft labels (distillation).

Inputs are cut once per example set (:func:`ranker_inputs`) from the same point-in-time
prefixes the GEM model reads (``events[:history_end]``), so every variant sees identical rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.model.context import WINDOW, last_events
from pipelines.model.embed import hash_ids
from pipelines.model.inputs import ExampleSet, GemBatch

__all__ = [
    "SEQ_MODES",
    "Distill",
    "DownstreamRanker",
    "RankerConfig",
    "RankerInputs",
    "RepAdapter",
    "fit_adapter",
    "fit_ranker",
    "inputs_from_batch",
    "predict_adapted",
    "predict_ranker",
    "ranker_inputs",
    "row_features",
]

#: Hash buckets of each categorical field: (item, advertiser, category, surface, device, event type).
BUCKETS = {"item": 4096, "advertiser": 1024, "category": 256, "surface": 16, "device": 4, "event_type": 16}
_SALTS = {"item": 11, "advertiser": 13, "category": 17}
#: How the ranker reads a sequence of historical representations: ``attention`` from the candidate
#: ad (its item, advertiser and category embeddings form the query), or a masked mean (``pool``).
SEQ_MODES = ("attention", "pool")


@dataclass(frozen=True)
class RankerInputs:
    """N examples: ``ids (N, 6) int64`` (target item, advertiser, category, request surface, device,
    is_ad), ``dense (N, F) float32`` (count features, matches of the target in the window),
    ``window (N, W, 4) int64`` (category, event type, surface, item of the last W events, -1 =
    padding), ``labels (N,) float32``."""

    ids: np.ndarray
    dense: np.ndarray
    window: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def shared_window(self) -> bool:
        """One window for every row (the candidates of one request read the same user's events)."""
        return self.window.shape[0] == 1 and len(self.labels) != 1


def _hash(values: torch.Tensor, field: str) -> torch.Tensor:
    """Bucket 0 for null (-1) values; hashed ids, or small codes shifted by one, otherwise."""
    if field in _SALTS:
        return hash_ids(values, _SALTS[field], BUCKETS[field])
    return torch.where(values < 0, torch.zeros_like(values), (values + 1).clamp(max=BUCKETS[field] - 1))


def ranker_inputs(examples: ExampleSet, task: str, window: int = WINDOW) -> RankerInputs:
    """Cut every example's last ``window`` events (before the impression) and its row features."""
    return inputs_from_batch(examples.batch(max_len=window), examples.fields[task].astype(np.float32), window)


def inputs_from_batch(b: GemBatch, labels: np.ndarray | None = None, window: int = WINDOW) -> RankerInputs:
    """The ranker's inputs from a model batch cut with ``max_len=window`` (training examples, or the
    rows of a live request from :func:`pipelines.model.inputs.build_candidate_batch`)."""
    seq, valid = last_events(b, window)
    ids, dense = row_features(
        seq,
        valid,
        torch.stack(
            [b.target_item, b.target_advertiser, b.target_category, b.request_surface, b.device, b.target_is_ad], 1
        ),
        b.counts,
    )
    y = np.zeros(b.num_rows, np.float32) if labels is None else np.asarray(labels, np.float32)
    return RankerInputs(ids, dense, seq.numpy(), y)


def row_features(
    seq: torch.Tensor, valid: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids (N, 6) int64, dense (N, F) float32)`` of N rows from their window ``seq (N|1, W, 4)``
    (``valid (N|1, W)`` marks events), their ids (target item, advertiser, category, request
    surface, device, is_ad) and count features ``counts (N, C)``: dense = the counts, then log1p of
    the target item's and category's matches in the window. One window may serve every row."""
    same = [
        ((seq[:, :, 3] == ids[:, 0, None]) & valid).float().sum(1),
        ((seq[:, :, 0] == ids[:, 2, None]) & valid & (ids[:, 2, None] >= 0)).float().sum(1),
    ]
    dense = torch.cat([counts, torch.log1p(torch.stack(same, 1))], 1)
    return ids.numpy(), dense.numpy().astype(np.float32)


@dataclass(frozen=True)
class RankerConfig:
    """Width of the ranker and its training budget."""

    embed_dim: int = 8
    hidden: tuple[int, ...] = (128, 64)
    epochs: int = 4
    batch_size: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    seq_mode: str = "attention"

    def __post_init__(self) -> None:
        if self.embed_dim < 1 or self.epochs < 1 or self.batch_size < 1 or not self.hidden:
            raise ValueError(f"RankerConfig: sizes must be positive, got {self}")
        if self.seq_mode not in SEQ_MODES:
            raise ValueError(f"RankerConfig: seq_mode must be one of {SEQ_MODES}, got {self.seq_mode!r}")


class DownstreamRanker(nn.Module):
    """Embeddings of the target ad and context, a mean-pooled window of the last events, dense
    count features, (optionally) ``rep_dim`` representation features and (optionally) a sequence
    of ``seq_dim``-wide historical representations read as ``config.seq_mode`` says -> MLP -> one logit."""

    def __init__(self, config: RankerConfig, dense_dim: int, rep_dim: int = 0, seq_dim: int = 0) -> None:
        super().__init__()
        d = config.embed_dim
        self.fields = ("item", "advertiser", "category", "surface", "device")
        self.tables = nn.ModuleDict({f: nn.Embedding(BUCKETS[f], d) for f in self.fields})
        self.is_ad = nn.Embedding(2, d)
        self.window_tables = nn.ModuleDict(
            {f: nn.Embedding(BUCKETS[f], d) for f in ("category", "event_type", "surface", "item")}
        )
        self.rep_dim = rep_dim
        self.seq_dim = seq_dim
        self.seq_mode = config.seq_mode
        self.seq_query = nn.Linear(3 * d, seq_dim) if seq_dim and config.seq_mode == "attention" else None
        width = d * (len(self.fields) + 1) + d * 4 + dense_dim + rep_dim + seq_dim
        layers: list[nn.Module] = []
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.SiLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def read_sequence(self, seq: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``seq (N|1, L, R)`` (all-zero vectors are padding; one sequence may serve every row, as
        for the candidates of one request) -> ``(N, R)``: attention weights from the candidate
        ``target (N, 3d)`` (item, advertiser, category embeddings), or a masked mean."""
        valid = seq.abs().sum(-1) > 0
        if self.seq_query is None:
            weights = valid.float().expand(target.shape[0], -1)
        else:
            scores = (seq @ self.seq_query(target)[:, :, None])[:, :, 0] / math.sqrt(seq.shape[-1])
            weights = torch.softmax(scores.masked_fill(~valid, -1e9), dim=1) * valid
        weights = weights / weights.sum(1, keepdim=True).clamp_min(1e-9)
        return (weights[:, :, None] * seq).sum(1)

    def forward(
        self,
        ids: torch.Tensor,
        dense: torch.Tensor,
        window: torch.Tensor,
        rep: torch.Tensor | None,
        seq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        parts = [self.tables[f](_hash(ids[:, j], f)) for j, f in enumerate(self.fields)]
        parts.append(self.is_ad(ids[:, 5].clamp(0, 1)))
        valid = (window[:, :, 0] >= 0) | (window[:, :, 3] >= 0)
        denom = valid.float().sum(1, keepdim=True).clamp_min(1.0)
        for j, f in enumerate(("category", "event_type", "surface", "item")):
            emb = self.window_tables[f](_hash(window[:, :, j], f)) * valid[:, :, None]
            parts.append((emb.sum(1) / denom).expand(ids.shape[0], -1))
        parts.append(dense)
        if self.rep_dim:
            assert rep is not None, "this ranker was built for representation features"
            parts.append(rep)
        if self.seq_dim:
            assert seq is not None, "this ranker was built for a sequence of historical representations"
            parts.append(self.read_sequence(seq, torch.cat(parts[:3], 1)))
        return self.mlp(torch.cat(parts, 1))[:, 0]


@dataclass(frozen=True)
class Distill:
    """Soft labels ``teacher (N,)`` (the teacher's probabilities on the training rows), mixed into the
    loss with ``weight`` at ``temperature``: ``(1-w) BCE(y) + w T^2 BCE(sigmoid(z/T), sigmoid(logit(p)/T))``."""

    teacher: np.ndarray
    temperature: float = 1.0
    weight: float = 0.5


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def _tensors(
    x: RankerInputs, rows: np.ndarray, rep: np.ndarray | None, seq: np.ndarray | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One minibatch: ids, dense, window, and the representation block and sequence (None: absent)."""
    window = x.window if x.shared_window else x.window[rows]
    out = [torch.from_numpy(x.ids[rows]), torch.from_numpy(x.dense[rows]), torch.from_numpy(window)]
    r = torch.from_numpy(rep[rows]) if rep is not None else None
    shared_seq = seq is not None and seq.shape[0] == 1 and len(x) != 1
    s = None if seq is None else torch.from_numpy(seq if shared_seq else seq[rows])
    return out[0], out[1], out[2], r, s


def fit_ranker(
    x: RankerInputs,
    weights: np.ndarray,
    config: RankerConfig,
    *,
    rep: np.ndarray | None = None,
    seq: np.ndarray | None = None,
    distill: Distill | None = None,
    seed: int = 0,
    base_rate: float | None = None,
) -> DownstreamRanker:
    """Train a ranker on ``x`` (rows weighted by ``weights``, the inverse of their sampling rate),
    with representation features ``rep (N, F)`` and historical representations ``seq (N, L, R)``
    when given, and soft labels when ``distill``."""
    torch.manual_seed(seed)
    model = DownstreamRanker(
        config, x.dense.shape[1], 0 if rep is None else rep.shape[1], 0 if seq is None else seq.shape[2]
    )
    rate = float(np.average(x.labels, weights=weights)) if base_rate is None else base_rate
    last = model.mlp[-1]
    assert isinstance(last, nn.Linear)
    with torch.no_grad():
        last.bias.fill_(math.log(max(rate, 1e-6) / max(1 - rate, 1e-6)))
    soft = None
    if distill is not None:
        soft = torch.from_numpy((1 / (1 + np.exp(-_logit(distill.teacher) / distill.temperature))).astype(np.float32))
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    rng = np.random.default_rng(seed)
    w_all = torch.from_numpy((weights / weights.mean()).astype(np.float32))
    y_all = torch.from_numpy(x.labels)
    model.train()
    for _ in range(config.epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(order), config.batch_size):
            rows = order[start : start + config.batch_size]
            ids, dense, window, r, s = _tensors(x, rows, rep, seq)
            z = model(ids, dense, window, r, s)
            w = w_all[rows]
            loss = F.binary_cross_entropy_with_logits(z, y_all[rows], weight=w)
            if distill is not None and soft is not None:
                t = distill.temperature
                kd = F.binary_cross_entropy_with_logits(z / t, soft[rows], weight=w) * t * t
                loss = (1 - distill.weight) * loss + distill.weight * kd
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    return model


@torch.inference_mode()
def predict_ranker(
    model: DownstreamRanker, x: RankerInputs, rep: np.ndarray | None = None, seq: np.ndarray | None = None
) -> np.ndarray:
    """``(N,)`` probabilities."""
    out = []
    for start in range(0, len(x), 4096):
        rows = np.arange(start, min(start + 4096, len(x)))
        ids, dense, window, r, s = _tensors(x, rows, rep, seq)
        out.append(torch.sigmoid(model(ids, dense, window, r, s)).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


class RepAdapter(nn.Module):
    """A residual linear map on the representation features, ``rep + A rep`` (A starts at zero):
    trained on the newest labels with the ranker frozen, it re-aligns stale representations."""

    def __init__(self, rep_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(rep_dim, rep_dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, rep: torch.Tensor) -> torch.Tensor:
        return rep + self.linear(rep)


def fit_adapter(
    ranker: DownstreamRanker,
    x: RankerInputs,
    weights: np.ndarray,
    rep: np.ndarray,
    *,
    epochs: int = 4,
    batch_size: int = 256,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> RepAdapter:
    """Train a :class:`RepAdapter` in front of a frozen ``ranker`` on ``x`` with features ``rep``."""
    torch.manual_seed(seed)
    adapter = RepAdapter(rep.shape[1])
    for p in ranker.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(adapter.parameters(), lr=learning_rate, weight_decay=1e-4)
    rng = np.random.default_rng(seed)
    w_all = torch.from_numpy((weights / weights.mean()).astype(np.float32))
    y_all = torch.from_numpy(x.labels)
    try:
        for _ in range(epochs):
            order = rng.permutation(len(x))
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                ids, dense, window, r, _ = _tensors(x, rows, rep)
                assert r is not None
                z = ranker(ids, dense, window, adapter(r))
                loss = F.binary_cross_entropy_with_logits(z, y_all[rows], weight=w_all[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    finally:
        for p in ranker.parameters():
            p.requires_grad_(True)
    adapter.eval()
    return adapter


@torch.inference_mode()
def predict_adapted(ranker: DownstreamRanker, adapter: RepAdapter, x: RankerInputs, rep: np.ndarray) -> np.ndarray:
    """``(N,)`` probabilities of ``ranker`` reading ``adapter(rep)``."""
    out = []
    for start in range(0, len(x), 4096):
        rows = np.arange(start, min(start + 4096, len(x)))
        ids, dense, window, r, _ = _tensors(x, rows, rep)
        assert r is not None
        out.append(torch.sigmoid(ranker(ids, dense, window, adapter(r))).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)
