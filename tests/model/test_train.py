"""Training on a tiny planted-signal world: metrics file, learning, determinism, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines.cli import main
from pipelines.model.checkpoint import load_model
from pipelines.model.config import GemConfig
from pipelines.model.inputs import HistoryIndex, build_user_batch
from pipelines.model.train.data import load_features, sample_by_label
from pipelines.model.train.loop import TrainConfig, load_predictions, train_model
from pipelines.model.train.metrics import auc
from tests.model.factories import tiny_config
from tests.model.toyworld import ToyWorld, make_world, write_features_dir


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    histories, examples = make_world(ToyWorld(users=120, mean_impressions=20, seed=3))
    return write_features_dir(tmp_path_factory.mktemp("features"), histories, examples)


def _train(features: Path, out: Path, seed: int = 0) -> dict:
    config = tiny_config(d_model=32, num_heads=4, block_size=16, representation_dim=16)
    tc = TrainConfig(epochs=4, batch_size=32, learning_rate=3e-3, warmup_steps=10, seed=seed, progress=False)
    return train_model(features, out, config, tc)


def test_training_writes_metrics_learns_and_is_deterministic(features_dir: Path, tmp_path: Path) -> None:
    first = _train(features_dir, tmp_path / "a")
    on_disk = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert on_disk["model_version"] == first["model_version"]
    for part in ("model", "baseline", "popularity"):
        for task in ("click", "conversion"):
            assert set(on_disk[part][task]) >= {"auc", "ne"}
    losses = first["training"]["epoch_losses"]
    assert losses[-1] < losses[0] * 0.95  # the loss goes down
    assert first["model"]["click"]["auc"] > 0.55  # and it learned something that holds out
    assert 0.3 < first["component_skip"]["flops_saved_fraction"] < 0.9
    assert first["data"]["holdout_examples"] > 0 and first["data"]["train_examples"] > 0
    again = _train(features_dir, tmp_path / "b")
    assert again["model_version"] == first["model_version"]  # same seed, same weights
    assert again["model"] == first["model"]
    assert load_model(tmp_path / "a", device="cpu").model_version == first["model_version"]
    stored = load_predictions(tmp_path / "a")  # the holdout's rows and predictions, in the metrics' order
    assert len(stored["weights"]) == len(stored["history_length"]) == first["data"]["holdout_examples"]
    for who, part in (("model", "model"), ("baseline", "baseline")):
        assert auc(stored["clicked"], stored[f"{who}_clicked"], stored["weights"]) == pytest.approx(
            first[part]["click"]["auc"]
        )


def test_cli_trains_end_to_end(features_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    code = main(
        [
            "train",
            "--features",
            str(features_dir),
            "--output",
            str(out),
            "--epochs",
            "1",
            "--max-examples",
            "400",
            "--max-holdout",
            "300",
            "--layers",
            "2",
            "--d-model",
            "32",
            "--device",
            "auto",
            "--seed",
            "1",
            "--no-progress",
            "--no-esmm",
        ]
    )
    assert code == 0
    assert (out / "model.pt").exists() and (out / "metrics.json").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["train_examples"] == 400 and metrics["training"]["seed"] == 1
    assert metrics["config"]["esmm"] is False and GemConfig().esmm  # the flag turns the default off
    assert "saved" in capsys.readouterr().out
    # the inference contract the precompute stage relies on
    model = load_model(out, device="cpu")
    histories, _ = load_features(features_dir)
    index = HistoryIndex(histories)
    reps = model.represent(build_user_batch(index, max_len=model.config.max_len))
    assert reps.user_embedding.shape == (histories.num_rows, 64)
    assert np.allclose(np.linalg.norm(reps.user_embedding, axis=1), 1.0, atol=1e-5)
    assert np.all((reps.p_click > 0) & (reps.p_click < 1)) and np.all(reps.ad_id == -1)


@pytest.mark.integration
def test_python_dash_m_pipelines_train(features_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "model"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "train",
            "--features",
            str(features_dir),
            "--output",
            str(out),
            "--max-examples",
            "200",
            "--max-holdout",
            "200",
            "--layers",
            "2",
            "--d-model",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "metrics.json").read_text())["model"]["click"]["count"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--epochs", "0"], "--epochs"),
        (["--device", "tpu"], "--device"),
        (["--max-len", "-3"], "--max-len"),
        (["--d-model", "30"], "--d-model"),
        (["--max-examples", "-1"], "--max-examples"),
    ],
)
def test_bad_flags_fail_before_any_work(
    features_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    try:
        code = main(["train", "--features", str(features_dir), "--output", str(tmp_path / "m"), *flags])
    except SystemExit as usage_error:  # a value outside the flag's choices stops argparse itself
        code = int(usage_error.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Fix:" in err
    assert not (tmp_path / "m" / "model.pt").exists()


def test_missing_data_and_existing_model_are_clear_errors(
    features_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--features", str(tmp_path / "nowhere"), "--output", str(tmp_path / "m")]) == 2
    assert "--features" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.pt").write_bytes(b"x")
    assert main(["train", "--features", str(features_dir), "--output", str(tmp_path / "m")]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("conversion_rate", [0.2, 0.9])  # 0.9: more conversions than the positive budget
def test_label_sample_keeps_conversions_and_weights_back_to_the_table(conversion_rate: float) -> None:
    rng = np.random.default_rng(0)
    clicked = rng.random(5000) < 0.05
    converted = clicked & (rng.random(5000) < conversion_rate)
    table = pa.table({"row": np.arange(5000), "clicked": clicked, "converted": converted})
    sample, weights = sample_by_label(table, 800, 0.25, seed=1)
    assert sample.num_rows == 800 and len(weights) == 800
    rows = sample.column("row").to_numpy()
    assert np.all(np.diff(rows) > 0)
    # every conversion while they fit in half the positive budget (200 // 2), else exactly that half
    assert np.isin(np.flatnonzero(converted), rows).sum() == min(int(converted.sum()), round(0.25 * 800) // 2)
    for name, labels in (("clicked", clicked), ("converted", converted)):
        got = sample.column(name).to_numpy(zero_copy_only=False).astype(float)
        assert np.average(got, weights=weights) == pytest.approx(labels.mean())
    assert weights.sum() == pytest.approx(5000)
    uniform, ones = sample_by_label(table, 800, None, seed=1)
    assert uniform.num_rows == 800 and np.all(ones == 1)
