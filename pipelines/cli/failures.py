"""Known failure classes, turned into one ``error: ... Fix: ...`` line by the CLI's top-level handler.

:func:`explain` looks through an exception and its causes (Beam re-raises a step's exception,
sometimes as text inside another one) for a failure a user can fix: no space left on a device,
a permission denied, a port in use, Kafka unreachable or refusing the credentials, a Redis
server unreachable. It returns the message, or None for anything else (a bug keeps its
traceback).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["device_of", "explain", "is_known", "with_fix"]

#: The fix of a project error whose message does not name one, by its class.
_FIXES: dict[str, str] = {
    "OutputNotWritableError": "pass an --output in a folder this user can write",
    "InputNotFoundError": "check the path (globs are allowed) and that this user may read it",
    "LayoutError": "pass a file this project wrote, of the layout the command reads",
    "BadInputError": "repair or remove the file (or pass --skip-bad-files where the command takes it)",
    "OutputLockedError": "wait for the other run to finish, or write to another --output",
    "SnapshotError": "run again the command that writes it",
}

_NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]|MDB_MAP_FULL|MapFullError|mdb_\w+: Input/output error")
_LMDB = re.compile(r"MDB_MAP_FULL|MapFullError|mdb_\w+:")
_DENIED = re.compile(r"\[Errno 13\] Permission denied")
_SASL = re.compile(r"SaslAuthenticationFailed|Authentication failed", re.IGNORECASE)
_NO_BROKER = re.compile(r"NoBrokersAvailable|Unable to bootstrap from")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        one = todo.pop(0)
        if id(one) in seen:
            continue
        seen.add(id(one))
        yield one
        todo += [e for e in (one.__cause__, one.__context__) if e is not None]


def device_of(path: str) -> str:
    """``SOURCE (TYPE on MOUNTPOINT)`` of the filesystem that holds ``path``, from /proc/mounts."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    real = os.path.realpath(probe)
    best = ("?", "?", "/")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[2]):
            best = (parts[0], parts[2], mount)
    source, kind, mount = best
    return f"{source} ({kind} on {mount})"


def _path(exc: BaseException, written: Sequence[str]) -> str | None:
    for one in _chain(exc):
        name = getattr(one, "filename", None)
        if isinstance(name, str | bytes) and name:
            return os.fsdecode(name)
    return next((w for w in written if w), None)


def _errno(exc: BaseException) -> int | None:
    for one in _chain(exc):
        if isinstance(one, OSError) and one.errno:
            return one.errno
    return None


def _text(exc: BaseException) -> str:
    return "\n".join(f"{type(one).__name__}: {one}" for one in _chain(exc))


def explain(
    exc: BaseException,
    *,
    written: Sequence[str] = (),
    stores: Sequence[str] = (),
    ports: Sequence[int] = (),
    kafka: str | None = None,
) -> str | None:
    """The ``... Fix: ...`` message for a known failure class, else None.

    ``written``: the paths the command writes (its --output), named when the exception does not
    carry a file name; ``stores``: its LMDB stores' folders (named for an LMDB error); ``ports``:
    the ports it listens on; ``kafka``: the brokers it bootstraps from.
    """
    at = f" at {kafka}" if kafka else ""
    code, text = _errno(exc), _text(exc)
    if code == errno.ENOSPC or _NO_SPACE.search(text):
        lmdb = _LMDB.search(text) is not None
        path = _path(exc, [*stores, *written] if lmdb else [*written, *stores]) or "its output"
        return (
            f"no space left on {device_of(path)} writing {path}. Fix: free space there (or write to a "
            "filesystem with room) and run again; earlier snapshots and stores are left as they were"
        )
    if code == errno.EROFS or "Read-only file system" in text:
        path = _path(exc, written) or "its output"
        return f"read-only file system {device_of(path)} writing {path}. Fix: write to a writable location"
    if code in (errno.EACCES, errno.EPERM) or _DENIED.search(text):
        path = _path(exc, written) or "a file"
        return (
            f"permission denied on {path}. Fix: use a path this user may read (inputs) or write (outputs), or "
            "fix its owner and mode"
        )
    if code == errno.EADDRINUSE:
        shown = ", ".join(str(p) for p in ports) or "the port"
        return f"address already in use ({shown}). Fix: pick a free port, or stop the process that holds it"
    if _SASL.search(text):
        return (
            f"Kafka{at} refused the credentials (SASL authentication failed). Fix: check --sasl-username and the "
            "password (GEM_KAFKA_SASL_PASSWORD or --sasl-password) and --sasl-mechanism"
        )
    if _NO_BROKER.search(text):
        return (
            f"cannot reach Kafka{at}. Fix: start the project's broker with `make kafka-up`, or point "
            "--bootstrap-servers (GEM_KAFKA_BOOTSTRAP) at a running cluster"
        )
    return None


def is_known(exc: BaseException) -> bool:
    """Whether :func:`explain` has a message for ``exc`` (so that its traceback is noise)."""
    return explain(exc) is not None


def with_fix(exc: BaseException) -> str:
    """A project error's message, ending in a fix: its own, else the one of its class."""
    message = str(exc)
    if "Fix:" in message:
        return message
    fix = next((_FIXES[c.__name__] for c in type(exc).__mro__ if c.__name__ in _FIXES), None)
    fix = fix or "see the command's --help"
    return f"{message.rstrip('. ')}. Fix: {fix}"
