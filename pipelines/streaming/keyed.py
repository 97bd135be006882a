"""Per-user histories in Beam keyed state with event-time timers: the streaming job's state on Flink.

The reader (:mod:`pipelines.streaming.job`) emits each polled batch cut into one
EVENT table per user (key = ``user_id``), stamped with the wall clock, and its
watermark follows the wall clock (a :class:`WalltimeWatermarkEstimator` on the
splittable DoFn). :class:`AppendUserHistoryFn` holds, per user, one bag (``user``) of

- the user's capped HISTORY row (at most one; none for a user not flushed yet) and
- the user's events since the last flush (EVENT tables),

each tagged with its kind, and an **event-time** timer at the end of the
``flush_interval_s`` slot (aligned on the epoch) that the event's stamp falls in, one
per slot (its dynamic tag): setting it needs no read, and a later event never moves
an earlier slot's timer, so a busy user still flushes every interval. One bag keeps
the runner's state requests per flush at four (an append per batch; a read, a clear
and an append per flush): each is a round trip from the SDK worker to the runner,
and on Prism they were most of a flush's time.

With ``flush_interval_s`` 0 (``--flush-interval 0``) there is no buffer and no timer: each
arriving table is merged at once (a read, a clear and an append), so nothing waits on the
watermark; a bundle may then flush a user twice, and its rows keep their order in the flush
file, where readers take the last.

When the watermark passes the timer (or the input ends), the buffer is merged
into the history by :func:`pipelines.streaming.user_merge.merge_user`, one user's
merge equal to the batch job's (late events go to their place by event time,
duplicates by event_id are dropped, the history is capped), the state
is written and the changed row goes on with its (partition, offsets).
:class:`WriteHistoriesFn` batches the changed rows of a bundle into one flush
file per shard (the layout ``inspect``, ``features --previous`` and
:func:`pipelines.streaming.state.latest_histories` read) and the optional
histories topic, and only then emits the acknowledgements; then it compacts the
shards it wrote (:func:`pipelines.streaming.state.compact_shard`: any worker may,
one at a time per shard). So a flush costs the users its events touched, not
the users the state holds, and a shard's file count stays bounded.

Processing-time timers are not used: the Flink 2.62 portable operator waits for
pending ones when its input ends, forever (its ``flushData``), until Flink's 180 s
cancellation watchdog kills the TaskManager.

The runner checkpoints this state (Flink: ``--checkpointing_interval`` and its
state backend, RocksDB incremental on the local cluster) with the readers'
positions, so a restart from a checkpoint resumes both consistently. A user first
seen by a job started afresh (no checkpoint) gets its earlier history from the
flush files through :class:`FirstSight`: a small shard is loaded once into a per-worker
cache of at most ``FIRST_SIGHT_SHARDS`` shards; a shard over ``WHOLE_SHARD_BYTES`` is read
per user (the Parquet row groups that can hold the user). It is consulted only when
the user's keyed state is empty, so its staleness never matters: every row this job
wrote since belongs to a user that now has state.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import TupleCoder, VarIntCoder
from apache_beam.io.watermark_estimators import WalltimeWatermarkEstimator
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.core import WatermarkEstimatorProvider
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from pipelines.io.arrow_coder import ArrowTableCoder
from pipelines.io.kafka.config import KafkaConnection
from pipelines.io.shards import once_per_user, split_by, split_by_shard
from pipelines.schemas.layouts import HISTORY
from pipelines.streaming.acks import open_sink
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.pair_work import past_deadline
from pipelines.streaming.pairs import PAIRS, is_candidate_sets
from pipelines.streaming.state import (
    ShardHistories,
    append_flush,
    compact_shard,
    history_of,
    latest_histories,
    offsets_by_partition,
    shard_bytes,
)
from pipelines.streaming.user_merge import merge_user

__all__ = [
    "FLUSHED",
    "FLUSHED_WITH_REPS",
    "PENDING",
    "AppendUserHistoryFn",
    "FirstSight",
    "WalltimeWatermark",
    "WriteHistoriesFn",
    "flush_slot",
    "split_by_user",
]

#: Shards a worker keeps loaded to answer "what did the flush files hold for this new user".
FIRST_SIGHT_SHARDS = 64
#: A shard whose files hold more bytes than this is read per user on first sight, not loaded whole.
WHOLE_SHARD_BYTES = 8 << 20

# Beam takes state and timers as parameter defaults; module-level specs keep that readable.
_TABLES = ArrowTableCoder(compress_from_bytes=None)
#: What the user's bag holds: (kind, table), kind ROW (the HISTORY row) or EVENTS (a batch of EVENT rows).
ROW, EVENTS = 0, 1
_USER = BagStateSpec("user", TupleCoder([VarIntCoder(), _TABLES]))
_REPS = ReadModifyWriteStateSpec("rep_history", _TABLES)
_FLUSH = TimerSpec("flush", TimeDomain.WATERMARK)
USER_STATE, REPS_STATE = beam.DoFn.StateParam(_USER), beam.DoFn.StateParam(_REPS)
FLUSH, KEY = beam.DoFn.TimerParam(_FLUSH), beam.DoFn.KeyParam

#: (a user's changed HISTORY row, its flushed (partition, offsets)).
Flushed = tuple[pa.Table, list[tuple[int, np.ndarray]]]
#: The same with the user's REP_HISTORY row (``stream --rep-history``).
FlushedWithReps = tuple[pa.Table, list[tuple[int, np.ndarray]], pa.Table]
#: Their Beam type hints, so the tables cross stages in :class:`ArrowTableCoder` and are never
#: pickled: a pickled slice of a table carries its parent's whole buffers (tens of kB for one row).
FLUSHED = tuple[pa.Table, Any]
FLUSHED_WITH_REPS = tuple[pa.Table, Any, pa.Table]
#: (a user's current HISTORY row, 0 or 1 rows; that user's candidate sets): ``stream --candidates-topic``.
PENDING = tuple[pa.Table, pa.Table]


class RepStep(Protocol):
    """What the flush calls after the merge to keep the user's historical representations
    (:class:`pipelines.streaming.rep_history.RepHistoryStep`)."""

    def setup(self) -> None: ...

    def append(self, user: int, previous: pa.Table, changed: pa.Table, state: Any) -> pa.Table: ...


class WalltimeWatermark(WatermarkEstimatorProvider):
    """The reader's watermark: the wall clock, so event-time timers at stamp + interval fire."""

    def initial_estimator_state(self, element: Any, restriction: Any) -> None:
        return None

    def create_watermark_estimator(self, estimator_state: Any) -> WalltimeWatermarkEstimator:
        return WalltimeWatermarkEstimator(estimator_state)


