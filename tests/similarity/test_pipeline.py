"""The index and lookup commands end to end (Beam DirectRunner, files in tmp_path)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.cli import main
from pipelines.similarity.artifact import read_id_map, read_manifest, read_vectors
from pipelines.similarity.user_index import UserIndex
from pipelines.store import LmdbConfig, LmdbStore
from tests.similarity.data import T0_MS, VERSION, clustered, rep_table, write_representations

pytestmark = pytest.mark.integration
DIM = 16
USERS = 900


@pytest.fixture(scope="module")
def reps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """Three files: user-level rows of 900 users split across them, pair rows, and an older
    duplicate of users 0..49 (the newest must win)."""
    root = tmp_path_factory.mktemp("reps")
    vectors = clustered(USERS, DIM, seed=4)
    users = np.arange(USERS)
    tables = []
    for part in np.array_split(users, 3):
        tables.append(rep_table(part.tolist(), [None] * len(part), vectors[part], computed_at_ms=T0_MS))
    pairs = rep_table([1, 1, 2], [500, 501, 500], np.ones((3, DIM), np.float32))
    old = rep_table(list(range(50)), [None] * 50, -vectors[:50], computed_at_ms=T0_MS - 86_400_000)
    tables[1] = pa.concat_tables([tables[1], pairs, old])
    return write_representations(root, tables), vectors


def index(tmp: Path, reps_dir: Path, name: str, *flags: str) -> Path:
    out = tmp / name
    assert main(["index", "--representations", str(reps_dir), "--output", str(out), *flags]) == 0
    return out


def test_multi_shard_run_equals_single_shard(tmp_path: Path, reps: tuple[Path, np.ndarray]) -> None:
    folder, vectors = reps
    flags = ("--factory", "IVF16,Flat", "--search-params", "nprobe=4")
    one = index(tmp_path, folder, "one", *flags)
    three = index(tmp_path, folder, "three", *flags, "--shards", "3")
    m1, m3 = read_manifest(one), read_manifest(three)
    assert (m3.count, m3.dim, m3.model_version, m3.metric, m3.shards, m3.layout) == (
        USERS,
        DIM,
        VERSION,
        "ip",
        3,
        "ondisk",
    )
    assert sorted(p.name for p in three.iterdir()) == [
        "_COMMITTED",
        "ids.parquet",
        "index.faiss",
        "lists.ivfdata",
        "manifest.json",
        "vectors.npy",
    ]  # the shard files are gone
    np.testing.assert_array_equal(read_id_map(three), np.arange(USERS))
    np.testing.assert_array_equal(read_vectors(three), vectors.astype(np.float16))  # newest rows won
    queries = clustered(50, DIM, seed=4)[:50]
    a, b = UserIndex.load(one), UserIndex.load(three)
    np.testing.assert_array_equal(a.search(queries, 10)[1], b.search(queries, 10)[1])
    assert m1.search_params == m3.search_params == "nprobe=4"


def test_hnsw_shards_kept_as_a_sharded_index(tmp_path: Path, reps: tuple[Path, np.ndarray]) -> None:
    folder, _ = reps
    out = index(tmp_path, folder, "hnsw", "--factory", "HNSW16", "--shards", "2", "--recall-target", "0.9")
    manifest = read_manifest(out)
    assert manifest.layout == "sharded" and manifest.files == ["shard-00000.faiss", "shard-00001.faiss"]
    assert manifest.tuned_recall_at_10 is not None and manifest.tuned_recall_at_10 >= 0.9
    found = UserIndex.load(out).neighbors(np.array([0, 899]), 5)
    assert (found.user_ids >= 0).all()


def test_bad_inputs_fail_with_the_flag_named(
    tmp_path: Path, reps: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = reps
    assert main(["index", "--representations", str(tmp_path / "nope"), "--output", str(tmp_path / "x")]) == 2
    assert "--representations" in capsys.readouterr().err
    mixed = write_representations(
        tmp_path / "mixed",
        [
            rep_table([1], [None], np.ones((1, DIM), np.float32)),
            rep_table([2], [None], np.ones((1, DIM), np.float32), version="gem-other"),
        ],
    )
    assert main(["index", "--representations", str(mixed), "--output", str(tmp_path / "y")]) == 2
    assert "2 model versions" in capsys.readouterr().err
    out = index(tmp_path, folder, "twice", "--factory", "Flat")
    assert main(["index", "--representations", str(folder), "--output", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (
        main(["index", "--representations", str(folder), "--output", str(tmp_path / "z"), "--factory", "IVF4096,Flat"])
        == 2
    )
    assert "needs at least 4096 training vectors" in capsys.readouterr().err


def test_pairs_only_input_is_refused_naming_all_users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A precompute run without --all-users has no user rows: an index of 0 users would answer nothing."""
    folder = write_representations(tmp_path / "pairs", [rep_table([1, 2], [5, 6], np.ones((2, DIM), np.float32))])
    assert main(["index", "--representations", str(folder), "--output", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no user-level representations" in err and "--all-users" in err and "Fix:" in err, err
    assert not (tmp_path / "empty").exists()


def test_lookup_prints_each_path(
    tmp_path: Path, reps: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = reps
    out = index(tmp_path, folder, "for-lookup", "--factory", "Flat")
    near = int(UserIndex.load(out).neighbors(np.array([7]), 1).user_ids[0, 0])
    now = int(time.time() * 1000)
    store = LmdbStore(LmdbConfig(str(tmp_path / "store")))
    store.write_batch(
        rep_table(
            [7, 7, near],
            [1, 2, 3],
            np.ones((3, DIM), np.float32),
            computed_at_ms=[now - 60_000, now - 7_200_000, now - 60_000],
        )
    )
    store.close()
    capsys.readouterr()
    args = [
        "lookup",
        "--store",
        f"lmdb://{tmp_path / 'store'}",
        "--index",
        str(out),
        "--user",
        "7",
        "--ads",
        "1,2,3,4",
        "--max-age",
        "1h",
    ]
    assert main([*args, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["path"] for r in rows] == ["exact", "same_user_pair", "similar_users", "none"]
    assert rows[0]["age_s"] == pytest.approx(60, abs=30) and len(rows[2]["embedding"]) == DIM
    assert main(args) == 0
    assert "exact 1, same_user_pair 1, similar_users 1, none 1" in capsys.readouterr().out
    assert main([*args, "--model-version", "gem-v0"]) == 2
    assert "asks for model_version 'gem-v0'" in capsys.readouterr().err
    assert main([*args[:-4], "--ads", "x,y"]) == 2
