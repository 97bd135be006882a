"""Thin Beam wrappers of the precompute stage."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.pvalue import TaggedOutput

from pipelines.io import arrow_coder  # noqa: F401 - registers the pa.Table coder
from pipelines.io.deadletters import dead_letter_table
from pipelines.io.files import Split, read_row_group
from pipelines.io.parquet import write_table
from pipelines.io.pause import pause_point
from pipelines.io.shards import shard_path, split_by_shard
from pipelines.io.snapshot import COUNTS, DEAD, HISTORIES, REPRESENTATIONS, Snapshot
from pipelines.io.transforms import GroupByShard
from pipelines.model.gem import Representations
from pipelines.model.inputs import GemBatch, HistoryIndex
from pipelines.precompute import coder  # noqa: F401 - registers the GemBatch coder
from pipelines.precompute.handler import GemModelHandler
from pipelines.precompute.records import concat_representations, latest_per_key, representation_table
from pipelines.precompute.requests import STAGE, check_candidates, merge_catalogs, request_elements, user_elements
from pipelines.schemas.layouts import HISTORY, REPRESENTATION

__all__ = [
    "AdCatalog",
    "PrepareRequests",
    "ReadCandidates",
    "RunGemInference",
    "WriteRepresentations",
    "shard_histories",
]

NAMESPACE = "precompute"


class _ReadCandidatesFn(beam.DoFn):
    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards

    def process(self, split: Split) -> Iterator[Any]:
        table = read_row_group(split)
        check = check_candidates(table, split.path)
        yield TaggedOutput(
            COUNTS,
            {
                "requests_in": table.num_rows,
                "pairs_in": _pairs(table),
                "dead_letters": check.dead_letters.num_rows,
                "dead_pairs": _pairs(table) - _pairs(check.valid),
            },
        )
        if check.dead_letters.num_rows:
            yield TaggedOutput(DEAD, check.dead_letters)
        yield from split_by_shard(check.valid, self._num_shards)


def _pairs(candidates: pa.Table) -> int:
    return int(pc.sum(pc.list_value_length(candidates.column("ad_ids"))).as_py() or 0)


class ReadCandidates(beam.PTransform):
    """Candidate Parquet splits → (shard, valid CANDIDATES table); tagged dead letters and counts."""

    def __init__(self, splits: Sequence[Split], *, num_shards: int) -> None:
        super().__init__()
        self._splits, self._num_shards = list(splits), num_shards

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.pvalue.DoOutputsTuple:
        return (
            pbegin
            | "Splits" >> beam.Create(self._splits)
            | "Read"
            >> beam.ParDo(_ReadCandidatesFn(self._num_shards))
            .with_output_types(tuple[int, pa.Table])
            .with_outputs(DEAD, COUNTS, main="candidates")
        )


class _PrepareFn(beam.DoFn):
    """(shard, candidate tables) → (shard, GemBatch) per request (+ user-level chunks)."""

    def __init__(self, features: Snapshot, max_len: int, all_users: bool) -> None:
        self._features, self._max_len, self._all_users = features, max_len, all_users

    def setup(self) -> None:
        self._requests = Metrics.counter(NAMESPACE, "requests")

    def process(self, element: tuple[int, Iterable[pa.Table]], catalog: pa.Table) -> Iterator[Any]:
        shard, tables = element
        candidates = [t for t in tables if t.num_rows]
        if not candidates and not self._all_users:
            return
        index = HistoryIndex(self._histories(shard))
        if candidates:
            for _, batch in request_elements(
                index, pa.concat_tables(candidates), max_len=self._max_len, catalog=catalog
            ):
                self._requests.inc()
                yield shard, batch
        if self._all_users:
            for _, batch in user_elements(index, max_len=self._max_len):
                yield shard, batch

    def _histories(self, shard: int) -> pa.Table:
        return shard_histories(self._features, shard)


def shard_histories(features: Snapshot, shard: int) -> pa.Table:
    """One shard's histories from the snapshot checked at construction (each file checked against
    its commit as it is opened); a shard the commit lists no file for has none."""
    path = shard_path(features.root, HISTORIES, shard)
    pause_point("snapshot-read")
    return features.read_table(path, HISTORY) if features.has_path(path) else HISTORY.schema.empty_table()


class PrepareRequests(beam.PTransform):
    """(shard, CANDIDATES) pairs → (shard, GemBatch) model inputs, joined to that shard's histories."""

    def __init__(
        self, features: Snapshot, catalog: beam.pvalue.AsSingleton, *, num_shards: int, max_len: int, all_users: bool
    ) -> None:
        super().__init__()
        self._features, self._catalog = features, catalog
        self._num_shards, self._max_len, self._all_users = num_shards, max_len, all_users

    def expand(self, keyed: beam.PCollection) -> beam.PCollection:
        # With --all-users every shard needs a turn, candidates or not: an empty table per shard.
        placeholders = [(s, pa.table({})) for s in range(self._num_shards)] if self._all_users else []
        every_shard = keyed.pipeline | "AllShards" >> beam.Create(placeholders).with_output_types(tuple[int, pa.Table])
        return (
            (keyed, every_shard)
            | "GroupByShard" >> GroupByShard()
            | "Prepare"
            >> beam.ParDo(_PrepareFn(self._features, self._max_len, self._all_users), self._catalog).with_output_types(
                tuple[int, GemBatch]
            )  # so Beam moves them with GemBatchCoder
        )


