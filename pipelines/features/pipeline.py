"""The features pipeline: read → validate → deduplicate → histories + training examples.

:func:`build_features` adds the steps to a Beam pipeline; :func:`run_features`
validates the configuration before any work, runs it and checks the counters
(records in = valid + duplicates + dead letters).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.errors import ConfigError
from pipelines.features.examples import LabelWindows
from pipelines.features.parse import MAX_TIME_MS
from pipelines.features.sources import ReadEvents
from pipelines.features.transforms import BuildHistories
from pipelines.features.validate import check_columns
from pipelines.io.files import expand_inputs, splits_of
from pipelines.io.snapshot import COUNTS, DEAD, EVENTS, HISTORIES, Snapshot, open_snapshot, run_stage
from pipelines.io.summary import Balance, sum_counts
from pipelines.io.transforms import WriteDeadLetters, WriteSummary
from pipelines.schemas.layouts import HISTORY
from pipelines.settings import MAX_FUTURE, MAX_HISTORY, NUM_SHARDS

log = logging.getLogger(__name__)

WRITER = "python -m pipelines features"
#: Records in = valid + duplicates (within the run and against --previous) + dead letters.
RECORDS = Balance("record", "records_in", ("events_valid", "duplicates", "duplicates_previous", "dead_letters"))
#: Counts every summary holds, zero when nothing was read (an empty input still gives all of them).
ZERO_COUNTS = {k: 0 for k in (RECORDS.total, *RECORDS.parts, "histories", "training_examples", "bad_files")}


@dataclass(frozen=True)
class FeaturesConfig:
    """Everything the features pipeline needs; validated on construction."""

    inputs: Sequence[str]
    output: str
    previous: str | None = None
    max_history: int = MAX_HISTORY.default
    num_shards: int = NUM_SHARDS.default
    windows: LabelWindows = field(default_factory=LabelWindows)
    overwrite: bool = False
    #: Events later than the run's clock plus this become ``future_time`` dead letters.
    max_future_ms: int = MAX_FUTURE.ms
    #: With it, a file that cannot be read is recorded (summary, dead letter) instead of failing the run.
    skip_bad_files: bool = False
    #: The run's clock (seconds since the epoch); injectable for tests.
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ConfigError("--input", "no input given", "pass one or more files or globs")
        MAX_HISTORY.check(self.max_history)
        NUM_SHARDS.check(self.num_shards)
        if self.previous and self.previous.rstrip("/") == self.output.rstrip("/"):
            raise ConfigError("--previous", "is the same folder as --output", "write the new snapshot to a new folder")
        if self.max_future_ms < 0:
            raise ConfigError("--max-future", f"got {self.max_future_ms} ms", "pass a duration such as 1d or 2h")

    def max_time_ms(self) -> int:
        """The latest event time this run accepts: its clock now plus ``max_future_ms``."""
        return min(int(self.clock() * 1000) + self.max_future_ms, MAX_TIME_MS)


def previous_snapshot(previous: str | None) -> Snapshot | None:
    """The ``--previous`` snapshot, pinned (refused unless committed, intact and holding histories)."""
    if not previous:
        return None
    snapshot = open_snapshot(previous, flag="--previous", writer=WRITER)
    if not snapshot.files(HISTORIES):
        snapshot.release()
        raise ConfigError(
            "--previous",
            f"{previous!r} holds no histories/shard=*/*.parquet",
            "point it at the --output folder of an earlier features run",
        )
    return snapshot


def build_features(
    p: beam.Pipeline,
    config: FeaturesConfig,
    splits: Sequence,
    previous: Sequence[str],
    source: beam.PTransform | None = None,
    max_time_ms: int = MAX_TIME_MS,
    root: str | None = None,
) -> None:
    """Add the features steps to ``p``, writing under ``root`` (default ``config.output``; run_stage
    passes its staging folder).

    ``source`` replaces the file source: any PTransform with ReadEvents' tagged
    outputs (e.g. ``pipelines.features.sources.ReadEventsFromKafka``); ``splits`` is then unused.
    """
    root = root or config.output
    if source is None:
        source = ReadEvents(
            splits, num_shards=config.num_shards, max_time_ms=max_time_ms, skip_bad_files=config.skip_bad_files
        )
    read = p | "ReadEvents" >> source
    read_counts = read[COUNTS] | "SumReadCounts" >> beam.CombineGlobally(sum_counts)
    built = read[EVENTS] | "BuildHistories" >> BuildHistories(
        root,
        beam.pvalue.AsSingleton(read_counts),
        previous=previous,
        num_shards=config.num_shards,
        max_history=config.max_history,
        windows=config.windows,
    )
    _ = read[DEAD] | "WriteDeadLetters" >> WriteDeadLetters(root)
    extra: dict[str, Any] = {
        "inputs": list(config.inputs),
        "previous": config.previous,
        "max_history": config.max_history,
        "num_shards": config.num_shards,
        "layout_version": HISTORY.version,
        "max_event_time_ms": max_time_ms,
        **ZERO_COUNTS,
    }
    _ = (read_counts, built) | "AllCounts" >> beam.Flatten() | "WriteSummary" >> WriteSummary(root, extra)


def run_features(
    config: FeaturesConfig,
    options: PipelineOptions,
    runner: object | None = None,
    source: beam.PTransform | None = None,
) -> dict:
    """Validate, run, and return the summary (also written to ``<output>/summary.json``).

    With ``source`` (see :func:`build_features`) ``config.inputs`` only label the summary,
    and ``source`` must bound event times itself (``config.max_time_ms()``).
    """
    paths = expand_inputs(config.inputs) if source is None else []
    splits = splits_of(paths, check=check_columns, skip_bad=config.skip_bad_files)
    max_time_ms = config.max_time_ms()
    snapshot = previous_snapshot(config.previous)
    previous = snapshot.files(HISTORIES) if snapshot else []
    log.info("features: %d file(s), %d split(s), %d previous file(s)", len(paths), len(splits), len(previous))
    return run_stage(
        config.output,
        lambda p, root: build_features(p, config, splits, previous, source, max_time_ms, root),
        holds="a features snapshot",
        overwrite=config.overwrite,
        balance=RECORDS,
        options=options,
        runner=runner,
        reads=[snapshot],
        inputs=[*(("--input", path) for path in paths), ("--previous", config.previous)],
    )
