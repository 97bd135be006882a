"""The historical representations' backfill (``precompute --rep-history N``): for every user of a
features snapshot, the model's representation of each of the newest N stored events, as of that
event (:mod:`pipelines.model.rep_history`), one Parquet part per history shard under
``OUTPUT/rep_history/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipelines.io.parquet import read_table
from pipelines.model.rep_history import compute_rep_history, latest_events, rep_history_table
from pipelines.schemas.layouts import HISTORY

__all__ = ["REP_HISTORY_KIND", "WriteRepHistory"]

#: The folder of an output that holds the historical representations.
REP_HISTORY_KIND = "rep_history"
_SHARD = re.compile(r"(shard=\d+)")


def _part_path(root: str, history_file: str, position: int) -> str:
    """``root/rep_history/<the history file's shard folder>/part-00000.parquet``."""
    found = _SHARD.search(history_file)
    shard = found.group(1) if found else f"shard={position:05d}"
    return f"{root.rstrip('/')}/{REP_HISTORY_KIND}/{shard}/part-00000.parquet"


class _RepHistoryFn(beam.DoFn):
    def __init__(self, model: str, length: int, root: str, device: str) -> None:
        self._model_path, self._length, self._root, self._device = model, length, root, device

    def setup(self) -> None:
        from pipelines.model.checkpoint import load_model

        self._model = load_model(self._model_path, device=self._device)
        self._events = Metrics.counter("precompute", "rep_history_events")

    def process(self, element: tuple[int, str]) -> Iterator[dict[str, int]]:
        from pipelines.model.inputs import HistoryIndex

        position, path = element
        index = HistoryIndex(read_table(path, HISTORY))
        history = compute_rep_history(self._model, index, latest_events(index, self._length))
        table = rep_history_table(history, index)
        if table.num_rows:
            target = _part_path(self._root, path, position)
            FileSystems.mkdirs(target.rsplit("/", 1)[0])
            with FileSystems.create(target) as sink:
                pq.write_table(table, sink, compression="zstd", use_dictionary=["user_id"])
        self._events.inc(len(history))
        yield {"rep_history_users": table.num_rows, "rep_history_events": len(history)}


class WriteRepHistory(beam.PTransform):
    """History files → ``root/rep_history/shard=NNNNN/part-00000.parquet``; emits count dicts."""

    def __init__(self, history_files: Sequence[str], model: str, *, length: int, root: str, device: str) -> None:
        super().__init__()
        if length < 1:
            raise ValueError(f"WriteRepHistory: length must be positive, got {length}")
        self._files = list(history_files)
        self._fn = _RepHistoryFn(model, length, root, device)

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "HistoryFiles" >> beam.Create(list(enumerate(self._files)))
            | "Reshuffle" >> beam.Reshuffle()
            | "Represent" >> beam.ParDo(self._fn)
        )