def split_by_user(table: pa.Table) -> list[tuple[int, pa.Table]]:
    """``table`` (with ``user_id``) cut into one sub-table per user (zero-copy slices of one sort)."""
    return split_by(table, table.column("user_id").to_numpy())


class Rows(Protocol):
    def rows_of(self, users: list[int]) -> pa.Table: ...


def _load_histories(output: str, shard: int) -> ShardHistories:
    loaded = ShardHistories()
    loaded.add(latest_histories(output, shard))
    return loaded


class FirstSight:
    """Each user's row in the flush files, for users a fresh job meets for the first time.

    A small shard (its files at most ``whole_bytes`` on disk) is loaded whole, once per worker,
    into a bounded LRU (``max_shards``): its later first sights are dictionary lookups. A bigger
    shard is read per user (``read_user``: the row groups that can hold the user), so a first
    sight never costs a shard that grows with its users, and the memory stays bounded.
    ``load(output, shard)`` reads a shard whole; ``size(output, shard)`` gives its bytes on disk.
    """

    def __init__(
        self,
        max_shards: int = FIRST_SIGHT_SHARDS,
        load: Callable[[str, int], Rows] = _load_histories,
        read_user: Callable[[str, int, int], pa.Table] = history_of,
        size: Callable[[str, int], int] = shard_bytes,
        whole_bytes: int = WHOLE_SHARD_BYTES,
    ) -> None:
        self._max, self._load, self._read_user, self._size = max_shards, load, read_user, size
        self._whole_bytes = whole_bytes
        self._shards: OrderedDict[tuple[str, int], Rows] = OrderedDict()
        self._per_user: set[tuple[str, int]] = set()  # shards found too big to load whole
        self._lock = threading.Lock()

    def row_of(self, output: str, shard: int, user: int) -> pa.Table:
        with self._lock:
            loaded = self._whole(output, shard)
            if loaded is not None:
                return loaded.rows_of([user])
        return self._read_user(output, shard, user)

    def _whole(self, output: str, shard: int) -> Rows | None:
        """The shard loaded whole (loading it now if it is small enough); None for a big one."""
        key = (output, shard)
        if key in self._per_user:
            return None
        loaded = self._shards.get(key)
        if loaded is None:
            if self._size(output, shard) > self._whole_bytes:
                self._per_user.add(key)
                return None
            loaded = self._shards[key] = self._load(output, shard)
            while len(self._shards) > self._max:
                self._shards.popitem(last=False)
        self._shards.move_to_end(key)
        return loaded


