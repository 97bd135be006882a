"""Disk full: a write that hits ENOSPC on a real, small file system ends in
``error: no space left on DEVICE writing PATH. Fix: ...`` with exit 2 and no traceback, and the
earlier snapshot and store stay intact. The file system is a tmpfs of a few MiB, mounted for the test
(root, or CAP_SYS_ADMIN, is needed: without it the test is skipped, saying so)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.cli import main
from tests.recovery.conftest import World
from tests.recovery.crash import record, short

pytestmark = pytest.mark.integration


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs, unmounted at the end."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of the file system's free space."""
    stat = os.statvfs(mount)
    free = stat.f_bavail * stat.f_frsize
    with open(mount / "filler", "wb") as out:
        out.truncate(0)
        remaining = max(0, free - leave)
        block = b"\0" * (1 << 20)
        while remaining:
            remaining -= out.write(block[: min(len(block), remaining)])


def no_space(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: no space left on tmpfs (tmpfs on ") and "Fix:" in last, err
    return last


def test_features_overwrite_on_a_full_disk_keeps_the_old_snapshot(
    world: World, small_fs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.io.snapshot import HISTORIES, open_snapshot

    out = small_fs / "features"
    argv = ["features", "--input", str(world.events), "--output", str(out), "--num-shards", "2"]
    assert main(argv) == 0
    before = json.loads((out / "summary.json").read_text())
    fill(small_fs, leave=32 << 10)
    err = no_space([*argv, "--overwrite"], capsys)
    assert f"writing {out}" in err
    snapshot = open_snapshot(str(out), flag="--features", writer="features")  # committed, every CRC checked
    assert snapshot.files(HISTORIES) and json.loads((out / "summary.json").read_text()) == before
    record("features --overwrite, disk full", short(err))


def test_a_store_write_on_a_full_disk_names_the_store_and_keeps_it(
    world: World, small_fs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB reports a full disk as ``mdb_txn_commit: Input/output error``; the store keeps its last commit."""
    import pipelines.store.lmdb_store as lmdb_store
    from pipelines.store import open_store

    # The store's own check refuses to start below 64 MiB free; this test needs the write itself to fail.
    monkeypatch.setattr(lmdb_store, "MIN_FREE_BYTES", 0)
    store = small_fs / "store"
    precompute = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    precompute += ["--model", str(world.model), "--device", "cpu", "--store", f"lmdb://{store}"]
    assert main([*precompute, "--output", str(tmp_path / "first")]) == 0
    with open_store(f"lmdb://{store}") as opened:
        assert isinstance(opened, lmdb_store.LmdbStore)
        count = opened.count()
    fill(small_fs, leave=16 << 10)
    err = no_space([*precompute, "--all-users", "--output", str(tmp_path / "second")], capsys)
    assert f"writing {store}" in err
    with open_store(f"lmdb://{store}") as opened:
        assert isinstance(opened, lmdb_store.LmdbStore) and opened.count() == count
    record("precompute --store on a full disk", short(err))
