"""Snapshots under concurrent use: the writer lock names its holder from the first instant, reads stay
pinned to the snapshot they checked, and an --output never eats an input.

Each race is made certain with a pause point (:mod:`pipelines.io.pause`): the first process is stopped
at an exact step while the second runs, so no case depends on timing.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.io.commit import read_commit
from pipelines.io.snapshot import REPRESENTATIONS
from tests.recovery.conftest import World
from tests.recovery.crash import cli, paused_at, record, refused, short, staging_of

pytestmark = pytest.mark.integration


def _features_args(world: World, out: Path, *extra: str) -> list[str]:
    return ["features", "--input", str(world.events), "--output", str(out), *extra]


def test_the_lock_names_its_holder_from_the_moment_it_is_taken(world: World, tmp_path: Path) -> None:
    """The holder stops right after its lock became visible; the second writer must name its pid."""
    out = tmp_path / "features"
    with paused_at("lock-taken", _features_args(world, out), tmp_path / "pause") as holder:
        second = cli(*_features_args(world, out))
    assert second.returncode == 2, second.stderr
    assert f"is being written right now by pid {holder.pid} " in second.stderr, second.stderr
    assert holder.returncode == 0, (tmp_path / "pause" / "stderr.log").read_text()[-3000:]
    assert (out / "_COMMITTED").is_file() and not staging_of(out)
    record("second writer at the lock's first instant", short(second.stderr.strip().splitlines()[-1]))


def _user_rows(folder: Path) -> pa.Table:
    manifest = read_commit(str(folder))
    assert manifest is not None
    files = [folder / f.path for f in manifest.files if f.path.startswith(f"{REPRESENTATIONS}/")]
    table = pa.concat_tables(pq.read_table(f) for f in files)
    table = table.filter(pc.is_null(table["ad_id"])).select(["user_id", "embedding", "p_click"])
    return table.sort_by("user_id")


def test_a_read_stays_on_the_snapshot_it_checked_while_an_overwrite_publishes(world: World, tmp_path: Path) -> None:
    """precompute --all-users is stopped at its first read of a history shard; features --overwrite
    then republishes its --features from other events, whole; the precompute must give what a run on
    the old snapshot gives (or fail naming the cause), never a mix of the two."""
    features, reps = tmp_path / "features", tmp_path / "reps"
    shutil.copytree(world.features, features)
    other = tmp_path / "other.jsonl"
    assert cli("generate", "--users", "300", "--days", "2", "--seed", "77", "--output", str(other)).returncode == 0
    precompute = ["precompute", "--features", str(features), "--candidates", str(world.candidates)]
    precompute += ["--model", str(world.model), "--output", str(reps), "--all-users", "--device", "cpu"]
    with paused_at("snapshot-read", precompute, tmp_path / "pause") as reader:
        overwrite = cli("features", "--input", str(other), "--output", str(features), "--overwrite")
        assert overwrite.returncode == 0, overwrite.stderr[-3000:]
        assert json.loads((features / "summary.json").read_text())["histories"] != world.histories
    err = (tmp_path / "pause" / "stderr.log").read_text()
    assert reader.returncode == 0, err[-3000:]
    assert _user_rows(reps).equals(_user_rows(world.representations))  # the old snapshot's answer, whole
    assert not (tmp_path / ".features.readers").exists()  # the pin went with its reader
    record("precompute while features --overwrite republishes", f"{world.histories} users, the old snapshot's")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_output_never_eats_an_input_or_moves_a_file_aside(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "E.jsonl.gz"
    events.write_bytes(gzip.compress(world.events.read_bytes()))
    before = events.read_bytes()
    features, reps = tmp_path / "features", tmp_path / "reps"
    shutil.copytree(world.features, features)
    shutil.copytree(world.representations, reps)
    kept = {features: _tree(features), reps: _tree(reps)}
    note = tmp_path / "notes.txt"
    note.write_text("mine")
    model, cands = ["--model", str(world.model)], ["--candidates", str(world.candidates)]
    cases = {  # the repros first
        "features --input E --output E": ["features", "--input", str(events), "--output", str(events)],
        "features --input E --output E, from a glob": [
            "features", "--input", str(tmp_path / "E.*"), "--output", str(events),
        ],
        "precompute --features F --output F --overwrite": [
            "precompute", "--features", str(features), *cands, *model, "--output", str(features), "--overwrite",
        ],
        "index --representations R --output R --overwrite": [
            "index", "--representations", str(reps), "--output", str(reps), "--overwrite",
        ],
        "an existing file as --output, even with --overwrite": [
            "features", "--input", str(world.events), "--output", str(note), "--overwrite",
        ],
        "--output inside an input": [
            "precompute", "--features", str(features), *cands, *model, "--output", str(features / "r"),
        ],
        "--output holding an input": ["features", "--input", str(events), "--output", str(tmp_path), "--overwrite"],
        "train --output F": ["train", "--features", str(features), "--output", str(features), "--overwrite"],
    }  # fmt: skip
    for case, argv in cases.items():
        err = refused(argv, capsys)
        assert "--output" in err, (case, err)
        record(case, short(err))
    assert events.read_bytes() == before and note.read_text() == "mine"
    assert all(_tree(folder) == tree for folder, tree in kept.items())
    assert not [p.name for p in tmp_path.iterdir() if ".trash-" in p.name or ".staging-" in p.name]


def test_a_symlinked_output_is_written_at_its_target_and_stays_a_symlink(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    link.symlink_to(real)
    for extra in ([], ["--overwrite"]):
        assert main(["features", "--input", str(world.events), "--output", str(link), *extra]) == 0
    assert link.is_symlink() and (real / "_COMMITTED").is_file()
    assert (tmp_path / ".real.lock").is_file() and not (tmp_path / ".link.lock").exists()
    err = refused(["precompute", "--features", str(real), "--candidates", str(world.candidates),
                   "--model", str(world.model), "--output", str(link), "--overwrite"], capsys)  # fmt: skip
    assert "is --features" in err, err
