"""kill -9 every writer at a seeded point: readers refuse what was not committed, the old snapshot stays
intact, a rerun recovers with its records balanced; a second writer into the same output stops at once.

Each case adds a row to the results table printed at the end of the session (``tests/recovery/conftest.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.errors import SnapshotError
from pipelines.features.pipeline import RECORDS
from pipelines.io.commit import COMMITTED, writer_lock
from pipelines.io.snapshot import HISTORIES, REPRESENTATIONS, open_snapshot
from pipelines.precompute.pipeline import PAIRS
from tests.fixtures.kafka import BOOTSTRAP
from tests.recovery.conftest import World
from tests.recovery.crash import ROOT, Killed, cli, kill_mid_run, record, refused, short, staging_of

pytestmark = pytest.mark.integration


def _features_readers_refuse(world: World, folder: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    messages = [
        refused(["inspect", str(folder)], capsys),
        refused(["train", "--features", str(folder), "--output", str(tmp / "model"), "--device", "cpu"], capsys),
        refused(
            ["features", "--input", str(world.events), "--output", str(tmp / "f"), "--previous", str(folder)], capsys
        ),
    ]
    assert all("no committed snapshot" in m or "not a committed snapshot" in m for m in messages), messages
    return messages[0]


def _check_features(folder: Path, histories: int, num_shards: int, *, leftovers: bool = False) -> dict:
    """A committed, intact features snapshot: balanced summary, every history once, no stale shard
    (and, unless ``leftovers``, i.e. right after a kill, no staging folder beside it)."""
    snapshot = open_snapshot(str(folder), flag="--output", writer="test", deep=True)
    summary = snapshot.summary()
    RECORDS.check(summary)
    rows = sum(pq.read_metadata(f).num_rows for f in snapshot.files(HISTORIES))
    assert rows == summary["histories"] == histories
    assert len(list((folder / HISTORIES).iterdir())) == num_shards
    assert leftovers or not staging_of(folder)
    return summary


def _committed(out: Path) -> bool:
    return (out / COMMITTED).is_file()


def _when(killed: Killed, out: Path, *, before: bool | None = None) -> str:
    """Where the kill landed: the process may be alive past its commit, so the folder decides."""
    before = not _committed(out) if before is None else before
    return f"{killed.outcome} at +{killed.delay_s:.2f}s, {'before' if before else 'after'} the commit"


def _features_args(world: World, out: Path, *extra: str) -> list[str]:
    return ["features", "--input", str(world.events), "--output", str(out), *extra]


@pytest.mark.parametrize("seed", [1, 2])
def test_features_killed_then_rerun(
    world: World, tmp_path: Path, seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "features"
    killed = kill_mid_run(_features_args(world, out, "--num-shards", "8"), out, seed=seed, span_s=3.0)
    outcome = _when(killed, out)
    if not _committed(out):
        assert not out.exists()
        outcome += f"; readers refuse: {short(_features_readers_refuse(world, out, tmp_path, capsys))}"
    else:
        _check_features(out, world.histories, 8)
    assert main(_features_args(world, out, "--num-shards", "4", "--overwrite")) == 0
    _check_features(out, world.histories, 4)
    record(f"features seed={seed}", outcome + f"; rerun (4 shards) recovers: {world.histories} histories, balanced")


@pytest.mark.parametrize("seed", [3, 4])
def test_features_overwrite_killed_keeps_the_old_snapshot(world: World, tmp_path: Path, seed: int) -> None:
    out = tmp_path / "features"
    assert main(_features_args(world, out, "--num-shards", "2")) == 0
    old = open_snapshot(str(out), flag="--output", writer="test")
    args = _features_args(world, out, "--num-shards", "4", "--overwrite")
    killed = kill_mid_run(args, out, seed=seed, span_s=3.0)
    now = open_snapshot(str(out), flag="--output", writer="test", deep=True)  # readable either way
    if now.manifest == old.manifest:
        _check_features(out, world.histories, 2, leftovers=True)
        outcome = f"{_when(killed, out, before=True)}; old snapshot intact (same commit, 2 shards, CRC-checked)"
    else:
        _check_features(out, world.histories, 4, leftovers=True)
        outcome = f"{_when(killed, out, before=False)}; new snapshot committed whole (4 shards)"
    assert main(args) == 0
    _check_features(out, world.histories, 4)
    record(f"features --overwrite seed={seed}", outcome + "; rerun recovers, no stale shard")


@pytest.fixture(scope="module")
def topic(world: World, make_topic) -> str:
    name = make_topic(2)
    done = cli(
        "produce", "--input", str(world.events), "--topic", name, "--no-progress", "--bootstrap-servers", BOOTSTRAP
    )
    assert done.returncode == 0, done.stderr
    return name


def test_replay_killed_then_rerun(world: World, topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay"
    args = ["replay", "--topic", topic, "--output", str(out), "--num-shards", "4", "--bootstrap-servers", BOOTSTRAP]
    killed = kill_mid_run(args, out, seed=5, span_s=4.0)
    outcome = _when(killed, out)
    if not _committed(out):
        outcome += f"; readers refuse: {short(_features_readers_refuse(world, out, tmp_path, capsys))}"
    else:
        _check_features(out, world.histories, 4, leftovers=True)
    assert main([*args, "--overwrite"]) == 0
    summary = _check_features(out, world.histories, 4)
    record("replay (Kafka) seed=5", outcome + f"; rerun recovers: {summary['records_in']} messages, balanced")


def _precompute_args(world: World, out: Path, store: str) -> list[str]:
    return [
        "precompute",
        "--features",
        str(world.features),
        "--candidates",
        str(world.candidates),
        "--model",
        str(world.model),
        "--output",
        str(out),
        "--store",
        store,
        "--all-users",
        "--device",
        "cpu",
    ]


def _check_store(out: Path, store_uri: str) -> int:
    """Every committed representation is in the store with the rerun's values (not the killed run's)."""
    from pipelines.store import open_store

    snapshot = open_snapshot(str(out), flag="--output", writer="test", deep=True)
    PAIRS.check(snapshot.summary())
    table = pq.ParquetDataset(snapshot.files(REPRESENTATIONS)).read(columns=["user_id", "ad_id", "computed_at"])
    keys = list(zip(table.column("user_id").to_pylist(), table.column("ad_id").to_pylist(), strict=True))
    with open_store(store_uri) as store:
        got = store.read_batch(keys)
    assert got.found.all()
    computed = np.asarray(table.column("computed_at").cast("int64").to_numpy())
    assert np.array_equal(got.computed_at_ms, computed)
    return len(keys)


@pytest.mark.parametrize("backend", ["lmdb", "redis"])
def test_precompute_killed_then_rerun(
    world: World, tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.store import default_redis_url, open_store
    from tests.conftest import require_redis

    out = tmp_path / "reps"
    if backend == "lmdb":
        store = f"lmdb://{tmp_path / 'store'}"
    else:
        require_redis(default_redis_url())
        store = f"{default_redis_url()}?namespace=gem-recovery:{uuid.uuid4().hex[:8]}:"
    seed = 6 if backend == "lmdb" else 7
    try:
        killed = kill_mid_run(_precompute_args(world, out, store), out, seed=seed, span_s=4.0)
        outcome = _when(killed, out)
        if not _committed(out):
            message = refused(["index", "--representations", str(out), "--output", str(tmp_path / "i")], capsys)
            outcome += f"; index refuses: {short(message)}"
        assert main([*_precompute_args(world, out, store), "--overwrite"]) == 0
        rows = _check_store(out, store)
        record(f"precompute -> {backend} seed={seed}", outcome + f"; rerun recovers: {rows} rows balanced, in store")
    finally:
        if backend == "redis":
            with open_store(store) as opened:
                opened.clear()


def test_index_killed_fresh_and_over_an_old_one(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.similarity.user_index import UserIndex

    out = tmp_path / "index"
    args = ["index", "--representations", str(world.representations), "--output", str(out), "--factory", "Flat"]
    killed = kill_mid_run(args, out, seed=8, span_s=3.0)
    outcome = _when(killed, out)
    if not _committed(out):
        with pytest.raises(SnapshotError, match="no committed snapshot yet") as refused:
            UserIndex.load(out)  # what lookup --index calls (the lookup CLI's own import is broken on main)
        outcome += f"; lookup's index load refuses: {short(str(refused.value))}"
    assert main([*args, "--overwrite"]) == 0
    old = UserIndex.load(out).manifest
    record("index seed=8", outcome + f"; rerun recovers: {old.count} users")

    killed = kill_mid_run([*args, "--overwrite"], out, seed=9, span_s=3.0)
    now = UserIndex.load(out).manifest  # readable either way
    if now == old:
        outcome = f"{_when(killed, out, before=True)}; old index intact, lookup's index load serves it"
    else:
        outcome = f"{_when(killed, out, before=False)}; new index committed whole"
    assert now.count == old.count
    record("index --overwrite seed=9", outcome)


def test_a_second_writer_stops_at_once(world: World, tmp_path: Path) -> None:
    out = tmp_path / "features"
    with writer_lock(str(out)):  # a writer holds the output (deterministic): the CLI stops before any work
        held = cli(*_features_args(world, out))
    assert held.returncode == 2 and "is being written right now by pid" in held.stderr, held.stderr
    assert not out.exists() and not staging_of(out)
    jobs = [  # two real writers started together: one commits, the other is refused whole
        subprocess.Popen(
            [sys.executable, "-m", "pipelines", *_features_args(world, out)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    ends = [(job.wait(timeout=600), job.communicate()[1]) for job in jobs]
    assert sorted(code for code, _ in ends) == [0, 2], ends
    refused = next(err for code, err in ends if code == 2).strip().splitlines()[-1]
    assert "is being written right now by pid" in refused or "already holds" in refused, refused
    summary = _check_features(out, world.histories, 16)
    record("second writer (lock held)", f"exits 2 at once: {short(held.stderr.strip().splitlines()[-1])}")
    record("two features writers at once", f"one commits {summary['histories']} histories; other: {short(refused)}")


def test_readers_refuse_a_truncated_part_file(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A committed output whose file was cut afterwards (a partial copy, a full disk)."""
    import shutil

    reps = tmp_path / "reps"
    shutil.copytree(world.representations, reps)
    part = sorted((reps / REPRESENTATIONS).glob("*/*.parquet"))[0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    message = refused(["index", "--representations", str(reps), "--output", str(tmp_path / "i")], capsys)
    assert "truncated or changed" in message
    assert json.loads((reps / "summary.json").read_text())  # the rest of the folder is untouched
    record("truncated representation file", f"index refuses: {short(message)}")
