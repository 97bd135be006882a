"""Candidate sets inside the streaming graph: pair representations next to the user's freshest state.

With ``stream --candidates-topic``, a second reader (:class:`ReadCandidateSetsFn`) reads
the ranking funnel's candidate sets (CANDIDATE_SET JSON) beside the events, keyed by
``user_id`` like them. Sets of the configured stage go to the same keyed step as the
events (:class:`pipelines.streaming.keyed.AppendUserHistoryFn`), where each meets its
user's keyed state: the flushed history plus the events still buffered, merged as the
next flush would. So no process holds every user's history: a set is answered where
its user's state lives. Unreadable sets become dead letters; sets of other stages are
acknowledged at once.

:class:`ComputePairs` (Beam's RunInference with :class:`PairsModelHandler`, the model
shared by a worker's threads) takes the (history row, candidate sets) pairs, batched
up to :data:`BATCH_TOKENS` tokens (each set's history length plus its ads), drops the
sets past their deadline (counted, never computed late), reads their pairs from the
store and skips those already fresh (:func:`pipelines.streaming.pair_work.plan_pairs`),
computes the rest (each set's history encoded once), writes them to the store, and only
then passes the sets' offsets on to be committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from pipelines.errors import ConfigError
from pipelines.io.shards import split_by
from pipelines.schemas.enums import FUNNEL_STAGE_CODE
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.metrics import PAIR_OUTCOMES, JobMetrics
from pipelines.streaming.pair_work import CandidateWork, past_deadline, plan_pairs, rank_tiers, split_by_deadline
from pipelines.streaming.refresh import AckAfterInference
from pipelines.streaming.state import OFFSET, PARTITION, offsets_by_partition

__all__ = [
    "BATCH_TOKENS",
    "PAIRS",
    "ComputePairs",
    "PairCounts",
    "PairsModelHandler",
    "answer_sets",
    "candidate_work",
    "count_late",
    "is_candidate_sets",
    "load_ad_catalog",
    "newest_rows",
    "write_pairs",
]

#: The keyed step's output of (the user's current HISTORY row, that user's candidate sets).
PAIRS = "pairs"
#: Tokens per call of the pairs' model handler: a set weighs its history's length plus its ads.
BATCH_TOKENS = 16_384
#: When the reader took a set (seconds since the epoch), beside ``_partition`` and ``_offset``.
RECEIVED = "_received"
_STAMP = "stage_time"


def is_candidate_sets(table: pa.Table) -> bool:
    """Whether a keyed table holds candidate sets (CANDIDATE_SET rows) rather than events."""
    return "request_id" in table.schema.names


def candidate_work(sets: pa.Table) -> list[CandidateWork]:
    """The keyed step's candidate-set rows (CANDIDATE_SET + ``_partition``, ``_offset``, ``_received``)
    as :class:`CandidateWork`."""
    columns = sets.to_pydict()
    stage = sets.column(_STAMP).cast(pa.int64()).to_pylist()
    needed = sets.column("needed_by").cast(pa.int64()).to_pylist()
    return [
        CandidateWork(
            partition=int(columns[PARTITION][i]),
            offset=int(columns[OFFSET][i]),
            request_id=columns["request_id"][i],
            user_id=int(columns["user_id"][i]),
            surface=int(columns["surface"][i]),
            stage_ms=stage[i],
            needed_by_ms=needed[i],
            ad_ids=np.asarray(columns["ad_ids"][i], np.int64),
            received_s=float(columns[RECEIVED][i]),
        )
        for i in range(sets.num_rows)
    ]


def newest_rows(rows: Sequence[pa.Table]) -> pa.Table:
    """HISTORY rows (0 or 1 each) as one table, one row per user: the one holding the most events
    (a user's later state only grows, and a capped one keeps its newest events' time)."""
    held = [r for r in rows if r.num_rows]
    if not held:
        from pipelines.schemas.layouts import HISTORY

        return HISTORY.schema.empty_table()
    table = pa.concat_tables(held)
    users = table.column("user_id").to_numpy()
    last = table.column("last_event_time").cast(pa.int64()).fill_null(0).to_numpy()
    count = table.column("num_events_total").to_numpy()
    order = np.lexsort((count, last, users))
    keep = np.r_[users[order][1:] != users[order][:-1], True]
    return table.take(pa.array(order[keep]))


def load_ad_catalog(path: str) -> pa.Table:
    """An ad catalog Parquet file (``item_id``, ``advertiser_id``, ``item_category``), as
    :func:`pipelines.model.inputs.ad_catalog` gives; a missing file or column is a ConfigError."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError("--ad-catalog", f"cannot read {path!r}: {exc}", "pass a Parquet ad catalog") from exc
    wanted = {"item_id": pa.int64(), "advertiser_id": pa.int64(), "item_category": pa.int32()}
    missing = sorted(set(wanted) - set(table.schema.names))
    if missing:
        raise ConfigError(
            "--ad-catalog",
            f"{path!r} lacks {', '.join(missing)}",
            "pass a table of item_id, advertiser_id, item_category",
        )
    return pa.table({name: table.column(name).cast(kind) for name, kind in wanted.items()})


