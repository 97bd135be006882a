"""Candidate sets → validated per-request model inputs (pure, no Beam).

A *request element* is ``(request_id, GemBatch)``: the rows of one candidate set
(one per ad, request-major) and each row's history prefix strictly before the
request time. Invalid candidate rows become dead letters with a reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.io.deadletters import dead_letter_table
from pipelines.model.inputs import GemBatch, HistoryIndex, ad_catalog, build_candidate_batch, build_user_batch
from pipelines.schemas.enums import SURFACES
from pipelines.schemas.layouts import HISTORY

STAGE = "precompute"
MAX_ADS_PER_REQUEST = 10_000


@dataclass(frozen=True)
class CandidateCheck:
    """Valid candidate rows and dead letters for the others."""

    valid: pa.Table
    dead_letters: pa.Table


#: dead-letter reason code of a candidate row -> when it applies (the reference page is generated
#: from it); ``inference_error`` is given by the inference step (``transforms``).
REASONS: dict[str, str] = {
    "empty_candidates": "a candidate row with no `ad_ids`",
    "too_many_candidates": f"a candidate row with more than {MAX_ADS_PER_REQUEST:,} ads",
    "out_of_range": "a negative `user_id` or an unknown `surface` code",
    "missing_field": "no `request_time`",
    "inference_error": "a batch the model failed on (counted as `inference_failures`)",
}
#: the rules of :func:`_reasons`, in the order they are checked
_RULE_REASONS = ("empty_candidates", "too_many_candidates", "out_of_range", "missing_field")


def _reasons(candidates: pa.Table) -> np.ndarray:
    """Per row, the first rule it breaks ("" where valid); vectorised."""

    def column(name: str) -> np.ndarray:
        return np.asarray(pc.fill_null(candidates.column(name), -1).to_numpy(zero_copy_only=False))

    counts = np.asarray(
        pc.fill_null(pc.list_value_length(candidates.column("ad_ids")), -1).to_numpy(zero_copy_only=False)
    )
    users, surfaces = column("user_id"), column("surface")
    missing_time = np.asarray(candidates.column("request_time").is_null().to_numpy(zero_copy_only=False))
    return np.select(
        [
            counts <= 0,
            counts > MAX_ADS_PER_REQUEST,
            (users < 0) | (surfaces < 0) | (surfaces >= len(SURFACES)),
            missing_time,
        ],
        [np.array(r) for r in _RULE_REASONS],
        default=np.array(""),
    )


def check_candidates(candidates: pa.Table, source: str) -> CandidateCheck:
    """Split candidate rows into valid ones and dead letters (``source`` = ``file:row``)."""
    reasons = _reasons(candidates)
    valid = reasons == ""
    bad = np.flatnonzero(~valid)
    if bad.size == 0:
        return CandidateCheck(candidates, dead_letter_table(STAGE, []))
    rows = candidates.take(pa.array(bad)).to_pylist()  # rare: only rejected rows become JSON
    rejects = [
        (
            str(reasons[i]),
            f"candidate row rejected: {reasons[i]}",
            json.dumps(row, default=str).encode(),
            f"{source}:{i}",
        )
        for i, row in zip(bad, rows, strict=True)
    ]
    return CandidateCheck(candidates.filter(pa.array(valid)), dead_letter_table(STAGE, rejects))


def request_elements(
    index: HistoryIndex, candidates: pa.Table, *, max_len: int, catalog: pa.Table | None
) -> list[tuple[str, GemBatch]]:
    """One ``(request_id, GemBatch)`` per candidate row, rows in ad-list order."""
    if candidates.num_rows == 0:
        return []
    batch = build_candidate_batch(index, candidates, max_len=max_len, catalog=catalog)
    counts = pc.list_value_length(candidates.column("ad_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    ids = candidates.column("request_id").to_pylist()
    return [(rid, batch.slice(int(starts[i]), int(starts[i + 1]))) for i, rid in enumerate(ids)]


def user_elements(index: HistoryIndex, *, max_len: int, chunk: int = 256) -> list[tuple[str, GemBatch]]:
    """User-level rows (no target ad) for every user with a history, in chunks of ``chunk`` users."""
    if len(index.user_ids) == 0:
        return []
    batch = build_user_batch(index, max_len=max_len)
    n = batch.num_rows
    return [(f"users:{index.user_ids[s]}", batch.slice(s, min(s + chunk, n))) for s in range(0, n, chunk)]


def merge_catalogs(tables: Iterable[pa.Table]) -> pa.Table:
    """Ad catalogs (see :func:`pipelines.model.inputs.ad_catalog`) as one, one row per ad (the first
    table that knows an ad wins); an empty catalog for none."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return ad_catalog(HISTORY.schema.empty_table())
    merged = pa.concat_tables(tables)
    _, first = np.unique(merged.column("item_id").to_numpy(), return_index=True)
    return merged.take(pa.array(first))
