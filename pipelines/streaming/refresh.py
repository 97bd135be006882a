"""The streaming job's precompute step: flushed histories → representations in the online store.

With ``--model`` and ``--store``, each flush of ``AppendHistories`` hands its
result (the touched users' histories and the acknowledgements) to the worker's
:class:`RefreshQueue` instead of acknowledging it. The queue's thread computes
the users' representations (:class:`pipelines.precompute.refresh.Refresher`:
user-level rows, and pair rows for users with a recent candidate set from
``--candidates``), writes them to the store, and only then hands the
acknowledgements back to the bundles. So an offset is committed once its event
is in the history *and* its user's representation has seen it; after a crash the
events are read again and the merge (which drops them as duplicates) still hands
their users here.

The refresh is driven by its own thread, like the flushes, so neither a bundle
nor the next flush waits for inference; flushes that finish while a refresh runs
are taken together by the next one (each user once, at their newest history),
so a backlog makes refreshes bigger, not more numerous. The inference itself
runs in a child process (:class:`RefreshProcess`): the job's Beam threads keep
its interpreter lock busy, and a model's forward pass, a few hundred small torch
calls that each give the lock back and wait to take it again, runs many times
slower there than in a process of its own.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipelines.errors import PipelinesError
from pipelines.io.arrow_coder import ArrowTableCoder
from pipelines.streaming.config import StreamConfig
from pipelines.streaming.flush import Acks, Coalescer, ShardFlush
from pipelines.streaming.state import newest_rows

if TYPE_CHECKING:  # imports torch: loaded on the worker, when the job starts
    from pipelines.precompute.refresh import RecentCandidates

__all__ = ["RefreshError", "RefreshProcess", "RefreshQueue", "load_recent_candidates", "open_refresh"]

log = logging.getLogger(__name__)


class RefreshQueue:
    """Flushes waiting for their representation refresh; one refresh takes all that wait."""

    def __init__(self, refresh: Callable[[pa.Table], None]) -> None:
        self._refresh = refresh
        self._pending: dict[int, ShardFlush] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        # (it mostly waits for the refresh process, which runs at REFRESH_NICE)
        self._worker: Coalescer[tuple[int, np.ndarray]] = Coalescer(self._run, "refresh")

    def submit(self, flushed: ShardFlush) -> None:
        if not flushed.acks:
            return
        number = next(self._numbers)
        with self._lock:
            self._pending[number] = flushed
        self._worker.request(number)

    def finished(self) -> Acks:
        """Acknowledgements of the flushes whose representations are written."""
        return self._worker.finished()

    def wait(self) -> Acks:
        return self._worker.wait()

    def _run(self, numbers: list[int]) -> Acks:
        from pipelines.streaming.metrics import shared_metrics

        with self._lock:
            flushes = [self._pending.pop(n) for n in numbers]
            waiting = len(self._pending)
        started = time.perf_counter()
        histories = newest_rows([f.histories for f in flushes])
        self._refresh(histories)
        metrics = shared_metrics("stream")
        metrics.step("refresh", time.perf_counter() - started)
        metrics.depth("refresh_flushes", waiting)
        if histories.num_rows:  # each refreshed user's newest event: event time -> user representation written
            newest = histories.column("last_event_time").cast(pa.int64()).to_numpy()
            metrics.fresh("event_to_user_rep", time.time() - newest / 1000.0)
        return [ack for f in flushes for ack in f.acks]


def load_recent_candidates(patterns: Sequence[str], ttl_s: float) -> RecentCandidates:
    """A :class:`RecentCandidates` of every CANDIDATES file matched by ``patterns``."""
    from pipelines.io.files import expand_inputs
    from pipelines.io.parquet import read_table
    from pipelines.precompute.refresh import RecentCandidates
    from pipelines.schemas.layouts import CANDIDATES

    paths = expand_inputs(list(patterns), "--candidates")
    table = pa.concat_tables([read_table(p, CANDIDATES) for p in paths])
    return RecentCandidates.from_table(table, ttl_s=ttl_s, source=",".join(paths))


class RefreshError(PipelinesError):
    """The refresh process failed to start, failed a refresh (its traceback is the message), or died."""


#: The child's CPU priority: histories come first when the CPU is short.
REFRESH_NICE = 10
#: Histories cross a local pipe: compressing them would only cost CPU.
_PIPE_CODER = ArrowTableCoder(compress_from_bytes=None)


class RefreshProcess:
    """``refresh(histories)`` run in a child process with its own interpreter (and interpreter lock).

    Each call sends the histories (Arrow IPC) and returns once the child has
    written their representations, or raises :class:`RefreshError`. The child
    loads the model, candidates and store once, before the constructor returns
    (so a bad checkpoint fails the job's setup), and exits when the job does:
    it is a daemon, and a parent killed outright closes its end of the pipe.
    """

    def __init__(self, config: StreamConfig, *, nice: int = REFRESH_NICE) -> None:
        context = multiprocessing.get_context("spawn")  # no fork: the job runs gRPC threads
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, config, nice), name="stream-refresh", daemon=True)
        self._process.start()
        child.close()
        self._answer("start")

    def __call__(self, histories: pa.Table) -> None:
        self._answer(f"refresh of {histories.num_rows} users", _PIPE_CODER.encode(histories))

    def _answer(self, what: str, request: bytes | None = None) -> None:
        try:
            if request is not None:
                self._pipe.send_bytes(request)
            ok, detail = self._pipe.recv()
        except (EOFError, OSError) as exc:  # OSError: a broken pipe
            self._process.join(timeout=5)
            raise RefreshError(
                f"the refresh process died during its {what} (exit code {self._process.exitcode})"
            ) from exc
        if not ok:
            raise RefreshError(f"{what} failed in the refresh process:\n{detail}")


def _serve(pipe: Any, config: StreamConfig, nice: int) -> None:
    """The child: answer each histories table with (True, None) once written, or (False, traceback)."""
    if nice:
        os.nice(nice)
    try:
        refresh = open_refresh(config)
    except Exception:
        pipe.send((False, traceback.format_exc()))
        return
    pipe.send((True, None))
    while True:
        try:
            encoded = pipe.recv_bytes()
        except EOFError:  # the job is over (or was killed)
            return
        try:
            refresh(_PIPE_CODER.decode(encoded))
            pipe.send((True, None))
        except Exception:
            pipe.send((False, traceback.format_exc()))


def open_refresh(config: StreamConfig) -> Callable[[pa.Table], None]:
    """``refresh(histories)`` in this process (:class:`RefreshProcess` runs it in a child): their
    representations, computed with ``config.model`` and written to ``config.store`` (the model,
    candidates and store are opened once, here)."""
    import torch

    from pipelines.model.checkpoint import load_model
    from pipelines.precompute.refresh import Refresher
    from pipelines.store import open_store

    assert config.model is not None and config.store is not None  # StreamConfig checks both
    torch.set_num_threads(config.torch_threads)  # more threads mostly spin against the reader and flusher
    model = load_model(config.model, device=config.device)
    candidates = load_recent_candidates(config.candidates, config.candidate_ttl_s) if config.candidates else None
    refresher = Refresher(model, model.model_version, candidates=candidates)
    store = open_store(config.store)

    def refresh(histories: pa.Table) -> None:
        started = time.perf_counter()
        table = refresher.refresh(histories, computed_at_ms=int(time.time() * 1000))
        store.write_batch(table)
        log.debug(
            "refreshed %d representations of %d users in %.3f s",
            table.num_rows,
            histories.num_rows,
            time.perf_counter() - started,
        )

    return refresh