@dataclass(frozen=True)
class PairCounts:
    """What became of a batch's pairs: ``computed`` and written, found ``fresh`` in the store, ``repeated``
    in the batch, or ``late``: not computed because their set passed its deadline between rank tiers; and
    the histories whose user-side encoding the cache ``reused`` or ``encoded``, with the ``tokens_saved``."""

    computed: int
    fresh: int
    repeated: int
    late: int = 0
    reused: int = 0
    encoded: int = 0
    tokens_saved: int = 0

    def record(self, metrics: JobMetrics) -> None:
        for outcome in PAIR_OUTCOMES:
            metrics.pairs.labels(metrics.pipeline, outcome).inc(getattr(self, outcome))
        metrics.user_encodings.labels(metrics.pipeline, "hit").inc(self.reused)
        metrics.user_encodings.labels(metrics.pipeline, "miss").inc(self.encoded)
        metrics.encoding_tokens_saved.labels(metrics.pipeline).inc(self.tokens_saved)


def answer_sets(
    work: list[CandidateWork], grace_ms: int, metrics: JobMetrics, write: Callable[[list[CandidateWork]], PairCounts]
) -> None:
    """A batch's sets answered: those past ``needed_by + grace_ms`` are dropped and counted; ``write``
    computes and writes the others' pairs (:func:`write_pairs`), recorded in ``metrics`` with the sets'
    stage time to written."""
    live, late = split_by_deadline(work, int(time.time() * 1000), grace_ms)
    count_late(metrics, len(late), sum(len(w.ad_ids) for w in late))
    if live:
        write(live).record(metrics)
        written_ms = time.time() * 1000
        metrics.fresh("candidate_to_pair", [(written_ms - w.stage_ms) / 1000 for w in live])


def count_late(metrics: JobMetrics, sets: int, pairs: int) -> None:
    """``sets`` candidate sets (``pairs`` pairs) dropped past their deadline, wherever the graph found them late."""
    if sets:
        metrics.deadline_dropped.labels(metrics.pipeline).inc(sets)
        metrics.pairs.labels(metrics.pipeline, "late").inc(pairs)


def write_pairs(
    refresher: Any,
    store: Any,
    model_version: str,
    histories: pa.Table,
    work: list[CandidateWork],
    max_age_s: float,
    grace_ms: int | None = None,
    clock: Callable[[], float] = time.time,
) -> PairCounts:
    """Compute and write the pairs of ``work`` (sets in time) that the store does not hold fresh, on
    ``histories`` (the sets' users' HISTORY rows).

    Sets go earliest deadline first, and their ads by rank tier (:func:`rank_tiers`: the best 64 of
    every set, then the next 64, then 128, ...), each tier written to the store as soon as it is
    computed, so the ads likeliest to reach the next stage are there first. With ``grace_ms``,
    before each tier the sets past ``needed_by + grace_ms`` are cut: their remaining pairs are
    ``late``, never computed after the deadline."""
    from pipelines.streaming.pair_work import pair_keys

    work = sorted(work, key=lambda w: w.needed_by_ms)
    users, ads = pair_keys(work)
    last = dict(
        zip(
            histories.column("user_id").to_pylist(),
            histories.column("last_event_time").cast(pa.int64()).fill_null(0).to_pylist(),
            strict=True,
        )
    )
    stored = store.read_arrays(users, ads, np.ones(len(users), bool), max_age_s=max_age_s)
    plan = plan_pairs(work, stored, last, model_version)
    cache = refresher.encoding_cache
    before = (0, 0, 0) if cache is None else (cache.hits, cache.misses, cache.tokens_saved)
    computed = late = 0
    for rows, tier in rank_tiers(plan.requests):
        now_ms = int(clock() * 1000)
        sizes = tier.column("ad_ids").combine_chunks().value_lengths().to_numpy()
        if grace_ms is not None:
            in_time = plan.needed_by_ms[rows] + grace_ms >= now_ms
            late += int(sizes[~in_time].sum())
            tier, sizes = tier.filter(pa.array(in_time)), sizes[in_time]
        if tier.num_rows:
            store.write_batch(refresher.pairs(histories, tier, computed_at_ms=now_ms))
            computed += int(sizes.sum())
    after = before if cache is None else (cache.hits, cache.misses, cache.tokens_saved)
    reused, encoded, saved = (a - b for a, b in zip(after, before, strict=True))
    return PairCounts(computed, plan.pairs_fresh, plan.pairs_repeated, late, reused, encoded, saved)


