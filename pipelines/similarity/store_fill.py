"""Writing representations made in memory to an online store (evaluation, benchmarks, demos)."""

from __future__ import annotations

import numpy as np

from pipelines.store import NULL_MS, OnlineStore, RepresentationArrays

__all__ = ["StoreWriter"]

BATCH = 10_000


class StoreWriter:
    """Write user-level and pair representations of one ``model_version``, aged ``age_s`` before ``now_s``."""

    def __init__(self, store: OnlineStore, model_version: str, now_s: float) -> None:
        self.store, self.model_version, self.now_s = store, model_version, now_s

    def users(self, user_ids: np.ndarray, vectors: np.ndarray, age_s: float) -> int:
        """User-level rows ``(N,)``, ``(N, D)``."""
        n = len(user_ids)
        return self._write(user_ids, np.zeros(n, np.int64), np.zeros(n, bool), vectors, np.zeros(n, np.float32), age_s)

    def pairs(
        self,
        user_ids: np.ndarray,
        ad_ids: np.ndarray,
        vectors: np.ndarray,
        click_logit: np.ndarray,
        age_s: float | np.ndarray,
    ) -> int:
        """Pair rows ``(N,)`` ``(N,)`` ``(N, D)``, with the click probability from ``click_logit (N,)``."""
        p_click = (1.0 / (1.0 + np.exp(-np.asarray(click_logit, np.float64)))).astype(np.float32)
        return self._write(user_ids, ad_ids, np.ones(len(user_ids), bool), vectors, p_click, age_s)

    def _write(
        self,
        user_ids: np.ndarray,
        ad_ids: np.ndarray,
        has_ad: np.ndarray,
        vectors: np.ndarray,
        p_click: np.ndarray,
        age_s: float | np.ndarray,
    ) -> int:
        n = len(user_ids)
        computed = np.broadcast_to(np.asarray((self.now_s - np.asarray(age_s)) * 1000, np.int64), (n,))
        written = 0
        for s in range(0, n, BATCH):
            e = min(s + BATCH, n)
            written += self.store.write_batch(
                RepresentationArrays(
                    user_id=np.asarray(user_ids[s:e], np.int64),
                    ad_id=np.asarray(ad_ids[s:e], np.int64),
                    has_ad=has_ad[s:e],
                    embedding=np.asarray(vectors[s:e], np.float32),
                    p_click=p_click[s:e],
                    p_conversion=np.zeros(e - s, np.float32),
                    model_version=np.full(e - s, self.model_version, dtype=object),
                    computed_at_ms=np.ascontiguousarray(computed[s:e]),
                    history_watermark_ms=np.full(e - s, NULL_MS),
                )
            ).written
        return written
