"""The snapshot kernel: the folder every batch stage writes, and the one way a run fills it.

A snapshot folder holds one sub-folder per kind of output (``histories/``,
``representations/``, ...; sharded as :mod:`pipelines.io.shards` says),
``dead_letters/`` and ``summary.json`` with the run's counters.
:func:`run_stage` is the tail every batch stage shares: prepare the folder,
run the pipeline, read the summary back and check its record balance.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.errors import ConfigError, OutputNotWritableError
from pipelines.io.files import join
from pipelines.io.summary import SUMMARY, Balance, read_summary

__all__ = [
    "COUNTS",
    "DEAD",
    "DEAD_LETTERS",
    "EVENTS",
    "HISTORIES",
    "REPRESENTATIONS",
    "TRAINING_EXAMPLES",
    "check_writable",
    "prepare_output",
    "run_stage",
]

#: Tagged outputs of a read step: (shard, table) pairs, DEAD_LETTER tables, count dicts.
EVENTS, DEAD, COUNTS = "events", "dead_letters", "counts"
#: The kinds of output a snapshot folder holds (one sub-folder each); every snapshot has dead letters.
HISTORIES, TRAINING_EXAMPLES, REPRESENTATIONS, DEAD_LETTERS = (
    "histories",
    "training_examples",
    "representations",
    "dead_letters",
)


def prepare_output(directory: str, subdirs: Sequence[str], *, overwrite: bool, holds: str) -> None:
    """Refuse a folder that already holds a run's ``summary.json`` unless ``overwrite``; prove it is
    writable; with ``overwrite`` remove the ``subdirs`` the run is about to write again."""
    if FileSystems.exists(join(directory, SUMMARY)) and not overwrite:
        raise ConfigError("--output", f"{directory!r} already holds {holds}", "pass --overwrite or choose a new folder")
    check_writable(directory)
    if overwrite:
        stale = [join(directory, sub) for sub in subdirs if FileSystems.exists(join(directory, sub))]
        if stale:
            FileSystems.delete(stale)


def check_writable(directory: str, flag: str = "--output") -> None:
    """Create ``directory`` if needed and prove a file can be written there."""
    probe = f"{directory.rstrip('/')}/.write-probe-{uuid.uuid4().hex}"
    try:
        if not FileSystems.exists(directory):
            FileSystems.mkdirs(directory)
        with FileSystems.create(probe) as f:
            f.write(b"ok")
        FileSystems.delete([probe])
    except Exception as exc:
        raise OutputNotWritableError(f"{flag} {directory!r} is not writable ({exc})") from exc


def run_stage(
    output: str,
    build: Callable[[beam.Pipeline], None],
    *,
    kinds: Sequence[str],
    holds: str,
    overwrite: bool,
    balance: Balance,
    options: PipelineOptions,
    runner: object | None = None,
) -> dict:
    """Prepare ``output`` (its ``kinds`` sub-folders), run ``build``'s pipeline, and return the
    summary it wrote, with ``seconds`` added, once its ``balance`` holds."""
    prepare_output(output, kinds, overwrite=overwrite, holds=holds)
    started = time.perf_counter()
    with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
        build(p)
    summary = read_summary(output)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    balance.check(summary)
    return summary
