"""The candidates job: pair representations ready before the late ranking stage asks for them.

A long-running process (``python -m pipelines solaris``), separate from the streaming
histories job whose flush files it reads. Two threads:

- the reader (kafka-python, manual assignment of every partition of the candidates
  topic, starting at the group's committed offsets) decodes candidate sets
  (:mod:`pipelines.io.kafka.candidate_sets`); those of the configured stage go to a
  bounded :class:`pipelines.streaming.pair_work.WorkQueue`, which sheds the oldest
  under overload; the others, unreadable ones (counted by reason) and shed ones are
  done at once (unreadable ones also written to ``dead_letters/`` of ``--dead-letters``).
  It commits, per partition, the first offset not yet done
  (:class:`pipelines.streaming.state.OffsetLedger`) and measures the lag;
- the worker takes batches of candidate sets, drops those past their deadline
  (``needed_by``; counted, never computed late), reads their pairs from the store and
  skips those already fresh (computed by the same model version on the user's current
  history: the compute saved), computes the rest with the model's shared-history path (each request's
  history encoded once, :meth:`pipelines.precompute.refresh.Refresher.pairs`),
  writes them to the store, and only then marks the sets done.

So an offset is committed only once its pairs are in the store. After a crash (even
SIGKILL) the job reads again from the committed offsets; the pairs written before the
crash are fresh in the store and skipped, so each pair is written once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines.errors import ConfigError
from pipelines.io.kafka.candidate_sets import decode_candidate_sets
from pipelines.io.kafka.config import KafkaConnection
from pipelines.schemas.enums import FUNNEL_STAGE_CODE, FUNNEL_STAGES
from pipelines.settings import ENCODING_CACHE, ENCODING_MAX_AGE, PAIR_MAX_AGE
from pipelines.streaming.metrics import JobMetrics
from pipelines.streaming.pair_work import CandidateWork, WorkQueue, pair_keys
from pipelines.streaming.state import OffsetLedger

if TYPE_CHECKING:  # pairs imports Beam's RunInference: loaded by the worker only
    from pipelines.streaming.pairs import PairCounts

__all__ = ["CandidatesConfig", "CandidatesJob", "JobCounts", "write_dead_letter"]

log = logging.getLogger(__name__)

#: What becomes of a pair asked for (``gem_pairs_total{outcome}``): written or found in time by the
#: first three, not by the last two (its set was past its deadline, or shed by back-pressure).
PAIR_OUTCOMES = ("computed", "fresh", "repeated", "late", "shed")


@dataclass(frozen=True)
class CandidatesConfig:
    """What the candidates job reads and writes; validated on construction."""

    topic: str
    group: str
    histories: str
    model: str
    store: str
    stage: str = "early"
    batch_requests: int = 8
    queue_size: int = 2_000
    deadline_grace_s: float = 0.0
    pair_max_age_s: float = PAIR_MAX_AGE.seconds
    encoding_cache: int = ENCODING_CACHE.default
    encoding_max_age_s: float = ENCODING_MAX_AGE.seconds
    idle_exit_s: float | None = None
    history_refresh_s: float = 0.25
    device: str = "cpu"
    torch_threads: int = 1
    dead_letters: str | None = None

    def __post_init__(self) -> None:
        if self.stage not in FUNNEL_STAGE_CODE:
            raise ConfigError("--stage", f"got {self.stage!r}", f"pass one of {', '.join(FUNNEL_STAGES)}")
        for flag, value, low in (("--batch-requests", self.batch_requests, 1), ("--queue-size", self.queue_size, 1)):
            if value < low:
                raise ConfigError(flag, f"got {value}", f"pass a value >= {low}")
        if self.pair_max_age_s <= 0 or self.history_refresh_s <= 0:
            raise ConfigError("--pair-max-age", "ages must be positive", "pass a positive number of seconds")
        if self.idle_exit_s is not None and self.idle_exit_s <= 0:
            raise ConfigError("--idle-exit", f"got {self.idle_exit_s}", "pass a positive number of seconds")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("--device", f"got {self.device!r}", "pass auto, cpu or cuda")
        if self.torch_threads < 1:
            raise ConfigError("--torch-threads", f"got {self.torch_threads}", "pass 1 or more")
        ENCODING_CACHE.check(self.encoding_cache)
        ENCODING_MAX_AGE.check(self.encoding_max_age_s)


@dataclass
class JobCounts:
    """What one run did (also in the metrics)."""

    read: int = 0
    other_stage: int = 0
    dead_letters: int = 0
    shed: int = 0
    deadline_dropped: int = 0
    requests_done: int = 0
    pairs_computed: int = 0
    pairs_fresh: int = 0
    pairs_repeated: int = 0
    #: Pairs not computed because their set passed its deadline between rank tiers.
    pairs_late: int = 0
    committed: dict[int, int] = field(default_factory=dict)


class CandidatesJob:
    """``run()`` until stopped (:meth:`stop`, or ``idle_exit_s`` without a message and all done)."""

    def __init__(
        self, connection: KafkaConnection, config: CandidatesConfig, metrics: JobMetrics | None = None
    ) -> None:
        self._connection, self._config = connection, config
        self.metrics = metrics or JobMetrics("solaris")
        for outcome in PAIR_OUTCOMES:  # every outcome's series from the start (the exact share's terms)
            self.metrics.pairs.labels(self.metrics.pipeline, outcome)
        self.counts = JobCounts()
        self._queue = WorkQueue(config.queue_size)
        self._done: queue.SimpleQueue[tuple[int, np.ndarray]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._error: BaseException | None = None

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> JobCounts:
        compute = _Compute(self._config)  # loads model, store, histories: a bad flag fails here
        reader = threading.Thread(target=self._guard, args=(self._read_loop,), name="candidates-reader", daemon=True)
        reader.start()
        try:
            while not self._stop.is_set():
                work = self._queue.take(self._config.batch_requests, wait_s=0.1)
                self.metrics.depth("candidate_sets", len(self._queue))
                if work:
                    self._process(compute, work)
        finally:
            self._stop.set()
            reader.join(timeout=30)
            compute.close()
        if self._error is not None:
            raise self._error
        return self.counts

    # -- the worker ----------------------------------------------------------------------------
    def _process(self, compute: _Compute, work: list[CandidateWork]) -> None:
        from pipelines.streaming.pairs import answer_sets

        started = time.perf_counter()
        grace_ms = int(self._config.deadline_grace_s * 1000)
        live, late, outcome = answer_sets(work, grace_ms, self.metrics, lambda sets: compute.pairs(sets, grace_ms))
        self.counts.deadline_dropped += len(late)
        self.counts.pairs_computed += outcome.computed
        self.counts.pairs_fresh += outcome.fresh
        self.counts.pairs_repeated += outcome.repeated
        self.counts.pairs_late += outcome.late
        if live:
            self.metrics.state_users.labels(self.metrics.pipeline).set(compute.view.num_users)
        self.counts.requests_done += len(live)
        self.metrics.step("pairs", time.perf_counter() - started)
        self._mark_done(work)

    def _mark_done(self, work: list[CandidateWork]) -> None:
        by_partition: dict[int, list[int]] = {}
        for w in work:
            by_partition.setdefault(w.partition, []).append(w.offset)
        for partition, offsets in by_partition.items():
            self._done.put((partition, np.asarray(offsets, np.int64)))

    # -- the reader ----------------------------------------------------------------------------
    def _guard(self, loop: Any) -> None:
        try:
            loop()
        except BaseException as exc:  # handed to run(), which raises it
            self._error = exc
            self._stop.set()

    def _read_loop(self) -> None:
        reader = _Reader(self._connection, self._config, self.metrics)
        try:
            idle_since = time.monotonic()
            while not self._stop.is_set():
                got = reader.poll()
                if got:
                    idle_since = time.monotonic()
                    self._take(reader, got)
                while True:
                    try:
                        reader.done(*self._done.get_nowait())
                    except queue.Empty:
                        break
                reader.commit_and_measure()
                limit = self._config.idle_exit_s
                if limit is not None and time.monotonic() - idle_since > limit and reader.all_done():
                    log.info("solaris: no candidate set for %.0f s and all committed: stopping", limit)
                    self._stop.set()
        finally:
            self.counts.committed = reader.committed()
            reader.close()

    def _take(self, reader: _Reader, records: list[Any]) -> None:
        stage = FUNNEL_STAGE_CODE[self._config.stage]
        decoded = decode_candidate_sets([r.value or b"" for r in records])
        self.counts.read += len(records)
        self.metrics.read("candidate_sets", len(records))
        for position, reason in decoded.bad.items():
            record = records[position]
            source = f"kafka:{record.topic}/{record.partition}/{record.offset}"
            log.warning("dead letter (%s): %s", reason, source)
            if self._config.dead_letters is not None:
                write_dead_letter(
                    self._config.dead_letters, reason, record.value or b"", source, record.partition, record.offset
                )
            self.metrics.dead(reason)
            reader.done(record.partition, np.asarray([record.offset]))
        self.counts.dead_letters += len(decoded.bad)
        table, now_s, work = decoded.table.to_pydict(), time.time(), []
        for i, position in enumerate(decoded.rows.tolist()):
            record = records[position]
            if table["stage"][i] != stage:
                self.counts.other_stage += 1
                reader.done(record.partition, np.asarray([record.offset]))
                continue
            work.append(_work(record, table, i, now_s))
        shed = self._queue.put(work)
        if shed:
            self.counts.shed += len(shed)
            self.metrics.shed.labels(self.metrics.pipeline).inc(len(shed))
            self.metrics.pairs.labels(self.metrics.pipeline, "shed").inc(sum(len(w.ad_ids) for w in shed))
            for w in shed:
                reader.done(w.partition, np.asarray([w.offset]))
        self.metrics.depth("candidate_sets", len(self._queue))


def write_dead_letter(folder: str, reason: str, payload: bytes, source: str, partition: int, offset: int) -> str:
    """One DEAD_LETTER Parquet file per unreadable record, named by its partition and offset (so a
    record read again after a restart replaces its own file), written atomically."""
    import os

    import pyarrow.parquet as pq

    from pipelines.io.deadletters import dead_letter_table
    from pipelines.io.parquet import conform
    from pipelines.schemas.layouts import DEAD_LETTER

    path = os.path.join(folder, "dead_letters", f"p{partition:05d}-o{offset:015d}.parquet")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = dead_letter_table("candidates", [(reason, "not a candidate set (see the reason)", payload, source)])
    tmp = f"{path}.tmp"
    pq.write_table(conform(table, DEAD_LETTER), tmp)
    os.replace(tmp, path)
    return path


def _work(record: Any, table: dict[str, list[Any]], i: int, now_s: float) -> CandidateWork:
    def ms(value: Any) -> int:
        return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)

    return CandidateWork(
        partition=record.partition,
        offset=record.offset,
        request_id=table["request_id"][i],
        user_id=int(table["user_id"][i]),
        surface=int(table["surface"][i]),
        stage_ms=ms(table["stage_time"][i]),
        needed_by_ms=ms(table["needed_by"][i]),
        ad_ids=np.asarray(table["ad_ids"][i], np.int64),
        received_s=now_s,
    )


class _Compute:
    """The model, store and history view of the worker, opened once."""

    def __init__(self, config: CandidatesConfig) -> None:
        import torch

        from pipelines.model.checkpoint import CheckpointError, load_model
        from pipelines.model.encoding import EncodingCache
        from pipelines.precompute.refresh import Refresher
        from pipelines.store import open_store
        from pipelines.streaming.history_view import HistoryView

        torch.set_num_threads(config.torch_threads)
        try:
            self._model = load_model(config.model, device=config.device)
        except (CheckpointError, FileNotFoundError) as exc:
            raise ConfigError("--model", str(exc), "point it at the --output folder of `train`") from exc
        cache = EncodingCache.of(config.encoding_cache, config.encoding_max_age_s)
        self._refresher = Refresher(self._model, self._model.model_version, encoding_cache=cache)
        self._store = open_store(config.store)
        self._max_age_s = config.pair_max_age_s
        self.view = HistoryView(config.histories, refresh_s=config.history_refresh_s)

    def pairs(self, work: list[CandidateWork], grace_ms: int) -> PairCounts:
        """Compute and write the pairs of ``work`` not fresh in the store (``write_pairs``)."""
        from pipelines.streaming.pairs import write_pairs

        histories = self.view.rows(pair_keys(work)[0])
        model_version = self._model.model_version
        return write_pairs(self._refresher, self._store, model_version, histories, work, self._max_age_s, grace_ms)

    def close(self) -> None:
        self._store.close()


class _Reader:
    """The reader thread's Kafka side: every partition, offsets done, commits and lag."""

    COMMIT_INTERVAL_S = 0.2
    LAG_INTERVAL_S = 1.0

    def __init__(self, connection: KafkaConnection, config: CandidatesConfig, metrics: JobMetrics) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._topic, self._metrics = config.topic, metrics
        self._consumer = KafkaConsumer(
            **connection.kafka_python(),
            group_id=config.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
        )
        partitions = sorted(self._consumer.partitions_for_topic(config.topic) or ())
        if not partitions:
            raise ConfigError("--topic", f"topic {config.topic!r} does not exist", "create it (produce does)")
        self._tps = [TopicPartition(config.topic, p) for p in partitions]
        self._consumer.assign(self._tps)
        beginning = self._consumer.beginning_offsets(self._tps)
        self._ledgers: dict[int, OffsetLedger] = {}
        self._committed: dict[int, int] = {}
        for tp in self._tps:
            found = self._consumer.committed(tp)
            start = int(beginning[tp]) if found is None else int(found)
            self._consumer.seek(tp, start)
            self._ledgers[tp.partition] = OffsetLedger(start)
            self._committed[tp.partition] = start
        self._read_times: dict[int, deque[tuple[int, float]]] = {p: deque() for p in partitions}
        self._ends: dict[int, int] = {}
        self._commit_at = self._lag_at = 0.0

    def poll(self) -> list[Any]:
        batches = self._consumer.poll(timeout_ms=100, max_records=2_000)
        records = [r for tp in sorted(batches, key=lambda t: t.partition) for r in batches[tp]]
        for r in records:
            self._read_times[r.partition].append((r.offset, r.timestamp / 1000.0))
        return records

    def done(self, partition: int, offsets: np.ndarray) -> None:
        self._ledgers[partition].add(offsets)

    def all_done(self) -> bool:
        return all(self._committed[p] >= self._ends.get(p, 0) for p in self._ledgers)

    def committed(self) -> dict[int, int]:
        return dict(self._committed)

    def commit_and_measure(self) -> None:
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        now = time.monotonic()
        if now - self._commit_at >= self.COMMIT_INTERVAL_S:
            self._commit_at = now
            moved = {
                tp: OffsetAndMetadata(self._ledgers[tp.partition].next, "", -1)
                for tp in self._tps
                if self._ledgers[tp.partition].next > self._committed[tp.partition]
            }
            if moved:
                try:
                    self._consumer.commit(moved)
                    self._committed.update({tp.partition: o.offset for tp, o in moved.items()})
                except KafkaError as exc:  # broker away: the next round tries again
                    log.warning("commit failed (%r); retrying", exc)
        if now - self._lag_at >= self.LAG_INTERVAL_S or not self._ends:
            self._lag_at = now
            self._measure_lag()

    def _measure_lag(self) -> None:
        from kafka.errors import KafkaError

        try:
            ends = self._consumer.end_offsets(self._tps)
        except KafkaError:
            return
        now = time.time()
        for tp in self._tps:
            p = tp.partition
            self._ends[p] = int(ends[tp])
            committed = self._committed[p]
            times = self._read_times[p]
            while times and times[0][0] < committed:
                times.popleft()
            behind = max(0, self._ends[p] - committed)
            age = now - times[0][1] if behind and times else 0.0
            self._metrics.lag(self._topic, p, behind, max(0.0, age))

    def close(self) -> None:
        self.commit_and_measure()
        self._commit_at = 0.0
        self.commit_and_measure()
        self._consumer.close()
