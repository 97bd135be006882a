"""Reader pins: a reader keeps the snapshot it checked readable until it is done, whatever writers do.

A local snapshot is replaced by swapping folders (:mod:`pipelines.io.commit`, step 5) and the old
one is deleted at once; a reader whose workers open files by path after its check would then read
the new snapshot's files, or none. So :func:`pin_snapshot` hard-links the files of the committed
snapshot into a folder of this reader's own, ``.<name>.readers/<random>-<pid>/`` beside
it, and the reader reads from there: a link is a second name of the same immutable file, so the
data stays on disk, unchanged, until the reader releases the pin (at exit, or :func:`release`),
even after a writer has deleted the old snapshot. Linking costs one system call per file and no
copy.

``_COMMITTED`` is linked first and the files it lists after it; the pin is kept only when the
snapshot's ``_COMMITTED`` is still the same file (inode) once every link is made, so every pinned
file comes from the one snapshot that manifest describes (otherwise it is dropped and made again).

A pin's folder is ``flock``-ed by its reader for as long as it reads (it is locked under a
temporary name, then renamed into place): a reader killed with ``kill -9`` loses the lock, and the
next pin of that snapshot deletes its folder. Where links cannot be made (another file system, a
read-only folder, a file owned by another user), the reader reads the snapshot in place, unpinned,
and the checks where each file is opened (size and CRC-32 against the commit) make a replaced file
a clear error instead of a mixed read.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import uuid
from pathlib import Path

from pipelines.errors import SnapshotError
from pipelines.io.commit import COMMITTED, CommitManifest, real_path

__all__ = ["pin_snapshot", "readers_folder", "release"]

log = logging.getLogger(__name__)

_TRIES = 5
_PINS: dict[str, int] = {}  # pin folder -> the open descriptor that holds its flock


def readers_folder(folder: str) -> Path:
    """``.<name>.readers`` beside the snapshot's real path: where its readers' pins live."""
    out = Path(real_path(folder))
    return out.with_name(f".{out.name}.readers")


def pin_snapshot(folder: str, *, flag: str) -> tuple[str, CommitManifest] | None:
    """Pin the committed snapshot at local ``folder``: ``(pin folder, its manifest)``, read from the
    pin folder as if it were the snapshot; None where links cannot be made (read in place then)."""
    readers = readers_folder(folder)
    try:
        _sweep(readers)
    except OSError:
        return None
    for _ in range(_TRIES):
        try:
            pinned = _pin_once(Path(real_path(folder)), readers)
        except OSError as exc:
            log.info(
                "%s %s: cannot pin it (%s); reading it in place, each file checked as it is opened", flag, folder, exc
            )
            return None
        if pinned is not None:
            return pinned
    raise SnapshotError(
        f"{flag} {folder!r} was replaced {_TRIES} times while this run pinned it. "
        "Fix: retry once the runs writing it with --overwrite are done"
    )


def release(pin: str) -> None:
    """Drop the pin at ``pin`` (its files go when no other name holds them)."""
    held = _PINS.pop(pin, None)
    shutil.rmtree(pin, ignore_errors=True)
    if held is not None:
        os.close(held)
    try:
        Path(pin).parent.rmdir()  # the last reader out removes .<name>.readers
    except OSError:
        pass


def _lock_dir(path: Path, *, wait: bool) -> int | None:
    """An open descriptor of the folder ``path`` holding its ``flock``; None when another holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _new_pin(readers: Path) -> Path:
    """A new, locked, empty pin folder (locked under a temporary name: a sweep never takes it)."""
    name = f"{uuid.uuid4().hex[:12]}-{os.getpid()}"
    tmp, pin = readers / f"tmp-{name}", readers / name
    tmp.mkdir(parents=True)
    fd = _lock_dir(tmp, wait=True)
    assert fd is not None
    try:
        tmp.rename(pin)  # FileNotFoundError: a sweep took it before the lock; the caller retries
    except BaseException:
        os.close(fd)
        raise
    _PINS[str(pin)] = fd
    return pin


def _pin_once(out: Path, readers: Path) -> tuple[str, CommitManifest] | None:
    pin: Path | None = None
    try:
        pin = _new_pin(readers)
        os.link(out / COMMITTED, pin / COMMITTED)
        manifest = CommitManifest.from_json((pin / COMMITTED).read_text())
        src, dst = out / manifest.root, pin / manifest.root
        for entry in manifest.files:
            (dst / entry.path).parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # missing from the snapshot: the check names it
                os.link(src / entry.path, dst / entry.path)
        if os.stat(out / COMMITTED).st_ino != os.stat(pin / COMMITTED).st_ino:
            raise FileNotFoundError(out / COMMITTED)  # a writer published meanwhile
    except FileNotFoundError:  # a snapshot replaced meanwhile (or a sweep): pin the current one whole
        if pin is not None:
            release(str(pin))
        return None
    except BaseException:
        if pin is not None:
            release(str(pin))
        raise
    return str(pin), manifest


def _sweep(readers: Path) -> None:
    """Delete the pins of readers that are gone (their folder's lock is free)."""
    if not readers.is_dir():
        return
    for pin in readers.iterdir():
        if str(pin) in _PINS:
            continue
        try:
            fd = _lock_dir(pin, wait=False)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if fd is not None:
            shutil.rmtree(pin, ignore_errors=True)
            os.close(fd)


@atexit.register
def _release_all() -> None:
    for pin in list(_PINS):
        release(pin)