_FIRST_SIGHT = FirstSight()


class AppendUserHistoryFn(beam.DoFn):
    """Keyed by user: buffer the user's events; at the event-time timer merge them into the
    user's history (keyed state) and emit the changed row with the flushed offsets. With
    ``reps``, also the user's historical representations (keyed state too), third in each output."""

    def __init__(self, config: StreamConfig, reps: RepStep | None = None) -> None:
        self._config = config
        self._reps = reps

    def setup(self) -> None:
        if self._reps is not None:
            self._reps.setup()

    def process(
        self,
        element: tuple[int, pa.Table],
        stamp: Any = beam.DoFn.TimestampParam,
        state: Any = USER_STATE,
        reps: Any = REPS_STATE,
        flush: Any = FLUSH,
    ) -> Iterator[Flushed | FlushedWithReps | TaggedOutput]:
        user, table = element
        if not table.num_rows:
            return
        if is_candidate_sets(table):  # they meet the user's freshest state: see pipelines.streaming.pairs
            yield TaggedOutput(PAIRS, (self._row_for(user, table, state), table))
            return
        if self._config.flush_on_arrival:  # no buffer, no timer: merged now
            yield from self._flush(user, state, reps, arrived=table)
            return
        state.add((EVENTS, table))
        slot = flush_slot(Timestamp.of(stamp).micros, self._config.flush_interval_s)
        flush.set(Timestamp(micros=slot.end_micros), dynamic_timer_tag=str(slot.number))

    def _row_for(self, user: int, sets: pa.Table, state: Any) -> pa.Table:
        """The user's current row for ``sets``; none (no state read) when every set is already past its
        deadline: the pairs step only counts those, and a read is a round trip to the runner."""
        now_ms = int(time.time() * 1000)
        if past_deadline(sets, now_ms, int(self._config.deadline_grace_s * 1000)).all():
            return _EMPTY
        return self._current_row(user, sets, state)

    def _current_row(self, user: int, table: pa.Table, state: Any) -> pa.Table:
        """The user's HISTORY row as the next flush would write it (0 rows for a user without one):
        the flushed row, or the flush files' for a user this job has not flushed, with the events
        still buffered merged in. The state is left as it is."""
        held = list(state.read())
        rows = [t for kind, t in held if kind == ROW]
        previous = rows[-1] if rows else self._first_sight(user, table)
        pending = [t for kind, t in held if kind == EVENTS and t.num_rows]
        if not pending:
            return previous
        return merge_user(pa.concat_tables(pending), previous, max_history=self._config.max_history)

    def _first_sight(self, user: int, table: pa.Table) -> pa.Table:
        return _FIRST_SIGHT.row_of(self._config.output, _shard_of(table, self._config.num_shards), user)

    @on_timer(_FLUSH)
    def on_flush(
        self, user: Any = KEY, state: Any = USER_STATE, reps: Any = REPS_STATE
    ) -> Iterator[Flushed | FlushedWithReps]:
        yield from self._flush(user, state, reps)

    def _flush(
        self, user: int, state: Any, reps: Any, arrived: pa.Table | None = None
    ) -> Iterator[Flushed | FlushedWithReps]:
        """Merge the user's buffered events (and ``arrived``, events not buffered) into its history."""
        held = list(state.read())
        tables = [t for kind, t in held if kind == EVENTS and t.num_rows]
        if arrived is not None:
            tables.append(arrived)
        if not tables:  # an earlier slot's flush took them
            return
        started = time.perf_counter()
        events = pa.concat_tables(tables)
        rows = [t for kind, t in held if kind == ROW]
        previous = rows[-1] if rows else None
        if previous is None:  # first sight (a fresh job): the flush files hold its history so far
            previous = self._first_sight(user, events)
            _record_new_user()
        row = merge_user(events, previous, max_history=self._config.max_history)
        state.clear()
        state.add((ROW, row))
        _record_flush(time.perf_counter() - started, row)
        acks = offsets_by_partition(events)
        if self._reps is None:
            yield row, acks
        else:
            yield row, acks, self._reps.append(user, previous, row, reps)


