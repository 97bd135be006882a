"""The historical representations' backfill (``precompute --rep-history N``): for every user of a
features snapshot, the model's representation of each of the newest N stored events, as of that
event (:mod:`pipelines.model.rep_history`), one Parquet part per history shard under
``OUTPUT/rep_history/``.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines.io.shards import shard_path
from pipelines.io.snapshot import Snapshot
from pipelines.model.rep_history import REP_HISTORY_KIND, compute_rep_history, latest_events, rep_history_table
from pipelines.precompute.transforms import shard_histories

__all__ = ["REP_HISTORY_KIND", "WriteRepHistory"]


class _RepHistoryFn(beam.DoFn):
    def __init__(self, features: Snapshot, model: str, length: int, root: str, device: str) -> None:
        self._features, self._model_path, self._length = features, model, length
        self._root, self._device = root, device

    def setup(self) -> None:
        from pipelines.model.checkpoint import load_model

        self._model = load_model(self._model_path, device=self._device)
        self._events = Metrics.counter("precompute", "rep_history_events")

    def process(self, shard: int) -> Iterator[dict[str, int]]:
        from pipelines.model.inputs import HistoryIndex

        index = HistoryIndex(shard_histories(self._features, shard))
        history = compute_rep_history(self._model, index, latest_events(index, self._length))
        table = rep_history_table(history, index)
        if table.num_rows:
            target = shard_path(self._root, REP_HISTORY_KIND, shard)
            FileSystems.mkdirs(target.rsplit("/", 1)[0])
            with FileSystems.create(target) as sink:
                pq.write_table(table, sink, compression="zstd", use_dictionary=["user_id"])
        self._events.inc(len(history))
        yield {"rep_history_users": table.num_rows, "rep_history_events": len(history)}


class WriteRepHistory(beam.PTransform):
    """Each history shard of the pinned ``features`` snapshot (read as every precompute step reads
    it, each file checked against its commit) -> ``root/rep_history/shard=NNNNN/part-00000.parquet``;
    emits count dicts."""

    def __init__(self, features: Snapshot, num_shards: int, model: str, *, length: int, root: str, device: str) -> None:
        super().__init__()
        if length < 1:
            raise ValueError(f"WriteRepHistory: length must be positive, got {length}")
        self._num_shards = num_shards
        self._fn = _RepHistoryFn(features, model, length, root, device)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Shards" >> beam.Create(list(range(self._num_shards)))
            | "Reshuffle" >> beam.Reshuffle()
            | "Represent" >> beam.ParDo(self._fn)
        )
