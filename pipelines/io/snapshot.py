"""The snapshot kernel: the folder every batch stage writes, the one way a run fills it, the one way to read it.

A snapshot folder holds one sub-folder per kind of output (``histories/``,
``representations/``, ...; sharded as :mod:`pipelines.io.shards` says),
``dead_letters/``, ``summary.json`` with the run's counters and ``_COMMITTED``,
the manifest written last (:mod:`pipelines.io.commit`: lock, staging folder,
atomic publish). :func:`run_stage` is the tail every batch stage shares: lock
the output, run the pipeline into a staging folder, read the summary back,
check its record balance, commit and publish. :func:`open_snapshot` is how
every reader opens one: it refuses a folder that is not committed or whose
files are not the committed ones, with an error that names the fix.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.dataflow_job import is_dry_run, write_dry_run
from pipelines.errors import InputNotFoundError, OutputNotWritableError, SnapshotError
from pipelines.io.commit import (
    COMMITTED,
    FORMAT,
    CommitManifest,
    FileEntry,
    crc32_of,
    is_local,
    read_commit,
    staged_output,
    staging_leftovers,
)
from pipelines.io.files import join
from pipelines.io.summary import Balance, read_summary

__all__ = [
    "COUNTS",
    "DEAD",
    "DEAD_LETTERS",
    "EVENTS",
    "HISTORIES",
    "REPRESENTATIONS",
    "TRAINING_EXAMPLES",
    "Snapshot",
    "check_writable",
    "open_snapshot",
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
    build: Callable[[beam.Pipeline, str], None],
    *,
    holds: str,
    overwrite: bool,
    balance: Balance,
    options: PipelineOptions,
    runner: object | None = None,
) -> dict:
    """Lock ``output``, run ``build(pipeline, root)`` writing into a staging ``root``, check the
    summary's ``balance``, then commit and publish (see :mod:`pipelines.io.commit`). Returns the
    summary with ``seconds`` added. On any failure nothing is published. A Dataflow dry run
    returns the job it built instead (see :mod:`pipelines.dataflow_job`)."""
    if is_dry_run(options):  # a job graph, built offline: no outputs to stage or read back
        with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
            build(p, output)
        return write_dry_run(p.result, options, output)
    with staged_output(output, overwrite=overwrite, holds=holds) as staging:
        check_writable(staging.root)
        started = time.perf_counter()
        with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
            build(p, staging.root)
        summary = read_summary(staging.root)
        summary["seconds"] = round(time.perf_counter() - started, 3)
        balance.check(summary)
    return summary


@dataclass(frozen=True)
class Snapshot:
    """A committed snapshot: its ``folder``, the ``root`` its files live under, its manifest."""

    folder: str
    root: str
    manifest: CommitManifest

    def files(self, kind: str, suffix: str = ".parquet") -> list[str]:
        """The committed files of one kind (``histories``, ...), sorted; never a file the commit does not list."""
        return [
            join(self.root, f.path)
            for f in self.manifest.files
            if f.path.startswith(f"{kind}/") and f.path.endswith(suffix)
        ]

    def path(self, name: str) -> str:
        return join(self.root, name)

    def has(self, name: str) -> bool:
        return any(f.path == name for f in self.manifest.files)

    def summary(self) -> dict:
        return read_summary(self.root)


def open_snapshot(folder: str, *, flag: str, writer: str, deep: bool | None = None) -> Snapshot:
    """The committed snapshot at ``folder``; :class:`SnapshotError` (naming ``flag`` and the fix:
    run ``writer``) when it is missing, uncommitted, or its files differ from the commit.

    Every listed file must exist with its committed size; with ``deep`` (default: on local
    paths) its CRC-32 is checked too (one read of every byte; on object stores only sizes
    are compared, the driver does not download the snapshot).
    """
    folder = folder.rstrip("/") or folder
    if not FileSystems.exists(folder):
        _missing(folder, flag, writer)
    manifest = read_commit(folder)
    if manifest is None:
        raise SnapshotError(
            f"{flag} {folder!r} is not a committed snapshot (no {COMMITTED}): a run was interrupted, a copy is "
            f"incomplete, or an older version wrote it. Fix: rerun `{writer}` with --output {folder} --overwrite"
        )
    if manifest.format != FORMAT:
        raise SnapshotError(
            f"{flag} {folder!r}: commit format {manifest.format}, this code reads {FORMAT}. Fix: rerun `{writer}`"
        )
    root = folder if manifest.root == "." else join(folder, manifest.root)
    bad = _mismatches(root, manifest.files, is_local(folder) if deep is None else deep)
    if bad:
        raise SnapshotError(
            f"{flag} {folder!r} does not match its commit ({len(bad)} of {len(manifest.files)} files): "
            f"{'; '.join(bad[:3])}. Fix: rerun `{writer}` with --output {folder} --overwrite, "
            "or restore the folder from a complete copy"
        )
    return Snapshot(folder, root, manifest)


def _missing(folder: str, flag: str, writer: str) -> None:
    left = staging_leftovers(folder) if is_local(folder) else []
    if any(".trash-" in p.name for p in left):
        raise SnapshotError(
            f"{flag} {folder!r} is being replaced by an --overwrite run. Fix: retry in a moment; if it stays "
            f"missing, rerun `{writer}` (it restores the last committed snapshot first)"
        )
    if left:
        raise SnapshotError(
            f"{flag} {folder!r} has no committed snapshot yet: {left[0]} is a run writing it now or one that "
            f"was killed. Fix: wait for that run to finish, or rerun `{writer}` (it clears the leftover)"
        )
    raise InputNotFoundError(f"{flag} {folder!r} does not exist. Fix: pass the --output folder of `{writer}`")


def _mismatches(root: str, files: Sequence[FileEntry], deep: bool) -> list[str]:
    bad: list[str] = []
    sizes = _sizes(root, [f.path for f in files])
    for entry in files:
        size = sizes.get(entry.path)
        if size is None:
            bad.append(f"{entry.path} is missing")
        elif size != entry.bytes:
            bad.append(f"{entry.path} is {size} bytes, committed {entry.bytes} (truncated or changed)")
        elif deep and (crc := _crc32_of_path(root, entry.path)) != entry.crc32:
            bad.append(f"{entry.path} has CRC-32 {crc}, committed {entry.crc32} (changed after the commit)")
    return bad


def _crc32_of_path(root: str, name: str) -> str:
    with FileSystems.open(join(root, name), compression_type="uncompressed") as f:
        return crc32_of(f)


def _sizes(root: str, names: Sequence[str]) -> dict[str, int]:
    if is_local(root):
        base = root.removeprefix("file://")
        found = {}
        for name in names:
            try:
                found[name] = os.stat(join(base, name)).st_size
            except FileNotFoundError:
                continue
        return found
    results = FileSystems.match([join(root, n) for n in names])
    return {n: r.metadata_list[0].size_in_bytes for n, r in zip(names, results, strict=True) if r.metadata_list}
