"""Snapshot commits: one writer at a time, a staging folder, a manifest written last, one atomic publish.

Every folder the project writes (features, replay, precompute, index, evaluate-fallback)
goes through :func:`staged_output`:

1. **Lock.** The writer takes ``.<name>.lock`` beside ``OUTPUT`` with ``flock`` (non-blocking);
   a second writer stops at once with :class:`OutputLockedError` naming the holder (pid, host,
   start time, command). The holder's line is written into a private file that is locked first
   and only then linked (or renamed over a dead holder's file) into place, so a lock file is never
   seen without its holder. The kernel drops an ``flock`` when its process dies, so a writer killed
   with ``kill -9`` never leaves the lock stuck. The lock file itself stays (the next writer
   replaces it under its old holder's lock). A symlinked ``OUTPUT`` is written at its target,
   under the target's lock, and stays a symlink.
2. **Recover.** Under the lock, leftovers of killed writers are cleared: ``OUTPUT.staging-*``
   folders are deleted; an ``OUTPUT.trash-*`` folder is deleted, or renamed back to ``OUTPUT``
   when ``OUTPUT`` is missing and the trash is committed (a writer killed between the two
   renames of the fallback publish below).
3. **Stage.** The run writes only into ``OUTPUT.staging-<runid>/`` beside ``OUTPUT``, a fresh
   folder: no file of an earlier run (say one with another ``--num-shards``) can survive into
   the new snapshot.
4. **Commit.** ``_COMMITTED`` is written last into the staging folder: JSON listing every file
   (relative path, bytes, rows for Parquet, CRC-32) and the run id. It is what readers check.
5. **Publish.** ``rename(staging, OUTPUT)`` when there is no ``OUTPUT`` (or only an empty one);
   with ``--overwrite``, ``renameat2(RENAME_EXCHANGE)`` swaps the two folders in one atomic step
   (Linux >= 3.15, ext4/xfs/btrfs/tmpfs) and the old one, now at ``OUTPUT.trash-<runid>``, is
   deleted. Where the exchange is unsupported, two renames (old -> trash, staging -> OUTPUT) leave
   a window of microseconds with no ``OUTPUT``; a reader then gets a clear "being replaced"
   error, and step 2 repairs a crash inside that window. Until the publish, the old snapshot is
   untouched and readable.

Why both a rename and a manifest: the rename makes a snapshot appear whole or not at all on a
local filesystem, so an interrupted run never changes what readers see; the manifest lets a
reader prove that what it is about to read is what was committed (a truncated or replaced file,
a half-copied folder, a folder from before this protocol, a run still in progress are all told
apart, each with its fix), and it is the one step that still works where rename is not atomic.

Object stores (``gs://``, ``s3://``): a "folder" is a key prefix and renaming it copies every
object, so there is no atomic rename. There the same code takes the manifest-last variant
(``mode="manifest"``): the run writes under ``OUTPUT/run-<runid>/``, and the commit is the single
PUT of ``OUTPUT/_COMMITTED`` naming that run folder (a PUT is atomic and, on GCS and S3,
read-after-write consistent). Readers go through the manifest and read only the files it lists
under the run folder it names, so files of an unfinished or older run are never read; the old
snapshot stays readable (its run folder and the old ``_COMMITTED``) until the new ``_COMMITTED``
replaces it, then the other ``run-*`` folders are deleted (and, when the next writer takes the
lock, those of writers that were killed). The lock there is a claim object with a lease under
``OUTPUT/_lock/`` (:mod:`pipelines.io.lease`), checked once more just before ``_COMMITTED`` is
written. Folder operations go through :mod:`pipelines.io.objects` (a prefix is a folder there).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

from apache_beam.io.filesystems import FileSystems

from pipelines.errors import ConfigError, OutputLockedError, OutputNotWritableError
from pipelines.io.files import join
from pipelines.io.lease import LOCK_DIR, ObjectLock, object_lock
from pipelines.io.objects import delete_tree, exists, is_local, list_tree, local_path
from pipelines.io.outputs import check_output
from pipelines.io.pause import pause_point

__all__ = [
    "COMMITTED",
    "CommitManifest",
    "FileEntry",
    "Mode",
    "commit_folder",
    "describe_files",
    "is_local",
    "read_commit",
    "real_path",
    "staged_output",
    "staging_leftovers",
    "writer_lock",
]

log = logging.getLogger(__name__)

COMMITTED = "_COMMITTED"
FORMAT = 1
Mode = Literal["rename", "manifest"]
_RENAME_EXCHANGE = 2
_CHUNK = 8 << 20


_local = local_path


@dataclass(frozen=True)
class FileEntry:
    """One committed file: ``path`` relative to the snapshot root, its size, rows (Parquet) and CRC-32."""

    path: str
    bytes: int
    crc32: str
    rows: int | None = None


@dataclass(frozen=True)
class CommitManifest:
    """``_COMMITTED``: what a snapshot holds, written last. ``root`` is where its files live,
    relative to the snapshot folder (``.``, or ``run-<id>`` in the manifest-last variant)."""

    run_id: str
    holds: str
    committed_at: str
    files: list[FileEntry]
    root: str = "."
    format: int = FORMAT
    command: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CommitManifest:
        data = json.loads(text)
        data["files"] = [FileEntry(**f) for f in data["files"]]
        return cls(**data)


def crc32_of(handle: IO[bytes]) -> str:
    crc = 0
    while chunk := handle.read(_CHUNK):
        crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _parquet_rows(path: str) -> int | None:
    import pyarrow.parquet as pq

    with FileSystems.open(path) as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


def _list_files(root: str) -> list[str]:
    """Every file under ``root``, relative to it, sorted (lock files and ``_COMMITTED`` left out)."""
    if is_local(root):
        base = Path(_local(root))
        names = [str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()]
    else:
        prefix = root.rstrip("/") + "/"
        names = [m.path[len(prefix) :] for r in FileSystems.match([prefix + "**"]) for m in r.metadata_list]
    return sorted(n for n in names if n != COMMITTED and not Path(n).name.endswith(".lock"))


def describe_files(root: str) -> list[FileEntry]:
    """A :class:`FileEntry` (size, CRC-32, Parquet rows) for every file under ``root``."""
    entries = []
    for name in _list_files(root):
        path = join(root, name)
        with FileSystems.open(path, compression_type="uncompressed") as f:
            crc = crc32_of(f)
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        rows = _parquet_rows(path) if name.endswith(".parquet") else None
        entries.append(FileEntry(name, int(size), crc, rows))
    return entries


def _command() -> str:
    """``python -m pipelines <command>`` when this process is the CLI (the manifest names its writer)."""
    is_cli = Path(sys.argv[0]).parent.name == "pipelines" and len(sys.argv) > 1
    return f"python -m pipelines {sys.argv[1]}" if is_cli else ""


def commit_folder(folder: str, *, holds: str, run_id: str | None = None, root: str = ".") -> CommitManifest:
    """Write ``folder/_COMMITTED`` listing every file under ``folder/root``; returns it."""
    manifest = CommitManifest(
        run_id=run_id or uuid.uuid4().hex[:12],
        holds=holds,
        committed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        files=describe_files(join(folder, root) if root != "." else folder),
        root=root,
        command=_command(),
    )
    path = join(folder, COMMITTED)
    if is_local(folder):
        tmp = Path(_local(path)).with_name(f".{COMMITTED}.{manifest.run_id}.tmp")
        tmp.write_text(manifest.to_json())
        os.replace(tmp, _local(path))  # a crash leaves the old manifest or the new one, never half of one
    else:
        with FileSystems.create(path) as f:
            f.write(manifest.to_json().encode())
    return manifest


def read_commit(folder: str) -> CommitManifest | None:
    """The ``_COMMITTED`` manifest of ``folder``, or None when it has none."""
    path = join(folder, COMMITTED)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return CommitManifest.from_json(f.read().decode())


def real_path(output: str) -> str:
    """Where a local ``output`` really lives (symlinks resolved: a symlinked output is written at its
    target, under the target's lock, and stays a symlink); an object-store path as given."""
    if not is_local(output):
        return output
    return os.path.realpath(_local(output).rstrip("/") or "/")


def _lock_path(output: str) -> Path:
    out = Path(real_path(output))
    return out.with_name(f".{out.name}.lock")


def _holder_text() -> str:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()} since {started} ({_command() or sys.argv[0]})\n"