class RunGemInference(beam.PTransform):
    """(shard, GemBatch) → (shard, Representations) via RunInference; failures → dead letters (tagged)."""

    def __init__(self, handler: GemModelHandler) -> None:
        super().__init__()
        self._handler = handler

    def expand(self, keyed: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        main, other = keyed | "RunInference" >> RunInference(KeyedModelHandler(self._handler)).with_exception_handling()
        failed = other.failed_inferences | "FailedToDeadLetters" >> beam.Map(_inference_dead_letter)
        reps = main | "Unwrap" >> beam.Map(lambda kv: (kv[0], kv[1].inference))
        return reps, failed


def _inference_dead_letter(failure: tuple[Any, Exception]) -> pa.Table:
    batch, exc = failure
    rows = [(int(b.user_id[0]) if b.num_rows else -1, b.num_rows) for _, b in batch]
    payload = str(rows).encode()
    return dead_letter_table(
        STAGE, [("inference_error", f"{type(exc).__name__}: {exc}"[:500], payload, f"batch of {len(batch)} request(s)")]
    )


#: One request's (or a shard's) results: representations and each row's request time (B,).
_Results = tuple[Representations, np.ndarray]


@dataclass(frozen=True)
class _WriteSpec:
    output: str
    store_uri: str | None
    model_version: str
    watermark_ms: int | None
    computed_at_ms: int
    contexts_from: Snapshot | None


class _WriteShardFn(beam.DoFn):
    def __init__(self, spec: _WriteSpec) -> None:
        self._output, self._store_uri = spec.output, spec.store_uri
        self._model_version, self._watermark_ms = spec.model_version, spec.watermark_ms
        self._computed_at_ms, self._contexts_from = spec.computed_at_ms, spec.contexts_from

    def setup(self) -> None:
        self._store = None
        if self._store_uri:
            from pipelines.store import open_store

            self._store = open_store(self._store_uri)

    def teardown(self) -> None:
        if self._store is not None:
            self._store.close()

    def process(self, element: tuple[int, _Results]) -> Iterator[dict[str, int]]:
        shard, (reps, request_ms) = element
        table = representation_table(
            reps,
            model_version=self._model_version,
            watermark_ms=self._watermark_ms,
            computed_at_ms=self._computed_at_ms,
        )
        table, superseded = latest_per_key(table, request_ms)
        write_table(table, shard_path(self._output, REPRESENTATIONS, shard), REPRESENTATION)
        contexts = 0
        if self._store is not None:
            self._store.write_batch(table)
            if self._contexts_from is not None:
                contexts = self._write_contexts(shard, table)
        users = int(pc.sum(table.column("ad_id").is_null()).as_py() or 0)
        yield {
            "pairs_out": table.num_rows - users,
            "users_out": users,
            "pairs_superseded": superseded,
            "tokens": int(reps.num_tokens.sum()),
        } | ({"contexts_out": contexts} if self._contexts_from is not None else {})

    def _write_contexts(self, shard: int, table: pa.Table) -> int:
        """The context record (:mod:`pipelines.model.context`) of every user written here, as of all
        of the shard's stored events, with the representations' computed_at and model version."""
        from pipelines.model.context import encode_contexts, user_contexts

        assert self._store is not None and self._contexts_from is not None
        index = HistoryIndex(shard_histories(self._contexts_from, shard))
        users = np.unique(table.column("user_id").to_numpy())
        at = int(index.event_time.max()) + 1 if index.num_events else 0
        contexts = user_contexts(index, users, np.full(len(users), at, np.int64))
        self._store.write_contexts(
            users,
            encode_contexts(contexts),
            model_version=self._model_version,
            computed_at_ms=np.full(len(users), self._computed_at_ms, np.int64),
            history_watermark_ms=None if self._watermark_ms is None else np.full(len(users), self._watermark_ms),
        )
        return len(users)


class _ConcatResults(beam.CombineFn):
    """A shard's per-request results as one :data:`_Results`. As a combiner it is lifted: each
    bundle concatenates its part of a shard before the shuffle, so a few arrays per shard cross
    it instead of one pickled element per request."""

    def create_accumulator(self) -> list[_Results]:
        return []

    def add_input(self, accumulator: list[_Results], element: _Results) -> list[_Results]:
        accumulator.append(element)
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[list[_Results]]) -> list[_Results]:
        return [part for accumulator in accumulators for part in accumulator]

    def compact(self, accumulator: list[_Results]) -> list[_Results]:
        return [self.extract_output(accumulator)] if len(accumulator) > 1 else accumulator

    def extract_output(self, accumulator: list[_Results]) -> _Results:
        return concat_representations([r for r, _ in accumulator]), np.concatenate([t for _, t in accumulator])


