"""Representations of freshly updated histories (pure): the streaming job's precompute step.

The streaming job hands each flush's touched histories here (every user whose
events it just merged, even when all were duplicates, so a replay after a crash
still refreshes them). :class:`Refresher` computes, with the trained model:

- each user's user-level representation, as of just after their last event;
- with :class:`RecentCandidates`, pair representations for the user's latest
  candidate set if it is recent (its request time within ``ttl`` of the user's
  last event), re-scored on the whole updated history.

:meth:`Refresher.pairs` is the stream graph's pairs step (:mod:`pipelines.streaming.pairs`):
pair representations of the candidate sets the ranking funnel hands over. With an
``encoding_cache``, a set whose user's history is unchanged since that user's last set
reuses the history's encoding (:mod:`pipelines.model.encoding`); only the per-ad work runs.

Rows carry ``history_watermark`` = the user's own last event time, so a reader
(and the freshness bench) can tell which events a representation has seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipelines.model.encoding import EncodingCache
from pipelines.model.gem import GemModel
from pipelines.model.inputs import GemBatch, HistoryIndex, ad_catalog, build_candidate_batch, build_user_batch
from pipelines.precompute.records import representation_table
from pipelines.precompute.requests import check_candidates, merge_catalogs
from pipelines.schemas.layouts import REPRESENTATION

__all__ = ["RecentCandidates", "Refresher", "token_chunks"]


def token_chunks(batch: GemBatch, budget: int) -> Iterator[GemBatch]:
    """``batch`` cut into consecutive row ranges of at most ``budget`` history tokens each
    (a row longer than the budget goes alone)."""
    if batch.num_rows == 0:
        return
    lengths = np.maximum(batch.lengths.numpy(), 1)
    start, used = 0, 0
    for row, n in enumerate(lengths.tolist()):
        if row > start and used + n > budget:
            yield batch.slice(start, row)
            start, used = row, 0
        used += n
    yield batch.slice(start, batch.num_rows)


@dataclass(frozen=True)
class RecentCandidates:
    """Each user's latest valid candidate set (CANDIDATES rows, one per user, sorted by user)."""

    latest: pa.Table
    ttl_ms: int

    @classmethod
    def from_table(cls, candidates: pa.Table, *, ttl_s: float, source: str = "candidates") -> RecentCandidates:
        """Keep, per user, the valid row with the latest request time (invalid rows are dropped:
        precompute's batch job gives them dead letters)."""
        valid = check_candidates(candidates, source).valid
        users = valid.column("user_id").to_numpy()
        times = valid.column("request_time").cast(pa.int64()).to_numpy()
        order = np.lexsort((times, users))
        last = np.r_[users[order][1:] != users[order][:-1], True] if len(order) else np.zeros(0, bool)
        return cls(valid.take(pa.array(order[last])), int(ttl_s * 1000))

    def for_users(self, user_ids: np.ndarray, last_event_ms: np.ndarray) -> pa.Table:
        """Candidate rows of ``user_ids`` whose request is at most ``ttl`` older than the user's last
        event, with the request time moved to just after that event (so the whole history is seen)."""
        known = self.latest.column("user_id").to_numpy()
        pos = np.minimum(np.searchsorted(known, user_ids), max(len(known) - 1, 0))
        hit = (known[pos] == user_ids) if len(known) else np.zeros(len(user_ids), bool)
        request_ms = self.latest.column("request_time").cast(pa.int64()).to_numpy()[pos]
        recent = hit & (request_ms >= last_event_ms - self.ttl_ms)
        rows = self.latest.take(pa.array(pos[recent]))
        now = np.maximum(request_ms[recent], last_event_ms[recent] + 1)
        return rows.set_column(
            rows.schema.get_field_index("request_time"),
            "request_time",
            pa.array(now).cast(rows.schema.field("request_time").type),
        )


class Refresher:
    """Updated histories → REPRESENTATION rows (user-level, plus recent candidates' pairs)."""

    def __init__(
        self,
        model: GemModel,
        model_version: str,
        *,
        candidates: RecentCandidates | None = None,
        token_budget: int = 32_768,
        catalog: pa.Table | None = None,
        encoding_cache: EncodingCache | None = None,
    ) -> None:
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        self._model, self._version = model, model_version
        #: User-side encodings kept for the next request of an unchanged history (None: none kept).
        self.encoding_cache = encoding_cache
        self._candidates, self._budget = candidates, token_budget
        # The ads known so far (advertiser and category of a candidate ad): ``catalog`` first, then
        # every ad the histories passed here hold.
        self._catalog = merge_catalogs([] if catalog is None else [catalog])

    def refresh(self, histories: pa.Table, *, computed_at_ms: int) -> pa.Table:
        """Representations of every history row of ``histories`` (HISTORY layout)."""
        if histories.num_rows == 0:
            return REPRESENTATION.schema.empty_table()
        index = HistoryIndex(histories)
        self._catalog = merge_catalogs([self._catalog, ad_catalog(index)])
        last_ms = histories.column("last_event_time").cast(pa.int64()).to_numpy()
        batches = [build_user_batch(index, max_len=self._model.config.max_len)]
        if self._candidates is not None:
            requests = self._candidates.for_users(index.user_ids, last_ms)
            if requests.num_rows:
                batches.append(
                    build_candidate_batch(index, requests, max_len=self._model.config.max_len, catalog=self._catalog)
                )
        return self._represent(batches, index, last_ms, computed_at_ms)

    def pairs(self, histories: pa.Table, requests: pa.Table, *, computed_at_ms: int) -> pa.Table:
        """Pair representations of ``requests`` (CANDIDATES rows; each sees the events strictly before
        its ``request_time``) on ``histories`` (HISTORY rows of the requests' users; a user without
        one gets an empty prefix). The rows of one request read one history, which the model encodes
        once (its shared-history path). ``history_watermark`` = the user's last event (0: none)."""
        if requests.num_rows == 0:
            return REPRESENTATION.schema.empty_table()
        index = HistoryIndex(histories)
        if histories.num_rows:
            self._catalog = merge_catalogs([self._catalog, ad_catalog(index)])
        last_ms = histories.column("last_event_time").cast(pa.int64()).to_numpy()
        batch = build_candidate_batch(index, requests, max_len=self._model.config.max_len, catalog=self._catalog)
        return self._represent([batch], index, last_ms, computed_at_ms)

    def _represent(
        self, batches: list[GemBatch], index: HistoryIndex, last_ms: np.ndarray, computed_at_ms: int
    ) -> pa.Table:
        tables = []
        for batch in batches:
            for chunk in token_chunks(batch, self._budget):
                reps = self._model.represent(chunk, self.encoding_cache)
                rows = index.rows_of(reps.user_id)
                tables.append(
                    representation_table(
                        reps,
                        model_version=self._version,
                        watermark_ms=np.where(rows >= 0, last_ms[np.maximum(rows, 0)] if len(last_ms) else 0, 0),
                        computed_at_ms=computed_at_ms,
                    )
                )
        return pa.concat_tables(tables) if tables else REPRESENTATION.schema.empty_table()
