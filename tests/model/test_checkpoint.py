"""Checkpoints: round trip, weights-only loading, clear errors on mismatch or a bad file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipelines.errors import ConfigError
from pipelines.model.checkpoint import CheckpointError, load_model, resolve_device, save_checkpoint
from pipelines.model.config import ARCHITECTURE_VERSION
from pipelines.model.gem import GemModel
from tests.model.factories import random_batch, tiny_config


@pytest.fixture()
def saved(tmp_path: Path) -> tuple[GemModel, Path]:
    torch.manual_seed(3)
    model = GemModel(tiny_config()).eval()
    save_checkpoint(model, tmp_path / "m")
    return model, tmp_path / "m"


def test_round_trip_gives_identical_outputs_and_version(saved: tuple[GemModel, Path]) -> None:
    model, folder = saved
    loaded = load_model(folder, device="cpu")
    batch = random_batch([5, 0, 11])
    with torch.no_grad():
        assert torch.equal(model(batch).click_logit, loaded(batch).click_logit)
    assert loaded.model_version == model.model_version
    assert loaded.model_version.startswith(f"gem{ARCHITECTURE_VERSION}-")
    assert not loaded.training
    assert loaded.config == model.config


def test_checkpoint_is_a_weights_only_file(saved: tuple[GemModel, Path]) -> None:
    payload = torch.load(saved[1] / "model.pt", weights_only=True)
    assert set(payload) == {"format", "architecture_version", "model_version", "config", "state_dict"}


def test_expected_config_mismatch_names_the_fields(saved: tuple[GemModel, Path]) -> None:
    with pytest.raises(CheckpointError, match=r"config mismatch: d_model: expected 32, checkpoint has 16"):
        load_model(saved[1], device="cpu", expected_config=tiny_config(d_model=32))


def test_weights_that_do_not_fit_the_stored_config_are_an_error(saved: tuple[GemModel, Path]) -> None:
    path = saved[1] / "model.pt"
    payload = torch.load(path, weights_only=True)
    payload["config"]["num_layers"] = 3
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="weights do not match the config"):
        load_model(path, device="cpu")


@pytest.mark.parametrize("content", [b"not a checkpoint", None])
def test_bad_or_missing_file_is_a_clear_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "model.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=str(path)):
        load_model(path, device="cpu")


def test_other_architecture_version_is_refused(saved: tuple[GemModel, Path]) -> None:
    path = saved[1] / "model.pt"
    payload = torch.load(path, weights_only=True)
    payload["architecture_version"] = 99
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="architecture version 99"):
        load_model(path, device="cpu")


def test_unsafe_pickles_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"format": "gem-checkpoint", "evil": Path("/")}, path)  # needs full unpickling
    with pytest.raises(CheckpointError, match="weights-only"):
        load_model(path, device="cpu")


def test_device_choice() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="--device"):
        resolve_device("tpu")