class WriteRepresentations(beam.PTransform):
    """(shard, (Representations, request times)) per request → Parquet per shard (+ the online store);
    outputs count dicts. With ``contexts_from`` (a features snapshot) and a store, also each written
    user's context record."""

    def __init__(
        self,
        output: str,
        *,
        store_uri: str | None,
        model_version: str,
        watermark_ms: int | None,
        computed_at_ms: int,
        contexts_from: Snapshot | None = None,
    ) -> None:
        super().__init__()
        if contexts_from is not None and not store_uri:
            raise ValueError("contexts_from needs a store_uri: context records live only in the online store")
        self._fn = _WriteShardFn(
            _WriteSpec(output, store_uri, model_version, watermark_ms, computed_at_ms, contexts_from)
        )

    def expand(self, reps: beam.PCollection) -> beam.PCollection:
        return reps | "ConcatByShard" >> beam.CombinePerKey(_ConcatResults()) | "Write" >> beam.ParDo(self._fn)


def _catalog_of(path: str, features: Snapshot) -> pa.Table:
    from pipelines.model.inputs import ad_catalog

    return ad_catalog(features.read_table(path, HISTORY))


class AdCatalog(beam.PTransform):
    """A features snapshot's history files → one table of (item_id, advertiser_id, item_category) per ad seen."""

    def __init__(self, features: Snapshot) -> None:
        super().__init__()
        self._features = features

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "HistoryFiles" >> beam.Create(self._features.files(HISTORIES))
            | "AdsOfFile" >> beam.Map(_catalog_of, self._features).with_output_types(pa.Table)
            | "Merge" >> beam.CombineGlobally(merge_catalogs).with_output_types(pa.Table)
        )