class PairWriting:
    """What RunInference loads once per worker process: the model's :class:`Refresher`, the store and
    the ad catalog, used by one thread at a time (the catalog grows; the store client is not thread-safe)."""

    def __init__(self, config: StreamConfig) -> None:
        import torch

        from pipelines.model.checkpoint import load_model
        from pipelines.model.encoding import EncodingCache
        from pipelines.precompute.refresh import Refresher
        from pipelines.store import open_store

        assert config.model is not None and config.store is not None  # StreamConfig checks both
        torch.set_num_threads(config.torch_threads)
        model = load_model(config.model, device=config.device)
        catalog = load_ad_catalog(config.ad_catalog) if config.ad_catalog else None
        self.model_version = model.model_version
        cache = EncodingCache.of(config.encoding_cache, config.encoding_max_age_s)
        self._refresher = Refresher(model, model.model_version, catalog=catalog, encoding_cache=cache)
        self._store = open_store(config.store)
        self._max_age_s = config.pair_max_age_s
        self._grace_ms = int(config.deadline_grace_s * 1000)
        self._lock = threading.Lock()

    def write(self, histories: pa.Table, work: list[CandidateWork]) -> PairCounts:
        """Compute and write ``work``'s pairs (:func:`write_pairs`)."""
        with self._lock:
            return write_pairs(
                self._refresher, self._store, self.model_version, histories, work, self._max_age_s, self._grace_ms
            )


#: (the user's current HISTORY row, 0 or 1 rows; the user's candidate sets).
Pending = tuple[pa.Table, pa.Table]


def pending_tokens(element: Pending) -> int:
    """An element's weight for ``BatchElements``: its history's events plus its ads, at least 1 and at
    most :data:`BATCH_TOKENS` (no element outweighs a batch)."""
    row, sets = element
    history = len(row.column("events")[0]) if row.num_rows else 0
    ads = len(sets.column("ad_ids").combine_chunks().flatten())
    return max(1, min(history + ads, BATCH_TOKENS))


class PairsModelHandler(ModelHandler[Pending, PredictionResult, PairWriting]):
    """RunInference's handler: a batch of (history row, candidate sets) → the sets in time get their
    pairs computed and written (skipping fresh ones), the late ones are counted → each element's
    acknowledgements, as its ``PredictionResult``'s example (so they go on only after the write)."""

    def __init__(self, config: StreamConfig) -> None:
        super().__init__()
        self._config = config

    def load_model(self) -> PairWriting:
        return PairWriting(self._config)

    def run_inference(
        self, batch: Sequence[Pending], model: PairWriting, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        from pipelines.streaming.metrics import shared_metrics

        started = time.perf_counter()
        work = [w for _, sets in batch for w in candidate_work(sets)]
        histories = newest_rows([row for row, _ in batch])
        metrics = shared_metrics("stream")
        answer_sets(work, int(self._config.deadline_grace_s * 1000), metrics, lambda live: model.write(histories, live))
        metrics.step("pairs", time.perf_counter() - started)
        return [PredictionResult(offsets_by_partition(sets), None, model_id=model.model_version) for _, sets in batch]

    def get_num_bytes(self, batch: Sequence[Pending]) -> int:
        return sum(row.nbytes + sets.nbytes for row, sets in batch)

    def get_metrics_namespace(self) -> str:
        return "stream_pairs"

    def batch_elements_kwargs(self) -> Mapping[str, Any]:
        return {"min_batch_size": BATCH_TOKENS, "max_batch_size": BATCH_TOKENS, "element_size_fn": pending_tokens}


class ComputePairs(AckAfterInference):
    """(history row, candidate sets) → their pairs in the store → the sets' acknowledgements."""

    def __init__(self, config: StreamConfig) -> None:
        super().__init__(PairsModelHandler(config))


def keyed_sets(
    decoded: Any, partition: int, offsets: np.ndarray, stage: str, shed_after_ms: int | None = None
) -> tuple[list[tuple[int, pa.Table]], np.ndarray, pa.Table]:
    """A decoded batch's candidate sets of ``stage``, one table per user (with ``_partition``,
    ``_offset`` and ``_received``); the offsets done at once (other stages' sets, and the shed ones);
    and the shed sets: with ``shed_after_ms``, those whose ``needed_by`` is before it (already past
    their deadline when read: they would cost the keyed step a state read for nothing)."""
    table, rows = decoded.table, offsets[decoded.rows]
    wanted = np.asarray(table.column("stage").to_numpy(zero_copy_only=False) == FUNNEL_STAGE_CODE[stage])
    table, done, rows = table.filter(pa.array(wanted)), rows[~wanted], rows[wanted]
    shed = table.slice(0, 0)
    if shed_after_ms is not None and table.num_rows:
        late = past_deadline(table, shed_after_ms)
        if late.any():
            shed, table = table.filter(pa.array(late)), table.filter(pa.array(~late))
            done, rows = np.sort(np.concatenate([done, rows[late]])), rows[~late]
    table = table.append_column(PARTITION, pa.array(np.full(len(rows), partition, np.int32)))
    table = table.append_column(OFFSET, pa.array(rows, pa.int64()))
    table = table.append_column(RECEIVED, pa.array(np.full(len(rows), time.time())))
    return split_by(table, table.column("user_id").to_numpy()), done, shed


def shed_count(sets: pa.Table) -> tuple[int, int]:
    """(sets, pairs) in a CANDIDATE_SET table: what :func:`count_late` counts for shed sets."""
    return sets.num_rows, len(sets.column("ad_ids").combine_chunks().flatten())
