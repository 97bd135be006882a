"""features, precompute and index on a real S3-compatible store (the project's S3Proxy): each writes
``s3://``, the next reads it back through Beam's S3 filesystem and the test through pyarrow's; a
second writer is refused; a writer killed with SIGKILL leaves nothing readers accept, and a rerun
succeeds at once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.io.commit import COMMITTED, read_commit, writer_lock
from pipelines.io.lease import LOCK_DIR
from pipelines.io.objects import list_tree
from pipelines.io.snapshot import HISTORIES, REPRESENTATIONS, open_snapshot
from tests.fixtures.s3 import arrow_s3
from tests.recovery.conftest import World
from tests.recovery.crash import cli, paused_at, record, refused, short

pytestmark = pytest.mark.integration


def features_args(world: World, output: str, *extra: str) -> list[str]:
    return ["features", "--input", str(world.events), "--output", output, "--num-shards", "2", *extra]


def rows_via_pyarrow(folder: str, kind: str, *, users_only: bool = False) -> int:
    """Rows of the committed files of ``kind``, read with pyarrow's own S3 filesystem."""
    manifest = read_commit(folder)
    assert manifest is not None, f"{folder} is not committed"
    fs, root = arrow_s3(), f"{folder.removeprefix('s3://')}/{manifest.root}"
    paths = [f"{root}/{f.path}" for f in manifest.files if f.path.startswith(f"{kind}/")]
    if not users_only:
        return sum(pq.read_metadata(p, filesystem=fs).num_rows for p in paths)
    return sum(pq.read_table(p, filesystem=fs, columns=["ad_id"]).column("ad_id").null_count for p in paths)


def test_features_precompute_and_index_write_s3_and_read_it_back(
    world: World, s3_folder: str, s3proxy: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.similarity.user_index import UserIndex

    features, reps, index = f"{s3_folder}/features", f"{s3_folder}/reps", f"{s3_folder}/index"
    assert main(features_args(world, features)) == 0
    assert rows_via_pyarrow(features, HISTORIES) == world.histories
    open_snapshot(features, flag="--features", writer="test", deep=True)  # every byte CRC-checked through Beam
    precompute = ["precompute", "--features", features, "--candidates", str(world.candidates)]
    assert main([*precompute, "--model", str(world.model), "--output", reps, "--all-users", "--device", "cpu"]) == 0
    assert rows_via_pyarrow(reps, REPRESENTATIONS, users_only=True) == world.histories
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")  # the endpoint as a Beam flag only: Beam's and pyarrow's reads follow it
    endpoint = f"--s3_endpoint_url={s3proxy['AWS_ENDPOINT_URL_S3']}"
    assert (
        main(["index", "--representations", reps, "--output", index, "--factory", "Flat", "--device", "cpu", endpoint])
        == 0
    )
    assert len(UserIndex.load(index, gpu="off")) == world.histories
    assert not [p for p in list_tree(s3_folder) if f"/{LOCK_DIR}/" in p]  # every lock claim went with its run
    record("s3: features -> precompute -> index", "committed on S3Proxy, read back (Beam and pyarrow)")


def test_a_second_writer_is_refused(world: World, s3_folder: str) -> None:
    out = f"{s3_folder}/features"
    with writer_lock(out):
        second = cli(*features_args(world, out))
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"is being written right now by pid {os.getpid()} " in second.stderr, second.stderr[-2000:]
    assert "Traceback" not in second.stderr
    assert read_commit(out) is None and not [p for p in list_tree(out) if "/run-" in p]  # it wrote nothing
    record("s3: second writer", short(second.stderr.strip().splitlines()[-1]))


def test_a_killed_writer_leaves_nothing_readers_accept(
    world: World, s3_folder: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = f"{s3_folder}/features"
    with paused_at("before-commit", features_args(world, out), tmp_path / "pause") as job:
        killed_run = {p.split("/run-", 1)[1].split("/", 1)[0] for p in list_tree(out) if "/run-" in p}
        assert len(killed_run) == 1, "the run wrote its files before the commit"
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    assert read_commit(out) is None
    message = refused(["inspect", out], capsys)
    assert "has no committed snapshot yet" in message and "a run writing it now or one that was killed" in message
    precompute = ["precompute", "--features", out, "--candidates", str(world.candidates), "--model", str(world.model)]
    message = refused([*precompute, "--output", f"{s3_folder}/reps", "--device", "cpu"], capsys)
    assert "has no committed snapshot yet" in message, message
    assert main(features_args(world, out)) == 0  # at once: the killed writer's claim names a process that is gone
    assert rows_via_pyarrow(out, HISTORIES) == world.histories
    left = list_tree(out)
    assert not [p for p in left if f"/run-{next(iter(killed_run))}/" in p or f"/{LOCK_DIR}/" in p], sorted(left)
    record("s3: SIGKILL before the commit", short(message))


def test_a_killed_overwrite_keeps_the_old_snapshot(world: World, s3_folder: str, tmp_path: Path) -> None:
    out = f"{s3_folder}/features"
    assert main(features_args(world, out)) == 0
    old = read_commit(out)
    with paused_at("before-commit", features_args(world, out, "--overwrite"), tmp_path / "pause") as job:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    snapshot = open_snapshot(out, flag="--features", writer="test", deep=True)
    assert old is not None and snapshot.manifest.run_id == old.run_id  # readers still get the old one, whole
    assert main(features_args(world, out, "--overwrite")) == 0
    new = read_commit(out)
    assert new is not None and new.run_id != old.run_id
    runs = {p.split("/run-", 1)[1].split("/", 1)[0] for p in list_tree(out) if "/run-" in p}
    assert runs == {new.root.removeprefix("run-")} and f"{out}/{COMMITTED}" in list_tree(out)
    record("s3: SIGKILL in an --overwrite", "old snapshot read whole; rerun committed, leftovers removed")
