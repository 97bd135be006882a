"""Histories in Beam keyed state with timers: the streaming job's state on a cluster runner (Flink).

:class:`AppendKeyedHistoriesFn` is keyed by user shard, like the worker-state
``AppendHistories`` of :mod:`pipelines.streaming.job`, but holds nothing in the
worker: the shard's events wait in ``BagState``, the shard's current histories
live in ``ReadModifyWriteState`` (Arrow IPC bytes). The first element (data, or
the reader's periodic empty tick) that finds the oldest buffered event
``flush_interval_s`` old flushes the shard (an event-time timer at the end of
the global window flushes what is left when the input ends). Processing-time
timers are not used: the Flink 2.62 portable operator waits for pending ones
when its input ends, forever (its ``flushData``), until Flink's 180 s
cancellation watchdog kills the TaskManager. A flush merges the buffer into the
histories, writes the changed rows as a flush file (atomically; once the flush
files since the last ``full-`` file hold ``COMPACT_RATIO`` times the shard's rows,
the whole shard as a ``full-`` file), publishes them when asked, and emits the flushed
offsets as acknowledgements.

The runner checkpoints this state (Flink: ``--checkpointing_interval`` and its
state backend) together with the readers' positions, so a restart from a
checkpoint resumes both consistently, on any TaskManager. Flush files written
after that checkpoint are written again as the events are read again: the
merge is deterministic, a later file carries the same or a newer row per user,
and :func:`pipelines.streaming.state.latest_histories` takes the newest. A job
started afresh (no checkpoint to restore) loads each shard's histories from its
flush files on the shard's first flush, so the files stay the durable output.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow

from pipelines.io.arrow_coder import ArrowTableCoder
from pipelines.io.kafka.config import KafkaConnection
from pipelines.streaming.acks import open_sink
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.state import (
    COMPACT_RATIO,
    OFFSET,
    PARTITION,
    flush_path,
    latest_histories,
    merge_shard,
    write_flush,
)

__all__ = ["AppendKeyedHistoriesFn"]

# Beam takes state and timers as parameter defaults; module-level specs keep that readable.
_TABLES = ArrowTableCoder(compress_from_bytes=None)
_BUFFER = BagStateSpec("buffer", _TABLES)
_HISTORIES = ReadModifyWriteStateSpec("histories", _TABLES)
_FILES = ReadModifyWriteStateSpec("rows_since_full", VarIntCoder())
_DUE = ReadModifyWriteStateSpec("flush_due", VarIntCoder())
_END = TimerSpec("end_of_input", TimeDomain.WATERMARK)
BUFFER, HISTORIES = beam.DoFn.StateParam(_BUFFER), beam.DoFn.StateParam(_HISTORIES)
FILES, DUE = beam.DoFn.StateParam(_FILES), beam.DoFn.StateParam(_DUE)
END, KEY = beam.DoFn.TimerParam(_END), beam.DoFn.KeyParam


class AppendKeyedHistoriesFn(beam.DoFn):
    """Keyed by shard: buffer events in bag state; once due, merge them into the shard's histories
    (value state), write the changed rows, then acknowledge their offsets."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._sink = open_sink(self._connection, self._config.histories_topic)

    def process(
        self,
        element: tuple[int, pa.Table],
        buffer: Any = BUFFER,
        histories: Any = HISTORIES,
        files: Any = FILES,
        due: Any = DUE,
        end: Any = END,
    ) -> Iterator[tuple[int, np.ndarray]]:
        shard, table = element
        now_ms = int(time.time() * 1000)
        flush_at = due.read()
        if table.num_rows:
            buffer.add(table)
            if flush_at is None:
                flush_at = now_ms + int(self._config.flush_interval_s * 1000)
                due.write(flush_at)
                end.set(GlobalWindow().max_timestamp())
        if flush_at is not None and now_ms >= flush_at:
            yield from self._flush(shard, buffer, histories, files, due)

    @on_timer(_END)
    def on_end(
        self, shard: Any = KEY, buffer: Any = BUFFER, histories: Any = HISTORIES, files: Any = FILES, due: Any = DUE
    ) -> Iterator[tuple[int, np.ndarray]]:
        yield from self._flush(shard, buffer, histories, files, due)

    def _flush(self, shard: int, buffer: Any, histories: Any, files: Any, due: Any) -> Iterator[tuple[int, np.ndarray]]:
        tables = [t for t in buffer.read() if t.num_rows]
        buffer.clear()
        due.clear()
        if not tables:
            return
        started = time.perf_counter()
        events = pa.concat_tables(tables)
        state = histories.read()
        if state is None:  # a fresh job: the shard's flush files are its state so far
            state = latest_histories(self._config.output, shard)
        merged = merge_shard(events, state, max_history=self._config.max_history)
        since_full = (files.read() or 0) + merged.changed.num_rows  # rows in flush files since the last full one
        full = since_full > COMPACT_RATIO * merged.state.num_rows
        write_flush(merged.state if full else merged.changed, flush_path(self._config.output, shard, full=full))
        histories.write(merged.state)
        files.write(0 if full else since_full)
        if self._sink is not None:
            from pipelines.io.kafka.encode import histories_to_json

            self._sink.send_many(histories_to_json(merged.changed))
            self._sink.flush()
        _record_flush(time.perf_counter() - started, merged.changed)
        partitions, offsets = events.column(PARTITION).to_numpy(), events.column(OFFSET).to_numpy()
        for p in np.unique(partitions):
            yield int(p), offsets[partitions == p]

    def teardown(self) -> None:
        if self._sink is not None:
            self._sink.close()


def _record_flush(seconds: float, changed: pa.Table) -> None:
    from pipelines.streaming.metrics import shared_metrics

    metrics = shared_metrics("stream")
    metrics.step("flush", seconds)
    if changed.num_rows:
        newest = changed.column("last_event_time").cast(pa.int64()).to_numpy()
        metrics.fresh("event_to_history", time.time() - newest / 1000.0)
