"""Thin Beam transforms of the snapshot kernel: group tables by shard, write dead letters and
the summary. The logic they wrap is pure (:mod:`.shards`, :mod:`.deadletters`, :mod:`.summary`)."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.io import arrow_coder  # noqa: F401 - registers the pa.Table coder
from pipelines.io.files import join
from pipelines.io.parquet import write_table
from pipelines.io.snapshot import DEAD_LETTERS
from pipelines.io.summary import sum_counts, write_summary
from pipelines.schemas.layouts import DEAD_LETTER

__all__ = ["GroupByShard", "WriteDeadLetters", "WriteSummary"]


class GroupByShard(beam.PTransform):
    """Several PCollections of (shard, pa.Table) → (shard, [tables]) in one shuffle (Arrow coder)."""

    def expand(self, keyed: tuple[beam.PCollection, ...]) -> beam.PCollection:
        return (
            keyed
            | "Flatten" >> beam.Flatten().with_output_types(tuple[int, pa.Table])
            | "GroupByKey" >> beam.GroupByKey()
        )


class WriteDeadLetters(beam.PTransform):
    """DEAD_LETTER tables → ``<output>/dead_letters/part-00000.parquet`` (always written)."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._path = join(output, DEAD_LETTERS, "part-00000.parquet")

    def expand(self, dead: beam.PCollection) -> beam.PCollection:
        return dead | "ToOne" >> beam.combiners.ToList() | "Write" >> beam.Map(self._write)

    def _write(self, tables: list[pa.Table]) -> str:
        table = pa.concat_tables(tables) if tables else DEAD_LETTER.schema.empty_table()
        order = pc.sort_indices(table, [("source", "ascending")])
        return write_table(table.take(order), self._path, DEAD_LETTER)


class WriteSummary(beam.PTransform):
    """Count dicts → ``<output>/summary.json`` with the totals and ``extra`` fields."""

    def __init__(self, output: str, extra: dict[str, Any]) -> None:
        super().__init__()
        self._output = output
        self._extra = extra

    def expand(self, counts: beam.PCollection) -> beam.PCollection:
        return counts | "Sum" >> beam.CombineGlobally(sum_counts) | "Write" >> beam.Map(self._write)

    def _write(self, totals: dict[str, int]) -> dict[str, Any]:
        summary = {**self._extra, **dict(sorted(totals.items()))}
        write_summary(self._output, summary)
        return summary