class Slot(NamedTuple):
    number: int
    end_micros: int


def flush_slot(stamp_micros: int, interval_s: float) -> Slot:
    """The flush-interval slot (aligned on the epoch) that a stamp falls in: its number and its end,
    where the slot's timer fires (a stamp on a boundary opens the next slot)."""
    width = max(1, round(interval_s * 1_000_000))
    number = stamp_micros // width
    return Slot(number, (number + 1) * width)


def _shard_of(table: pa.Table, num_shards: int) -> int:
    """The shard of the user of ``table`` (rows with ``user_id``, one user's)."""
    return split_by_shard(table.slice(0, 1), num_shards)[0][0]


class WriteHistoriesFn(beam.DoFn):
    """Per bundle: the changed rows as one flush file per shard (and the histories topic), then
    (the changed rows, their acknowledgements): nothing is acknowledged before its rows are durable."""

    def __init__(self, connection: KafkaConnection, config: StreamConfig) -> None:
        self._connection, self._config = connection, config

    def setup(self) -> None:
        self._sink = open_sink(self._connection, self._config.histories_topic)

    def start_bundle(self) -> None:
        self._rows: list[pa.Table] = []
        self._acks: dict[int, list[np.ndarray]] = {}
        self._stamp = Timestamp.of(0)

    def process(self, element: Flushed, stamp: Any = beam.DoFn.TimestampParam) -> None:
        rows, acks = element
        self._rows.append(rows)
        for p, offsets in acks:
            self._acks.setdefault(p, []).append(offsets)
        self._stamp = max(self._stamp, Timestamp.of(stamp))

    def finish_bundle(self) -> Iterator[WindowedValue]:  # of Flushed
        if not self._acks:
            return
        changed = once_per_user([r.select(HISTORY.schema.names) for r in self._rows], _EMPTY)  # flushed twice: once
        shards = split_by_shard(changed, self._config.num_shards)
        for shard, rows in shards:
            append_flush(rows, self._config.output, shard)
        if self._sink is not None and changed.num_rows:
            from pipelines.io.kafka.encode import histories_to_json

            self._sink.send_many(histories_to_json(changed))
            self._sink.flush()
        acks = [(p, np.concatenate(parts)) for p, parts in sorted(self._acks.items())]
        yield WindowedValue((changed, acks), self._stamp, (GlobalWindow(),))
        for shard, _ in shards:  # after the output, which the fused refresh handles first
            compact_shard(self._config.output, shard)

    def teardown(self) -> None:
        if self._sink is not None:
            self._sink.close()


_EMPTY = HISTORY.schema.empty_table()


def _record_new_user() -> None:
    from pipelines.streaming.metrics import shared_metrics

    metrics = shared_metrics("stream")
    metrics.state_users.labels("stream").inc()  # users whose state this worker process created


def _record_flush(seconds: float, changed: pa.Table) -> None:
    from pipelines.streaming.metrics import shared_metrics

    metrics = shared_metrics("stream")
    metrics.step("flush", seconds)
    if changed.num_rows:
        newest = changed.column("last_event_time").cast(pa.int64()).to_numpy()
        metrics.fresh("event_to_history", time.time() - newest / 1000.0)
