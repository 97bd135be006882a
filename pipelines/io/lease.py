"""The one-writer lock on object stores: claim objects with a lease, decided by one listing.

An object store has no ``flock``. The strong tool would be a conditional create (S3
``If-None-Match: *``, GCS ``ifGenerationMatch=0``), but S3-compatible servers differ: S3Proxy
2.6.0 accepts the header and overwrites anyway, and Beam's ``FileSystems`` cannot send it. So the
lock uses only what every store does the same way, a PUT of a new key and a strongly consistent
LIST (S3 since 2020, GCS, S3Proxy):

1. **Claim.** The writer PUTs ``OUTPUT/_lock/<token>.json`` under a key no one else uses (pid,
   host, start time, command, lease length).
2. **Decide.** It then LISTs ``OUTPUT/_lock/``. It holds the lock when every *other* claim listed
   is dead; otherwise it deletes its claim and stops with :class:`OutputLockedError` naming the
   live holder. Two writers cannot both win: the later PUT lands after the earlier writer's claim
   exists, so the later LIST sees it. (Two starting in the same instant may both see each other
   and both stop; neither writes.)
3. **Lease.** A holder rewrites its claim every ``lease / 4`` seconds. A claim is dead when the
   store's clock shows it older than its lease, or at once when it names a process on this
   machine (same host, pid namespace and boot) that is gone: a writer killed with ``kill -9``
   blocks a rerun on its own machine for no time, and one elsewhere for at most the lease
   (``GEM_OBJECT_LOCK_LEASE_S``, default 120 s). Dead claims are deleted by the next writer.
4. **Fence.** Just before it writes ``_COMMITTED`` the holder lists again
   (:meth:`ObjectLock.check`): if its claim is gone or another live claim appeared (its lease ran
   out while it was stalled), it stops without committing.

Time is always the store's: a claim's age is its modification time measured against the
modification time of the checker's own claim, just rewritten, so clocks of the writers' machines
never enter.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from apache_beam.io.filesystems import FileSystems

from pipelines.errors import OutputLockedError, OutputNotWritableError
from pipelines.io.files import join
from pipelines.io.objects import delete_object, list_tree

__all__ = ["LOCK_DIR", "Claim", "ObjectLock", "Seen", "live_others", "object_lock"]

log = logging.getLogger(__name__)

LOCK_DIR = "_lock"
DEFAULT_LEASE_S = 120.0


def lease_seconds() -> float:
    """The lease from ``GEM_OBJECT_LOCK_LEASE_S`` (seconds, > 0), else :data:`DEFAULT_LEASE_S`."""
    raw = os.environ.get("GEM_OBJECT_LOCK_LEASE_S", "")
    try:
        value = float(raw) if raw else DEFAULT_LEASE_S
    except ValueError:
        value = -1.0
    if not value > 0:
        from pipelines.errors import ConfigError

        raise ConfigError("GEM_OBJECT_LOCK_LEASE_S", f"got {raw!r}", "set it to a number of seconds > 0, e.g. 120")
    return value


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def machine() -> str:
    """This host, pid namespace and boot: a pid is only meaningful (and checkable) within all three."""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return f"{socket.gethostname()}|{pidns}|{_read('/proc/sys/kernel/random/boot_id')}"


def process_start(pid: int) -> str:
    """The start time of ``pid`` (``/proc/PID/stat`` field 22), telling a reused pid apart; "" if unknown."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if stat else ""


def local_process_alive(pid: int, started: str) -> bool:
    """Whether process ``pid`` of this machine runs and is the one that started at ``started``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or process_start(pid) in ("", started)


@dataclass(frozen=True)
class Claim:
    """What a claim object holds."""

    token: str
    pid: int
    host: str
    machine: str
    started: str
    pid_start: str
    command: str
    lease_s: float

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.started} ({self.command})"


@dataclass(frozen=True)
class Seen:
    """One listed claim: its object ``path``, the store's modification time, and its body
    (None when it cannot be parsed: a claim being written, or not ours)."""

    path: str
    updated: float
    claim: Claim | None


def is_dead(seen: Seen, now: float, here: str, alive: Callable[[int, str], bool]) -> bool:
    """Whether ``seen`` no longer holds: its lease ran out by the store's clock ``now``, or it names a
    process of this machine (``here``) that is gone."""
    lease = seen.claim.lease_s if seen.claim else DEFAULT_LEASE_S
    if seen.updated + lease < now:
        return True
    return bool(seen.claim and seen.claim.machine == here and not alive(seen.claim.pid, seen.claim.pid_start))


def live_others(
    seen: Sequence[Seen], token: str, now: float, here: str, alive: Callable[[int, str], bool]
) -> tuple[list[Seen], list[Seen]]:
    """(live, dead) claims other than ``token``'s, oldest first."""
    others = sorted((s for s in seen if not (s.claim and s.claim.token == token)), key=lambda s: (s.updated, s.path))
    dead = [s for s in others if is_dead(s, now, here, alive)]
    return [s for s in others if s not in dead], dead


