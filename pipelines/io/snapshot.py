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
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

import apache_beam as beam
import pyarrow as pa
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
from pipelines.io.objects import copy_file, delete_object, exists, list_tree
from pipelines.io.parquet import check_layout, read_file
from pipelines.io.pins import pin_snapshot, release
from pipelines.io.summary import Balance, read_summary
from pipelines.schemas.layouts import Layout

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
    "local_copy",
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
        delete_object(probe)
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
    reads: Sequence[Snapshot | None] = (),
    inputs: Iterable[tuple[str, str | None]] = (),
) -> dict:
    """Lock ``output``, run ``build(pipeline, root)`` writing into a staging ``root``, check the
    summary's ``balance``, then commit and publish (see :mod:`pipelines.io.commit`). Returns the
    summary with ``seconds`` added. On any failure nothing is published. A Dataflow dry run
    returns the job it built instead (see :mod:`pipelines.dataflow_job`). The snapshots the run
    ``reads`` stay pinned until it ends, then are released; ``output`` must not be one of the
    ``inputs`` (``(flag, path)`` pairs), hold one or lie inside one."""
    try:
        if is_dry_run(options):  # a job graph, built offline: no outputs to stage or read back
            with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
                build(p, output)
            return write_dry_run(p.result, options, output)
        with staged_output(output, overwrite=overwrite, holds=holds, inputs=inputs) as staging:
            check_writable(staging.root)
            started = time.perf_counter()
            with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
                build(p, staging.root)
            summary = read_summary(staging.root)
            summary["seconds"] = round(time.perf_counter() - started, 3)
            balance.check(summary)
        return summary
    finally:
        for snapshot in reads:
            if snapshot is not None:
                snapshot.release()


@dataclass(frozen=True)
class Snapshot:
    """A committed snapshot as checked: its ``folder``, the ``root`` its files are read under (a
    reader's pin, see :mod:`pipelines.io.pins`, or where they live) and its manifest. Picklable:
    workers read through :meth:`read_bytes` / :meth:`read_table`, which check each file against
    the commit, so a file replaced after the check is an error, never a mixed read."""

    folder: str
    root: str
    manifest: CommitManifest
    flag: str = "--input"
    writer: str = "the command that wrote it"
    pin: str | None = None

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

    def has_path(self, path: str) -> bool:
        """Whether the commit lists the file at ``path`` (under :attr:`root`)."""
        return self.has(self._name(path))

    def _name(self, path: str) -> str:
        return path[len(self.root) :].lstrip("/") if path.startswith(self.root) else path

    def summary(self) -> dict:
        return read_summary(self.root)

    def read_bytes(self, path: str) -> bytes:
        """The bytes of the committed file at ``path`` (under :attr:`root`), checked against the
        commit (size and CRC-32); :class:`SnapshotError` naming the cause when they differ."""
        name = self._name(path)
        entry = next((f for f in self.manifest.files if f.path == name), None)
        if entry is None:
            self._changed(name, "is not in its commit")
        try:
            with FileSystems.open(self.path(name), compression_type="uncompressed") as f:
                data = f.read()
        except OSError as exc:
            self._changed(name, f"is gone ({exc})")
        if len(data) != entry.bytes:
            self._changed(name, f"is {len(data)} bytes, committed {entry.bytes}")
        if (crc := f"{zlib.crc32(data):08x}") != entry.crc32:
            self._changed(name, f"has CRC-32 {crc}, committed {entry.crc32}")
        return data

    def read_table(self, path: str, layout: Layout | None = None) -> pa.Table:
        """The Parquet file at ``path``, checked as :meth:`read_bytes` says (and its layout, if given)."""
        table = read_file(self.read_bytes(path))
        if layout is not None:
            check_layout(table.schema, layout, path)
        return table

    def release(self) -> None:
        """Let go of the reader's pin (else it goes at exit)."""
        if self.pin is not None:
            release(self.pin)

    def _changed(self, name: str, problem: str) -> NoReturn:
        raise SnapshotError(
            f"{self.flag} {self.folder!r} changed while this run read it: {name} {problem} (snapshot of run "
            f"{self.manifest.run_id}, checked when the run started; a writer replaced or altered it since). "
            f"Fix: rerun this command once `{self.writer}` has finished writing {self.folder}"
        )


def open_snapshot(folder: str, *, flag: str, writer: str, deep: bool | None = None, pin: bool = True) -> Snapshot:
    """The committed snapshot at ``folder``; :class:`SnapshotError` (naming ``flag`` and the fix:
    run ``writer``) when it is missing, uncommitted, or its files differ from the commit.

    Every listed file must exist with its committed size; with ``deep`` (default: on local
    paths) its CRC-32 is checked too (one read of every byte; on object stores only sizes
    are compared, the driver does not download the snapshot).
    """
    folder = folder.rstrip("/") or folder
    if not exists(folder):
        _missing(folder, flag, writer)
    manifest = read_commit(folder)
    pinned = pin_snapshot(folder, flag=flag) if pin and manifest is not None and is_local(folder) else None
    held = None
    if pinned is not None:
        held, manifest = pinned
    if manifest is None:
        _uncommitted_runs(folder, flag, writer)
        raise SnapshotError(
            f"{flag} {folder!r} is not a committed snapshot (no {COMMITTED}): a run was interrupted, a copy is "
            f"incomplete, or an older version wrote it. Fix: rerun `{writer}` with --output {folder} --overwrite"
        )
    if manifest.format != FORMAT:
        raise SnapshotError(
            f"{flag} {folder!r}: commit format {manifest.format}, this code reads {FORMAT}. Fix: rerun `{writer}`"
        )
    base = held or folder
    root = base if manifest.root == "." else join(base, manifest.root)
    bad = _mismatches(root, manifest.files, is_local(folder) if deep is None else deep)
    if bad:
        if held is not None:
            release(held)
        raise SnapshotError(
            f"{flag} {folder!r} does not match its commit ({len(bad)} of {len(manifest.files)} files): "
            f"{'; '.join(bad[:3])}. Fix: rerun `{writer}` with --output {folder} --overwrite, "
            "or restore the folder from a complete copy"
        )
    return Snapshot(folder, root, manifest, flag, writer, held)


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


def _uncommitted_runs(folder: str, flag: str, writer: str) -> None:
    """On an object store: refuse a folder whose only snapshot is a run folder with no commit yet."""
    if is_local(folder):
        return
    prefix = folder.rstrip("/") + "/"
    runs = sorted({p[len(prefix) :].split("/", 1)[0] for p in list_tree(folder) if p[len(prefix) :].startswith("run-")})
    if runs:
        raise SnapshotError(
            f"{flag} {folder!r} has no committed snapshot yet: {join(folder, runs[-1])} is a run writing it now or "
            f"one that was killed. Fix: wait for that run to finish, or rerun `{writer}` (it clears the leftover)"
        )


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


def local_copy(snapshot: Snapshot, target: str, *, flag: str, writer: str) -> Snapshot:
    """Download the committed files of ``snapshot`` (an object store's) into the new local folder
    ``target``, commit it there, and open it (every byte CRC-checked against the commit). For readers
    that need local files (FAISS)."""
    for entry in snapshot.manifest.files:
        copy_file(join(snapshot.root, entry.path), join(target, entry.path))
    manifest = replace(snapshot.manifest, root=".")
    with open(join(target, COMMITTED), "w") as f:
        f.write(manifest.to_json())
    return open_snapshot(target, flag=flag, writer=writer, deep=True, pin=False)
