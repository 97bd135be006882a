"""The snapshot commit protocol (pipelines.io.commit) and its reader (pipelines.io.snapshot.open_snapshot)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.errors import ConfigError, InputNotFoundError, OutputLockedError, SnapshotError
from pipelines.io import commit
from pipelines.io.commit import COMMITTED, read_commit, staged_output
from pipelines.io.snapshot import Snapshot, open_snapshot


def _write(root: str, shards: int, value: int = 0) -> None:
    for s in range(shards):
        path = Path(root, "histories", f"shard={s:05d}", "part-00000.parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"user_id": [s, value]}), path)
    Path(root, "summary.json").write_text(f'{{"histories": {2 * shards}}}')


def _commit(out: Path, shards: int, *, overwrite: bool = False, mode: commit.Mode | None = None) -> None:
    with staged_output(str(out), overwrite=overwrite, holds="a test snapshot", mode=mode) as staging:
        _write(staging.root, shards)


def _open(out: Path, deep: bool | None = None, pin: bool = True):
    return open_snapshot(str(out), flag="--data", writer="python -m pipelines features", deep=deep, pin=pin)


def test_a_committed_snapshot_lists_every_file_with_rows_and_checksum(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 3)
    snapshot = _open(out)
    assert [Path(f).parent.name for f in snapshot.files("histories")] == [f"shard={s:05d}" for s in range(3)]
    entries = {e.path: e for e in snapshot.manifest.files}
    assert entries["histories/shard=00001/part-00000.parquet"].rows == 2
    assert entries["summary.json"].rows is None and len(entries["summary.json"].crc32) == 8
    assert not commit.staging_leftovers(str(out)) and (tmp_path / ".out.lock").is_file()


def test_overwrite_keeps_the_old_snapshot_readable_until_the_commit_and_leaves_no_stale_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 4)
    old = _open(out).manifest
    with staged_output(str(out), overwrite=True, holds="x") as staging:
        _write(staging.root, 2)
        assert _open(out, deep=True).manifest == old  # the new files are only in staging
    assert len(_open(out).files("histories")) == 2
    assert sorted(p.name for p in (out / "histories").iterdir()) == ["shard=00000", "shard=00001"]


def test_a_failed_run_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 1)
    old = _open(out).manifest
    with pytest.raises(RuntimeError), staged_output(str(out), overwrite=True, holds="x") as staging:
        _write(staging.root, 3)
        raise RuntimeError("balance broken")
    assert _open(out, deep=True).manifest == old and not commit.staging_leftovers(str(out))


def test_existing_outputs_need_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 1)
    with pytest.raises(ConfigError, match="already holds a test snapshot"):
        _commit(out, 1)
    stray = tmp_path / "stray"
    (stray / "histories").mkdir(parents=True)
    (stray / "histories" / "old.parquet").write_bytes(b"x")
    with pytest.raises(ConfigError, match="no committed snapshot"):
        _commit(stray, 1)
    _commit(stray, 1, overwrite=True)
    assert not (stray / "histories" / "old.parquet").exists()
    (tmp_path / "empty").mkdir()
    _commit(tmp_path / "empty", 1)  # an empty folder is no snapshot to protect


def test_a_second_writer_stops_at_once_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_output(str(out), overwrite=False, holds="x") as staging:
        with pytest.raises(OutputLockedError, match=r"being written right now by pid \d+ on"):
            _commit(out, 1)
        _write(staging.root, 1)
    _commit(out, 1, overwrite=True)  # released with the first writer


def test_leftovers_of_a_killed_writer_are_cleared_and_a_half_published_snapshot_restored(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 2)
    old = _open(out).manifest
    out.rename(tmp_path / "out.trash-20260101T000000-abc")  # killed between the two fallback renames
    (tmp_path / "out.staging-20260101T000000-abc" / "histories").mkdir(parents=True)
    with pytest.raises(SnapshotError, match="being replaced"):
        _open(out)
    _commit(tmp_path / "other", 1)  # another output's writer leaves these alone
    assert len(commit.staging_leftovers(str(out))) == 2
    with pytest.raises(ConfigError, match="already holds"):
        _commit(out, 1)  # recovery ran first: the old snapshot is back, so it is protected
    assert _open(out, deep=True).manifest == old and not commit.staging_leftovers(str(out))


def test_publish_without_an_atomic_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    _commit(out, 3)
    _commit(out, 1, overwrite=True)
    assert len(_open(out, deep=True).files("histories")) == 1 and not commit.staging_leftovers(str(out))


def test_the_object_store_variant_commits_by_manifest_and_drops_older_runs(tmp_path: Path) -> None:
    out = tmp_path / "bucket" / "out"
    _commit(out, 3, mode="manifest")
    first = _open(out)
    assert first.root != str(out) and first.manifest.root.startswith("run-")
    with staged_output(str(out), overwrite=True, holds="x", mode="manifest") as staging:
        _write(staging.root, 1)
        assert _open(out, deep=True).manifest == first.manifest  # old run readable while the new one writes
    now = _open(out, deep=True)
    assert len(now.files("histories")) == 1
    assert [p.name for p in out.glob("run-*")] == [now.manifest.root]


def test_readers_refuse_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="does not exist"):
        _open(tmp_path / "nope")
    (tmp_path / "nope.staging-x-1").mkdir()
    with pytest.raises(SnapshotError, match=r"no committed snapshot yet: .*staging.* Fix: wait"):
        _open(tmp_path / "nope")
    plain = tmp_path / "plain"
    _write(str(plain), 1)
    with pytest.raises(SnapshotError, match=r"not a committed snapshot \(no _COMMITTED\).*--overwrite"):
        _open(plain)


def test_readers_refuse_a_truncated_or_changed_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 2)
    part = out / "histories" / "shard=00001" / "part-00000.parquet"
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit changed
    _open(out, deep=False)  # sizes only: passes
    with pytest.raises(SnapshotError, match=r"has CRC-32 .* committed"):
        _open(out, deep=True)
    part.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match=r"1 of 3 files.*is \d+ bytes, committed \d+ \(truncated or changed\)"):
        _open(out, deep=False)
    part.unlink()
    with pytest.raises(SnapshotError, match="is missing"):
        _open(out)
    assert read_commit(str(out)) is not None and (out / COMMITTED).is_file()


def test_the_streaming_job_refuses_a_committed_batch_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main

    out = tmp_path / "out"
    _commit(out, 1)
    assert main(["stream", "--topic", "t", "--group", "g", "--output", str(out)]) == 2
    assert "holds a committed batch snapshot" in capsys.readouterr().err


def test_inspect_reads_only_committed_files_and_still_takes_a_streaming_folder(tmp_path: Path) -> None:
    from pipelines.inspect.report import find_datasets

    out = tmp_path / "out"
    _commit(out, 2)
    pq.write_table(pa.table({"user_id": [9, 9, 9]}), out / "histories" / "shard=00000" / "stray.parquet")
    assert [d.table.num_rows for d in find_datasets(str(out))] == [4]  # the stray file is not in the commit
    assert find_datasets(str(out / "histories"))[0].table.num_rows == 4
    stream = tmp_path / "stream" / "histories" / "shard=00000"
    stream.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": [1]}), stream / "flush-00000000000000000001-abcd1234.parquet")
    assert find_datasets(str(tmp_path / "stream"))[0].table.num_rows == 1
    _write(str(tmp_path / "plain"), 1)
    with pytest.raises(SnapshotError, match="not a committed snapshot"):
        find_datasets(str(tmp_path / "plain"))


def test_a_symlinked_output_is_written_at_its_target_under_its_lock_and_stays_a_symlink(tmp_path: Path) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    link.symlink_to(real)
    _commit(link, 2)
    _commit(link, 1, overwrite=True)
    assert link.is_symlink() and (real / COMMITTED).is_file() and len(_open(real).files("histories")) == 1
    with commit.writer_lock(str(link)), pytest.raises(OutputLockedError, match=f"pid {os.getpid()} "):
        _commit(real, 1, overwrite=True)
    assert (tmp_path / ".real.lock").is_file() and not (tmp_path / ".link.lock").exists()


def test_a_lock_left_by_a_dead_holder_is_taken_over_and_names_the_new_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (tmp_path / ".out.lock").write_text("pid 1 on gone since then (a killed run)\n")
    with commit.writer_lock(str(out)):
        assert (tmp_path / ".out.lock").read_text().startswith(f"pid {os.getpid()} ")
        with pytest.raises(OutputLockedError, match=f"right now by pid {os.getpid()} "):
            _commit(out, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock"]


def _first_rows(snapshot: Snapshot) -> list[int]:
    path = snapshot.files("histories")[0]
    return snapshot.read_table(path).column("user_id").to_pylist()


def test_a_pinned_read_keeps_the_snapshot_it_checked_after_an_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_output(str(out), overwrite=False, holds="x") as staging:
        _write(staging.root, 2, value=7)
    pinned = _open(out)
    with staged_output(str(out), overwrite=True, holds="x") as staging:
        _write(staging.root, 2, value=8)
    assert _first_rows(pinned) == [0, 7]  # the old snapshot, though a new one is published
    assert _first_rows(_open(out)) == [0, 8]
    assert sorted(p.name for p in (tmp_path / ".out.readers").iterdir()) != []
    pinned.release()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.readers")] in ([], [".out.readers"])


def test_a_file_changed_after_the_check_is_an_error_where_it_is_opened(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _commit(out, 2)
    pinned = _open(out)
    path = Path(pinned.files("histories")[1])
    path.write_bytes(path.read_bytes()[:-8])  # in place: the pin names the same file
    with pytest.raises(SnapshotError, match=r"changed while this run read it: histories/shard=00001/\S+ is \d+ bytes"):
        pinned.read_table(str(path))
    other = tmp_path / "other"
    _commit(other, 2)
    unpinned = _open(other, pin=False)  # where no pin can be made, a replaced file is named, never read
    with staged_output(str(other), overwrite=True, holds="x") as staging:
        _write(staging.root, 2, value=9)
    with pytest.raises(SnapshotError, match=r"changed while this run read it: .* Fix: rerun this command"):
        _first_rows(unpinned)


def test_the_pin_of_a_reader_that_died_is_swept_by_the_next_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "out"
    _commit(out, 2)
    dead = "import os, sys; from pipelines.io.snapshot import open_snapshot as o; o(sys.argv[1], flag='-', writer='-')"
    dead += "; os._exit(0)"
    subprocess.run([sys.executable, "-c", dead, str(out)], check=True)
    left = list((tmp_path / ".out.readers").iterdir())
    assert len(left) == 1  # exited without releasing it, as a killed reader would
    live = _open(out)
    assert [p.name for p in (tmp_path / ".out.readers").iterdir()] == [Path(str(live.pin)).name]
