"""Precompute end to end (local runner, embedded store), plus its pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.precompute.batching import concat_batches
from pipelines.precompute.handler import GemModelHandler, element_tokens
from pipelines.precompute.records import latest_per_key
from pipelines.precompute.requests import check_candidates
from pipelines.schemas.layouts import CANDIDATES, layout_of
from tests.precompute.conftest import World


def _run(world: World, out: Path, *extra: str) -> dict:
    assert (
        main(
            [
                "precompute",
                "--features",
                str(world.features),
                "--candidates",
                str(world.candidates),
                "--model",
                str(world.model),
                "--output",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    return json.loads((out / "summary.json").read_text())


def _reps(out: Path) -> pa.Table:
    return ds.dataset(out / "representations", format="parquet", partitioning="hive").to_table()


@pytest.fixture(scope="module")
def run_all_users(world: World, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("reps")
    return out, _run(world, out, "--all-users", "--store", f"lmdb://{out}-store", "--contexts")


def test_every_pair_and_user_gets_a_representation(world: World, run_all_users) -> None:
    out, summary = run_all_users
    candidates = pq.read_table(world.candidates)
    expected = {
        (u, a)
        for u, ads in zip(
            candidates.column("user_id").to_pylist(), candidates.column("ad_ids").to_pylist(), strict=True
        )
        for a in ads
    }
    reps = _reps(out)
    pairs = reps.filter(reps.column("ad_id").is_valid())
    got = set(zip(pairs.column("user_id").to_pylist(), pairs.column("ad_id").to_pylist(), strict=True))
    assert got == expected
    assert summary["pairs_in"] == summary["pairs_out"] + summary["pairs_superseded"]
    histories = ds.dataset(world.features / "histories", format="parquet", partitioning="hive").to_table()
    users = reps.filter(reps.column("ad_id").is_null())
    assert sorted(users.column("user_id").to_pylist()) == sorted(histories.column("user_id").to_pylist())
    assert layout_of(pq.read_schema(next((out / "representations").glob("*/*.parquet")))) == ("representation", 1)


def test_user_embeddings_are_unit_vectors_and_scores_are_probabilities(run_all_users) -> None:
    reps = _reps(run_all_users[0])
    users = reps.filter(reps.column("ad_id").is_null())
    emb = np.stack(users.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=2e-3)
    p = reps.column("p_click").to_numpy()
    assert np.all((p > 0) & (p < 1))
    assert len(set(reps.column("model_version").to_pylist())) == 1


def test_store_holds_what_parquet_holds(run_all_users) -> None:
    from pipelines.store import open_store

    out, _ = run_all_users
    reps = _reps(out).slice(0, 50)
    with open_store(f"lmdb://{out}-store") as store:
        keys = [
            (u, a) for u, a in zip(reps.column("user_id").to_pylist(), reps.column("ad_id").to_pylist(), strict=True)
        ]
        result = store.read_batch(keys)
    assert result.found.all()
    expected = np.stack(reps.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    assert np.allclose(result.embedding, expected, atol=1e-3)


def test_store_holds_each_users_context_as_of_its_histories(world: World, run_all_users) -> None:
    """--contexts: every written user's context record, with the representations' version and time,
    equal to the context computed from the histories after their last event."""
    from pipelines.model import HistoryIndex
    from pipelines.model.context import decode_contexts, user_contexts
    from pipelines.store import open_store

    out, summary = run_all_users
    reps = _reps(out)
    users = np.unique(reps.column("user_id").to_numpy())
    assert summary["contexts_out"] == len(users) and summary["contexts"] is True
    histories = ds.dataset(world.features / "histories", format="parquet", partitioning="hive").to_table()
    index = HistoryIndex(histories.drop_columns([c for c in histories.column_names if c == "shard"]))
    expected = user_contexts(index, users, np.full(len(users), int(index.event_time.max()) + 1))
    with open_store(f"lmdb://{out}-store") as store:
        got = store.read_contexts(users.tolist())
    assert all(c.found for c in got)
    assert {c.model_version for c in got} == set(reps.column("model_version").to_pylist())
    decoded = decode_contexts([c.payload for c in got])
    np.testing.assert_array_equal(decoded["window"], expected["window"])
    np.testing.assert_array_equal(decoded["totals"], expected["totals"])
    has_events = expected["last_ms"] != np.iinfo(np.int64).min
    assert has_events.any()
    np.testing.assert_array_equal(decoded["last_ms"], expected["last_ms"])


def test_users_without_history_and_bad_rows(world: World, tmp_path: Path) -> None:
    good = pa.table(
        {
            "request_id": ["r1"],
            "user_id": [10**12],
            "surface": pa.array([2], pa.int8()),
            "request_time": pa.array([1_800_000_000_000], pa.timestamp("ms", tz="UTC")),
            "ad_ids": [[5, 6, 7]],
        },
        schema=CANDIDATES.schema,
    )
    bad = pa.table(
        {
            "request_id": ["r2", "r3"],
            "user_id": [1, 2],
            "surface": pa.array([2, 99], pa.int8()),
            "request_time": pa.array([1_800_000_000_000] * 2, pa.timestamp("ms", tz="UTC")),
            "ad_ids": [[], [1]],
        },
        schema=CANDIDATES.schema,
    )
    path = tmp_path / "c.parquet"
    pq.write_table(pa.concat_tables([good, bad]), path)
    out = tmp_path / "out"
    assert (
        main(
            [
                "precompute",
                "--features",
                str(world.features),
                "--candidates",
                str(path),
                "--model",
                str(world.model),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    reps = _reps(out)
    assert sorted(reps.column("ad_id").to_pylist()) == [5, 6, 7]
    dead = pq.read_table(out / "dead_letters" / "part-00000.parquet")
    assert sorted(dead.column("reason").to_pylist()) == ["empty_candidates", "out_of_range"]


def test_bad_flags_fail_before_work(world: World, tmp_path: Path, capsys) -> None:
    base = ["precompute", "--candidates", str(world.candidates), "--output", str(tmp_path / "o")]
    assert main([*base, "--features", str(tmp_path), "--model", str(world.model)]) == 2
    assert "--features" in capsys.readouterr().err
    assert main([*base, "--features", str(world.features), "--model", str(tmp_path)]) == 2
    assert "--model" in capsys.readouterr().err
    assert main([*base, "--features", str(world.features), "--model", str(world.model), "--token-budget", "0"]) == 2
    assert "--token-budget" in capsys.readouterr().err
    assert main([*base, "--features", str(world.features), "--model", str(world.model), "--store", "mongodb://x"]) == 2
    assert "--store" in capsys.readouterr().err
    assert main([*base, "--features", str(world.features), "--model", str(world.model), "--contexts"]) == 2
    assert "--contexts" in capsys.readouterr().err


def test_check_candidates_reasons() -> None:
    table = pa.table(
        {
            "request_id": ["a", "b", "c"],
            "user_id": [1, -1, 3],
            "surface": pa.array([0, 0, 0], pa.int8()),
            "request_time": pa.array([1, 2, None], pa.timestamp("ms", tz="UTC")),
            "ad_ids": [[1], [2], [3]],
        }
    )
    check = check_candidates(table, "c.parquet")
    assert check.valid.column("request_id").to_pylist() == ["a"]
    assert check.dead_letters.column("source").to_pylist() == ["c.parquet:1", "c.parquet:2"]


def test_latest_request_wins_per_key() -> None:
    table = pa.table({"user_id": [1, 1, 1, 2], "ad_id": [5, 5, 6, None], "v": [0, 1, 2, 3]})
    kept, superseded = latest_per_key(table, np.array([20, 10, 5, 1]))
    assert kept.column("v").to_pylist() == [0, 2, 3] and superseded == 1


def test_concat_and_handler_results_own_their_memory(world: World) -> None:
    from pipelines.model import HistoryIndex, load_model
    from pipelines.precompute.requests import request_elements

    model = load_model(world.model, device="cpu")
    histories = ds.dataset(world.features / "histories", format="parquet", partitioning="hive").to_table()
    elements = request_elements(
        HistoryIndex(histories), pq.read_table(world.candidates).slice(0, 5), max_len=model.config.max_len, catalog=None
    )
    batches = [b for _, b in elements]
    merged = concat_batches(batches)
    assert merged.num_rows == sum(b.num_rows for b in batches)
    assert merged.num_tokens == sum(b.num_tokens for b in batches)
    handler = GemModelHandler(str(world.model))
    results = list(handler.run_inference(batches, model))
    whole = model.represent(merged)
    first = results[0].inference[0]  # type: ignore[index]
    assert first.pair_embedding.base is None  # a copy, not a view of the batch output
    assert np.allclose(
        np.concatenate([r.inference[0].pair_embedding for r in results]),  # type: ignore[index]
        whole.pair_embedding,
        atol=1e-5,
    )
    assert handler.batch_elements_kwargs()["element_size_fn"]((0, batches[0])) == element_tokens(batches[0])


def test_inspect_representations(run_all_users, capsys) -> None:
    out, summary = run_all_users
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "representation v1" in text
    assert f'"users": {summary["users_out"]}' in text and f'"pairs": {summary["pairs_out"]}' in text
