"""Typos that would give wrong answers with exit 0: every input is checked before any work,
a reader never creates a store, and an input that cannot give a meaningful result is an error naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main
from tests.recovery.conftest import World
from tests.recovery.crash import record, refused, short

pytestmark = pytest.mark.integration


def test_solaris_with_a_missing_model_stops_before_the_store(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    argv = ["solaris", "--topic", "unused", "--candidates-topic", "unused-sets", "--group", "unused"]
    argv += ["--output", str(tmp_path / "o"), "--model", str(tmp_path / "nope")]
    err = refused([*argv, "--store", f"lmdb://{store}"], capsys)
    assert "--model" in err and not store.exists()
    record("solaris --model /nope", short(err))


def test_lookup_never_creates_the_store_it_reads(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "index"
    assert main(["index", "--representations", str(world.representations), "--output", str(index)]) == 0
    store = tmp_path / "nope" / "store"
    err = refused(["lookup", "--store", f"lmdb://{store}", "--index", str(index), "--user", "1", "--ads", "5"], capsys)
    assert "no LMDB store" in err and not (tmp_path / "nope").exists()
    record("lookup --store lmdb:///nope/store", short(err))


def test_index_of_pairs_only_names_all_users(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reps = tmp_path / "pairs"
    precompute = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    assert main([*precompute, "--model", str(world.model), "--output", str(reps), "--device", "cpu"]) == 0
    err = refused(["index", "--representations", str(reps), "--output", str(tmp_path / "index")], capsys)
    assert "--all-users" in err and not (tmp_path / "index").exists()
    record("index of a precompute without --all-users", short(err))
