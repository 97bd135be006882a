"""The downstream ranker's inputs from a user's context (:mod:`pipelines.model.context`), kept next
to the user's representation.

The precompute step (``precompute --contexts``) or :func:`write_user_contexts` stores the context
as the user's context record (``OnlineStore.write_contexts``); a request reads it in the
representations' round trip (``read_for_request(..., with_context=True)``) and does per-ad work
only (:func:`context_inputs`): no history decoding.

Training and serving build identical inputs: :func:`request_inputs` (from the history index, as
of the request) goes through the same two functions, and the ranker's rows from
``inputs_from_batch`` equal them (tests). A context computed at ``at`` answers a request at
``t >= at`` exactly when the user had no event in ``[at, t)``; the seconds since the last event
are taken at ``t``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from pipelines.model.context import WINDOW, context_dtype, encode_contexts, user_contexts
from pipelines.model.inputs import AdLookup, HistoryIndex, count_features, lookup_ads
from pipelines.store import OnlineStore, WriteReport
from pipelines.transfer.downstream import RankerInputs, row_features

__all__ = ["context_inputs", "request_inputs", "write_user_contexts"]


def write_user_contexts(
    store: OnlineStore,
    index: HistoryIndex,
    user_ids: np.ndarray,
    at_ms: int,
    *,
    model_version: str,
    sequences: np.ndarray | None = None,
) -> WriteReport:
    """Compute the contexts of ``user_ids`` as of ``at_ms`` and store them (computed_at = ``at_ms``),
    each followed by its row of ``sequences (N, L, R)`` (historical representations) when given."""
    users = np.asarray(user_ids, np.int64)
    contexts = user_contexts(index, users, np.full(len(users), at_ms, np.int64))
    times = np.full(len(users), at_ms, np.int64)
    payloads = encode_contexts(contexts, sequences)
    return store.write_contexts(users, payloads, model_version=model_version, computed_at_ms=times)


def context_inputs(
    context: np.void | None, ad_ids: np.ndarray, catalog: pa.Table | AdLookup, *, surface: int, request_ms: int
) -> RankerInputs:
    """The ranker's inputs of one request: ``ad_ids`` (A,) for the user of ``context`` (None: a user
    without a stored context, read as one without events) on ``surface`` at ``request_ms``; a server
    passes the catalog prepared once (:class:`AdLookup`). The
    window is shared by the A rows (``window (1, W, 4)``); per ad: its ids and its matches in it."""
    if context is None:
        context = np.zeros(1, context_dtype())[0]
        context["window"] = -1
        context["last_ms"] = np.iinfo(np.int64).min
    ads = np.asarray(ad_ids, np.int64)
    a = len(ads)
    advertiser, category = lookup_ads(catalog, ads)
    request = np.array([surface, -1, 1], np.int64)  # request surface, device (unknown), is_ad
    ids = np.concatenate([np.stack([ads, advertiser, category], 1), np.broadcast_to(request, (a, 3))], 1)
    counts = count_features(context["totals"][None, :], np.array([context["last_ms"]]), request_ms)
    seq = torch.from_numpy(np.ascontiguousarray(context["window"])[None])
    valid = (seq[:, :, 0] >= 0) | (seq[:, :, 3] >= 0)
    ids_out, dense = row_features(seq, valid, torch.from_numpy(ids), torch.from_numpy(counts).expand(a, -1))
    return RankerInputs(ids_out, dense, seq.numpy(), np.zeros(a, np.float32))


def request_inputs(
    index: HistoryIndex, candidates: pa.Table, catalog: pa.Table | AdLookup, window: int = WINDOW
) -> RankerInputs:
    """The inputs of ONE candidate request (a one-row CANDIDATES table) from the history index: the
    user's context as of the request time, then :func:`context_inputs`, as serving does from the
    stored context."""
    if candidates.num_rows != 1:
        raise ValueError(f"request_inputs takes one request, got {candidates.num_rows}")
    user = int(candidates.column("user_id")[0].as_py())
    at_ms = int(candidates.column("request_time").cast(pa.int64())[0].as_py())
    surface = candidates.column("surface")[0].as_py()
    context = user_contexts(index, np.array([user]), np.array([at_ms]), window)[0]
    ads = np.asarray(candidates.column("ad_ids")[0].as_py(), np.int64)
    return context_inputs(context, ads, catalog, surface=-1 if surface is None else int(surface), request_ms=at_ms)
