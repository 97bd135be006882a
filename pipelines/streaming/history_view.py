"""The latest history of each user, read from outside the graph (the Solaris benches' baselines): the
streaming job's flush files, or a features snapshot.

A folder written by ``stream`` (``DIR/histories/shard=*/flush-*|full-*.parquet``, or
still empty) is followed: every ``refresh_s`` the view lists the shards' files again and reads only the
new ones (:class:`pipelines.streaming.state.ShardStates`, the streaming job's own
reader), so a pair computed now sees the events flushed up to a moment ago. A features
snapshot (``DIR/histories/shard=*/part-*.parquet``) is read once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.errors import ConfigError
from pipelines.io.files import match_files
from pipelines.io.parquet import read_table
from pipelines.io.shards import SHARD_GLOB, kind_glob
from pipelines.io.snapshot import HISTORIES
from pipelines.schemas.layouts import HISTORY
from pipelines.streaming.state import ShardHistories, ShardStates, newest_rows

__all__ = ["HistoryView", "check_histories"]

log = logging.getLogger(__name__)


def check_histories(folder: str) -> None:
    """``--histories`` must be a folder (a stream's output, perhaps not flushed yet, or a features snapshot)."""
    if not Path(folder).is_dir():
        raise ConfigError(
            "--histories", f"{folder} is not a folder", "pass the --output folder of `stream` or of `features`"
        )


class HistoryView:
    """``rows(user_ids)``: the HISTORY rows of those users that have one (sorted by user)."""

    def __init__(self, folder: str, *, refresh_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self._folder, self._refresh_s, self._clock = folder, refresh_s, clock
        self._states = ShardStates()
        self._lock = threading.Lock()
        check_histories(folder)
        self._streamed = not _is_snapshot(folder)  # a stream's folder may have no flush file yet
        self._table = HISTORY.schema.empty_table()  # a snapshot's histories
        self._shards: list[ShardHistories] = []  # a stream's, per shard
        self._loaded_at = -float("inf")
        self._load()

    @property
    def num_users(self) -> int:
        return sum(h.num_users for h in self._shards) if self._streamed else self._table.num_rows

    def rows(self, user_ids: np.ndarray) -> pa.Table:
        """The current history rows of ``user_ids`` (reloading the flush files when due)."""
        if self._streamed and self._clock() - self._loaded_at >= self._refresh_s:
            self._load()
        users = np.unique(user_ids)
        if self._streamed:
            with self._lock:
                found = [h.rows_of(users) for h in self._shards]
            table = pa.concat_tables([HISTORY.schema.empty_table(), *found])
            return table.take(pc.sort_indices(table, [("user_id", "ascending")]))
        table = self._table
        return table.filter(pc.is_in(table.column("user_id"), value_set=pa.array(users)))

    def _load(self) -> None:
        with self._lock:
            if self._streamed:
                shards = sorted(Path(self._folder, HISTORIES).glob(SHARD_GLOB))
                self._shards = [self._states.open(self._folder, int(s.name.split("=")[1])) for s in shards]
            else:
                files = match_files(kind_glob(self._folder, HISTORIES))
                self._table = newest_rows([read_table(f, HISTORY) for f in files])
            self._loaded_at = self._clock()


def _is_snapshot(folder: str) -> bool:
    """A features snapshot: its shards hold ``part-`` files (a stream's hold flush and full files)."""
    return any(p.name.startswith("part-") for p in Path(folder, HISTORIES).glob(f"{SHARD_GLOB}/*.parquet"))
