"""The fallback evaluation on a small generated world with an untrained tiny model (shapes and wiring;
the figures that matter come from a trained model, see docs/guides/similarity.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipelines.cli import main
from pipelines.similarity.build import BuildSpec, build_index
from pipelines.similarity.evaluate import neighbor_quality
from pipelines.similarity.user_index import UserIndex
from tests.similarity.data import users

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.model import GemConfig, GemModel, save_checkpoint

    root = tmp_path_factory.mktemp("fallback-world")
    assert (
        main(
            [
                "generate",
                "--users",
                "300",
                "--days",
                "5",
                "--seed",
                "5",
                "--output",
                str(root / "events.parquet"),
                "--candidates-output",
                str(root / "candidates.parquet"),
                "--requests",
                "150",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "features",
                "--input",
                str(root / "events.parquet"),
                "--output",
                str(root / "features"),
                "--num-shards",
                "2",
            ]
        )
        == 0
    )
    torch.manual_seed(0)
    config = GemConfig(d_model=16, num_heads=2, num_layers=2, max_len=48, block_size=16, representation_dim=8)
    save_checkpoint(GemModel(config), root / "model")
    return root


def test_click_head_split_reproduces_the_model(world: Path) -> None:
    from pipelines.model import HistoryIndex, load_model
    from pipelines.model.reps import PairQueries, click_logits, pair_reps
    from pipelines.model.train.data import load_features

    model = load_model(world / "model", device="cpu")
    histories, examples = load_features(world / "features")
    rows = examples.slice(0, 64)

    def col(name: str) -> np.ndarray:
        return np.asarray(rows.column(name).fill_null(-1).to_numpy(zero_copy_only=False)).astype(np.int64)

    q = PairQueries(col("user_id"), col("item_id"), col("advertiser_id"), col("item_category"), col("surface"))
    reps = pair_reps(model, HistoryIndex(histories), q, rows.column("event_time").cast(pa.int64()).to_numpy())
    np.testing.assert_allclose(click_logits(model, reps.pair, q.surface), reps.click_logit, rtol=1e-5, atol=1e-5)


def test_evaluate_fallback_reports_every_path(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = world / "eval"
    assert (
        main(
            [
                "evaluate-fallback",
                "--features",
                str(world / "features"),
                "--model",
                str(world / "model"),
                "--output",
                str(out),
                "--truth",
                str(world / "events.truth"),
                "--candidates",
                str(world / "candidates.parquet"),
                "--max-pairs",
                "600",
                "--k",
                "5",
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    printed = capsys.readouterr().out
    assert "similar_users" in printed and "neighbours:" in printed and "request stream (policy)" in printed
    assert report["hidden"] > 0 and sum(report["policy"]["mix"].values()) == report["hidden"]
    alone = report["similar_users"]["similar_users"]
    assert alone["share_of_hidden"] > 0.5 and -1.0 <= alone["cosine_mean"] <= 1.0
    assert {"auc_exact", "auc_fallback", "auc_none", "gain_kept"} <= set(alone["head_pair"])
    assert report["same_user_pair"]["same_user_pair"]["share_of_hidden"] == 1.0  # every hidden pair has its day-old
    level = report["same_user"]["same_user"]
    assert "head_user" in level and "head_pair" not in level and "cosine_mean" not in level
    stream = report["stream"]["pairs_only"]
    assert stream["requests"] > 0 and sum(stream["mix"].values()) == stream["candidates"]
    assert stream["mix"]["same_user"] == 0
    assert 0.0 <= report["neighbors"]["same_segment_share"] <= 1.0
    assert 0.0 <= report["neighbors_category_profile"]["same_segment_share"] <= 1.0
    assert -1.0 <= alone["cosine_none_mean"] <= 1.0
    control = report["random_users_control"]
    assert control["count"] == report["hidden"] and "gain_kept" in control["head_pair"]
    assert "random users" in printed
    assert (out / "index" / "manifest.json").is_file()


def test_neighbor_quality_against_segments() -> None:
    vectors = np.zeros((40, 4), np.float32)
    vectors[:20, 0], vectors[20:, 1] = 1.0, 1.0
    vectors += np.random.default_rng(0).normal(scale=0.01, size=vectors.shape).astype(np.float32)
    index = UserIndex.from_built(build_index(users(vectors), BuildSpec(factory="Flat")))
    truth = pa.table({"user_id": index.user_ids, "segment": np.repeat([0, 1], 20).astype(np.int32)})
    got = neighbor_quality(index, truth, k=5)
    assert got["same_segment_share"] == 1.0 and got["random_same_segment_share"] < 0.75
