"""Precompute fails before any work, clearly, and never prints a password: the store is reached,
authenticated and checked first; a damaged LMDB file is named (never a SIGBUS); a shard without a
history file is normal; a Redis password appears in no stream and no file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from pipelines.io.commit import commit_folder
from pipelines.io.summary import write_summary
from pipelines.redact import MASK, redact, register_secret
from tests.precompute.conftest import World

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "pw-PLANTED-7f3a"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines", "-v", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def _precompute(world: World, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    base = ["--features", str(world.features), "--candidates", str(world.candidates), "--model", str(world.model)]
    return _cli("precompute", *base, "--output", str(out), *extra)


def _nowhere_holds(secret: str, done: subprocess.CompletedProcess[str], *folders: Path) -> None:
    assert secret not in done.stdout and secret not in done.stderr
    for folder in folders:
        for path in folder.rglob("*") if folder.exists() else ():
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), f"{path} holds the password"


@pytest.mark.integration
def test_an_unreachable_redis_fails_before_work_without_printing_its_password(world: World, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _precompute(world, out, "--store", f"redis://:{PLANTED}@127.0.0.1:1/0")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "cannot reach Redis" in done.stderr
    assert f"redis://:{MASK}@127.0.0.1:1/0" in done.stderr
    assert not out.exists()  # failed before any work: no output folder, no inference
    _nowhere_holds(PLANTED, done, tmp_path)


@pytest.mark.integration
def test_a_redis_password_is_in_no_output_of_a_successful_run(world: World, tmp_path: Path) -> None:
    from pipelines.store import open_store

    # The project's server has no password, and redis-py's AUTH to it succeeds: the whole run goes through.
    uri = f"redis://:{PLANTED}@127.0.0.1:16379/0?namespace=test-redact-{os.getpid()}:"
    done = _precompute(world, tmp_path / "out", "--store", uri)
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        # the CLI moves the password out of the URI (into GEM_REDIS_PASSWORD) before the pipeline is built
        assert summary["store"].startswith("redis://127.0.0.1:16379/0")
        _nowhere_holds(PLANTED, done, tmp_path)
    finally:
        with open_store(uri) as store:
            store.clear()


def test_summary_files_are_redacted(tmp_path: Path) -> None:
    write_summary(str(tmp_path), {"store": f"redis://user:{PLANTED}@h:1/0", "inputs": [f"x?password={PLANTED}"]})
    text = (tmp_path / "summary.json").read_text()
    assert PLANTED not in text and json.loads(text)["store"] == f"redis://user:{MASK}@h:1/0"
    assert redact("rediss://:s3cret-a@h/0, x?token=s3cret-b&y=1") == f"rediss://:{MASK}@h/0, x?token={MASK}&y=1"
    register_secret("s3cret-c")
    assert redact("AUTH s3cret-c failed") == f"AUTH {MASK} failed"


def _lmdb_store(path: Path) -> None:
    env = lmdb.open(str(path), map_size=1 << 30, max_dbs=2)
    db = env.open_db(b"records")
    with env.begin(write=True) as txn:
        for i in range(4000):
            txn.put(str(i).encode(), os.urandom(400), db=db)
    env.close()


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_lmdb_file_is_named_never_a_sigbus(world: World, tmp_path: Path, damage: str) -> None:
    store = tmp_path / "store"
    _lmdb_store(store)
    data = store / "data.mdb"
    if damage == "truncated":
        os.truncate(data, data.stat().st_size // 3)
    else:
        data.write_bytes(b"\x00" * 100_000)
    done = _precompute(world, tmp_path / "out", "--store", f"lmdb://{store}")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])  # SIGBUS would be -7
    assert f"{data} is {'truncated' if damage == 'truncated' else 'not an LMDB data file'}" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_shard_without_a_history_file_is_normal(world: World, tmp_path: Path) -> None:
    features = tmp_path / "features"
    shutil.copytree(world.features, features)
    shutil.rmtree(features / "histories" / "shard=00001")
    # committed again without that shard: the state of a snapshot where no user of shard 1 had events
    commit_folder(str(features), holds="a features snapshot")
    out = tmp_path / "out"
    done = _cli(
        "precompute",
        *("--features", str(features), "--candidates", str(world.candidates), "--model", str(world.model)),
        *("--output", str(out), "--store", f"lmdb://{tmp_path / 'store'}"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairs_in"] == summary["pairs_out"] + summary["pairs_superseded"] > 0
    assert summary["dead_pairs"] == 0 and summary.get("inference_failures", 0) == 0