class ObjectLock:
    """A held (or being taken) claim on ``output``'s lock folder; see the module docstring."""

    def __init__(self, output: str, flag: str, lease_s: float, command: str) -> None:
        self.output, self.flag, self.folder = output, flag, join(output, LOCK_DIR)
        token = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        pid = os.getpid()
        started = datetime.now(UTC).isoformat(timespec="seconds")
        self.claim = Claim(token, pid, socket.gethostname(), machine(), started, process_start(pid), command, lease_s)
        self.path = join(self.folder, f"{token}.json")
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _write(self) -> None:
        with FileSystems.create(self.path) as f:
            f.write(json.dumps(asdict(self.claim)).encode())

    def _listing(self) -> list[Seen]:
        seen = []
        for path, (_, updated) in list_tree(self.folder).items():
            if path.endswith(".json"):
                seen.append(Seen(path, updated, _parse(path)))
        return seen

    def _others(self) -> tuple[list[Seen], list[Seen]]:
        seen = self._listing()
        mine = [s for s in seen if s.path == self.path]
        if not mine:
            raise OutputLockedError(
                f"{self.flag} {self.output!r}: this run's lock claim {self.path} is gone (another writer judged "
                "its lease expired). Fix: rerun; give slow runs a longer GEM_OBJECT_LOCK_LEASE_S"
            )
        return live_others(seen, self.claim.token, mine[0].updated, self.claim.machine, local_process_alive)

    def take(self) -> None:
        """Claim, decide, and start renewing; :class:`OutputLockedError` when another writer holds it."""
        try:
            self._write()
        except Exception as exc:
            raise OutputNotWritableError(f"{self.flag} {self.output!r} is not writable ({exc})") from exc
        live, dead = self._others()
        if live:
            delete_object(self.path)
            raise self._locked(live[0])
        for stale in dead:
            log.warning("removing the lock claim %s of a writer that is gone", stale.path)
            delete_object(stale.path)
        self._renewer = threading.Thread(target=self._renew, name="object-lock-renewal", daemon=True)
        self._renewer.start()

    def check(self) -> None:
        """Still the only live claim (call before committing)? :class:`OutputLockedError` if not."""
        self._write()
        live, _ = self._others()
        if live:
            raise self._locked(live[0], lost=True)

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=60)
        try:
            delete_object(self.path)
        except Exception:  # the lease runs out by itself; a rerun on this machine takes it at once
            log.warning("could not remove the lock claim %s", self.path, exc_info=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.claim.lease_s / 4):
            try:
                self._write()
            except Exception:  # a missed renewal is caught by check() before the commit
                log.warning("could not renew the lock claim %s", self.path, exc_info=True)

    def _locked(self, holder: Seen, *, lost: bool = False) -> OutputLockedError:
        who = holder.claim.describe() if holder.claim else f"an unreadable claim {holder.path}"
        what = "lost its lock: it is now held by" if lost else "is being written right now by"
        return OutputLockedError(
            f"{self.flag} {self.output!r} {what} {who} (lock claim {holder.path}). Fix: wait for that run to "
            f"finish, or write to another folder; a claim whose writer died expires "
            f"{holder.claim.lease_s if holder.claim else DEFAULT_LEASE_S:g} s after its last renewal"
        )


def _parse(path: str) -> Claim | None:
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return Claim(**json.loads(f.read().decode()))
    except Exception:  # being written, deleted meanwhile, or not a claim
        return None


@contextmanager
def object_lock(output: str, flag: str, command: str = "") -> Iterator[ObjectLock]:
    """Hold the one-writer lock of an object-store ``output`` for the ``with`` block."""
    lock = ObjectLock(output, flag, lease_seconds(), command or " ".join(sys.argv[:2]))
    lock.take()
    try:
        yield lock
    finally:
        lock.release()