def _same_file(handle: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the file open as ``handle`` (not replaced or removed since)."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _take_lock(path: Path, flag: str, output: str) -> IO[str]:
    """Take the lock file ``path``; returns its open, ``flock``-ed handle.

    The holder's line (pid, host, start, command) is written to a private file, which is
    ``flock``-ed and only then made visible at ``path`` (``link`` when there is no lock file,
    ``rename`` over the file of a holder that is gone): whoever finds the lock taken reads a
    complete line, never an empty file. A waiter that finds ``path`` replaced under it retries.
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mine = open(tmp, "w+")
    except OSError as exc:
        raise OutputNotWritableError(f"{flag} {output!r} is not writable ({exc})") from exc
    try:
        mine.write(_holder_text())
        mine.flush()
        fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else can know this file yet
        while True:
            try:
                os.link(tmp, path)
                return mine
            except FileExistsError:
                pass
            try:
                current = open(path)
            except FileNotFoundError:
                continue
            with current:
                try:
                    fcntl.flock(current, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not _same_file(current, path):
                        continue
                    holder = current.read().strip() or "another process"
                    raise OutputLockedError(
                        f"{flag} {output!r} is being written right now by {holder} (lock {path}). "
                        "Fix: wait for that run to finish, or write to another folder"
                    ) from None
                if _same_file(current, path):  # its holder is gone: put ours in its place
                    os.replace(tmp, path)
                    return mine
    except BaseException:
        mine.close()
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def writer_lock(output: str, flag: str = "--output") -> Iterator[ObjectLock | None]:
    """Hold the one-writer lock of ``output`` (see the module docstring); :class:`OutputLockedError` if taken.
    On an object store it yields the held :class:`~pipelines.io.lease.ObjectLock` (to check before
    committing), on a local path None."""
    if not is_local(output):
        with object_lock(output, flag, _command()) as lock:
            pause_point("lock-taken")
            yield lock
        return
    handle = _take_lock(_lock_path(output), flag, output)
    with handle:
        pause_point("lock-taken")
        try:
            yield None
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def staging_leftovers(output: str) -> list[Path]:
    """``OUTPUT.staging-*`` and ``OUTPUT.trash-*`` folders beside a local ``output`` (its real path)."""
    out = Path(real_path(output))
    if not out.parent.is_dir():
        return []
    ours = (f"{out.name}.staging-", f"{out.name}.trash-")  # run ids hold no dot: "out.v2.staging-x" is not ours
    return sorted(
        p
        for p in out.parent.glob(f"{out.name}.*-*")
        if p.name.startswith(ours) and "." not in p.name[len(out.name) + 1 :]
    )


def _recover(output: str) -> None:
    """Clear what killed writers left (call under the lock): see the module docstring, step 2."""
    out = Path(real_path(output))
    for left in staging_leftovers(output):
        if left.name.startswith(f"{out.name}.trash-") and not out.exists() and (left / COMMITTED).is_file():
            log.warning("restoring %s from %s (a writer was killed while publishing)", out, left)
            left.rename(out)
            continue
        log.info("removing %s (left by a killed or failed run)", left)
        shutil.rmtree(left, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def _publish(staging: Path, out: Path, run_id: str) -> None:
    """Make ``staging`` the folder at ``out`` in one atomic step (step 5 of the module docstring)."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        staging.rename(out)
        return
    trash = out.with_name(f"{out.name}.trash-{run_id}")
    if not _exchange(staging, out):
        out.rename(trash)
        staging.rename(out)
    else:
        staging.rename(trash)  # after the exchange, the staging path holds the old snapshot
    shutil.rmtree(trash, ignore_errors=True)


def _refuse_existing(output: str, *, overwrite: bool, holds: str, flag: str) -> None:
    if overwrite or not exists(output):
        return
    if read_commit(output) is not None:
        raise ConfigError(flag, f"{output!r} already holds {holds}", "pass --overwrite or choose a new folder")
    if _foreign_files(output):
        raise ConfigError(
            flag,
            f"{output!r} holds files but no committed snapshot ({COMMITTED} missing)",
            "pass --overwrite to replace them (they are kept until the new snapshot is committed) "
            "or choose a new folder",
        )


def _foreign_files(output: str) -> bool:
    """Whether folder ``output`` holds files that are not this protocol's (run folders, lock claims)."""
    if is_local(output):
        return Path(_local(output)).is_dir() and any(Path(_local(output)).iterdir())
    prefix = output.rstrip("/") + "/"
    return any(not p[len(prefix) :].startswith(("run-", f"{LOCK_DIR}/")) for p in list_tree(output))


@dataclass
class Staging:
    """Where a run writes (``root``) and how it will be published."""

    output: str
    root: str
    run_id: str
    mode: Mode
    holds: str


@contextmanager
def staged_output(
    output: str,
    *,
    overwrite: bool,
    holds: str,
    flag: str = "--output",
    mode: Mode | None = None,
    inputs: Iterable[tuple[str, str | None]] = (),
) -> Iterator[Staging]:
    """Check ``output`` against the run's ``inputs`` (:func:`pipelines.io.outputs.check_output`),
    lock it, yield a :class:`Staging` to write into, then commit and publish it.

    When the body raises, nothing is published and the staging folder is removed: readers
    keep seeing what ``output`` held before (or nothing).
    """
    check_output(output, inputs, flag=flag)
    mode = mode or ("rename" if is_local(output) else "manifest")
    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    with writer_lock(output, flag) as lock:
        if is_local(output):
            _recover(output)
        else:
            _drop_other_runs(output, keep=_committed_root(output))
        _refuse_existing(output, overwrite=overwrite, holds=holds, flag=flag)
        if mode == "rename":
            root = f"{real_path(output)}.staging-{run_id}"
            Path(root).mkdir(parents=True)
        else:
            root = join(output, f"run-{run_id}")
            FileSystems.mkdirs(root)
        staging = Staging(output, root, run_id, mode, holds)
        try:
            yield staging
        except BaseException:
            _discard(root)
            raise
        pause_point("before-commit")
        started = time.perf_counter()
        if mode == "rename":
            commit_folder(root, holds=holds, run_id=run_id)
            _publish(Path(root), Path(real_path(output)), run_id)
        else:
            if lock is not None:
                lock.check()  # the fence: never commit after losing the lock (lease.py, step 4)
            commit_folder(output, holds=holds, run_id=run_id, root=f"run-{run_id}")
            _drop_other_runs(output, keep=f"run-{run_id}")
        log.info("committed %s (%s): commit and publish took %.3f s", output, holds, time.perf_counter() - started)


def _discard(root: str) -> None:
    try:
        delete_tree(root)
    except Exception:  # best effort: the next writer clears leftovers under the lock
        log.warning("could not remove %s", root, exc_info=True)


def _committed_root(output: str) -> str | None:
    manifest = read_commit(output)
    return manifest.root if manifest is not None else None


def _drop_other_runs(output: str, keep: str | None) -> None:
    """Delete the ``run-*`` folders of ``output`` other than ``keep`` (older runs, or ones whose writer
    was killed or failed; call under the lock)."""
    if is_local(output):
        runs = {p.name for p in Path(_local(output)).glob("run-*")}
    else:
        prefix = output.rstrip("/") + "/"
        runs = {p[len(prefix) :].split("/", 1)[0] for p in list_tree(output) if p[len(prefix) :].startswith("run-")}
    for run in sorted(runs - {keep}):
        log.info("removing %s (an older run, or one left by a killed or failed writer)", join(output, run))
        delete_tree(join(output, run))
