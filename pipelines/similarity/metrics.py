"""Fallback quality metrics (pure numpy): cosine to the hidden representation, AUC gain kept, neighbours.

*Share of gain kept* of a fallback on a set of impressions:
``(AUC(fallback) - AUC(none)) / (AUC(exact) - AUC(none))``; 1.0 = as good as the exact
representation, 0.0 = no better than having none. Bootstrap intervals resample the
impressions (seeded).
"""

from __future__ import annotations

import numpy as np

from pipelines.model.train.metrics import auc

__all__ = ["cosine_rows", "gain_kept", "gain_table", "same_segment_share"]


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of ``a, b (N, D)``; NaN where a row is zero or NaN."""
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def gain_kept(auc_fallback: float, auc_exact: float, auc_none: float) -> float:
    """Share of the exact representation's AUC gain over none that the fallback keeps (NaN if no gain)."""
    gain = auc_exact - auc_none
    return float((auc_fallback - auc_none) / gain) if gain > 1e-9 else float("nan")


def gain_table(
    labels: np.ndarray,
    exact: np.ndarray,
    fallback: np.ndarray,
    none: np.ndarray,
    *,
    bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, float]:
    """AUCs of three score vectors ``(N,)`` on ``labels``, the share of gain kept and its 90% interval."""
    aucs = {name: auc(labels, s) for name, s in (("exact", exact), ("fallback", fallback), ("none", none))}
    out = {f"auc_{k}": v for k, v in aucs.items()}
    out["gain_kept"] = gain_kept(aucs["fallback"], aucs["exact"], aucs["none"])
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(bootstrap if len(labels) else 0):
        rows = rng.integers(0, len(labels), len(labels))
        draws.append(
            gain_kept(auc(labels[rows], fallback[rows]), auc(labels[rows], exact[rows]), auc(labels[rows], none[rows]))
        )
    finite = np.asarray([d for d in draws if np.isfinite(d)])
    out["gain_kept_p05"] = float(np.quantile(finite, 0.05)) if len(finite) else float("nan")
    out["gain_kept_p95"] = float(np.quantile(finite, 0.95)) if len(finite) else float("nan")
    out["count"] = len(labels)
    out["positives"] = int(np.sum(labels))
    return out


def same_segment_share(neighbor_segments: np.ndarray, own_segments: np.ndarray) -> float:
    """Share of valid neighbours (segment >= 0) in the user's own segment; ``(U, k)`` vs ``(U,)``."""
    valid = neighbor_segments >= 0
    same = (neighbor_segments == own_segments[:, None]) & valid
    return float(same.sum() / max(valid.sum(), 1))
