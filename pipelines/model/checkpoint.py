"""Checkpoints: the state dict, the config and the model version, loaded with ``weights_only``.

A checkpoint file (``MODEL_DIR/model.pt``) is a plain dict::

    {"format": "gem-checkpoint", "architecture_version": int, "model_version": str,
     "config": GemConfig.to_dict(), "state_dict": {name: tensor}}

Nothing in it needs unpickling of arbitrary classes, so ``torch.load(...,
weights_only=True)`` reads it. A checkpoint written by another architecture
version, or whose config differs from the one the caller expects, or whose tensors
do not fit the model its config builds, is a :class:`CheckpointError` naming what
differs.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from pipelines.errors import ConfigError, PipelinesError
from pipelines.model.config import ARCHITECTURE_VERSION, GemConfig
from pipelines.model.gem import GemModel

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "model.pt"
_FORMAT = "gem-checkpoint"


class CheckpointError(PipelinesError, ValueError):
    """A checkpoint cannot be loaded into the model that was asked for."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present else CPU; ``cpu``; ``cuda`` (an error when absent)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                "--device", "cuda was asked for but no CUDA device is visible", "pass --device auto or --device cpu"
            )
        return torch.device(name)
    raise ConfigError("--device", f"unknown device {name!r}", "pass auto, cpu or cuda")


def _checkpoint_path(path: str | Path) -> Path:
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() or not path.suffix else path


def model_version(model: GemModel) -> str:
    """``gem<arch>-<config fingerprint>-<weights digest>``: equal weights, equal version."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"gem{ARCHITECTURE_VERSION}-{model.config.fingerprint()}-{digest.hexdigest()[:10]}"


def save_checkpoint(model: GemModel, path: str | Path) -> Path:
    """Write ``model`` to ``path`` (a directory gets ``model.pt``); sets ``model.model_version``."""
    target = _checkpoint_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    model.model_version = model_version(model)
    state = {name: t.detach().cpu() for name, t in model.state_dict().items()}
    payload: dict[str, Any] = {
        "format": _FORMAT,
        "architecture_version": ARCHITECTURE_VERSION,
        "model_version": model.model_version,
        "config": model.config.to_dict(),
        "state_dict": state,
    }
    tmp = target.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(target)
    return target


def _config_diff(expected: GemConfig, found: GemConfig) -> list[str]:
    a, b = expected.to_dict(), found.to_dict()
    return [f"{k}: expected {a[k]!r}, checkpoint has {b[k]!r}" for k in sorted(a) if a[k] != b.get(k)]


def _read(target: Path) -> dict[str, Any]:
    if not target.exists():
        raise CheckpointError(f"{target}: no checkpoint there; train one with `python -m pipelines train`")
    try:
        payload = torch.load(target, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise CheckpointError(f"{target}: not a loadable weights-only checkpoint ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise CheckpointError(f"{target}: not a GEM checkpoint (no format={_FORMAT!r} entry)")
    if payload.get("architecture_version") != ARCHITECTURE_VERSION:
        raise CheckpointError(
            f"{target}: architecture version {payload.get('architecture_version')}, "
            f"this code reads version {ARCHITECTURE_VERSION}; retrain the model"
        )
    return payload


def load_model(
    path: str | Path, *, device: str | torch.device = "auto", expected_config: GemConfig | None = None
) -> GemModel:
    """Load a checkpoint (file or model directory) into a :class:`GemModel` in eval mode.

    ``expected_config``, when given, must equal the stored config field by field.
    """
    target = _checkpoint_path(path)
    payload = _read(target)
    try:
        config = GemConfig.from_dict(payload["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{target}: stored config is invalid for this code ({exc})") from exc
    if expected_config is not None and expected_config != config:
        diff = "; ".join(_config_diff(expected_config, config))
        raise CheckpointError(f"{target}: config mismatch: {diff}")
    model = GemModel(config)
    try:
        result = model.load_state_dict(payload["state_dict"], strict=False)
    except RuntimeError as exc:  # shape mismatches
        raise CheckpointError(f"{target}: weights do not match the config ({exc})") from exc
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(
            f"{target}: weights do not match the config: missing "
            f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    model.model_version = str(payload["model_version"])
    dev = resolve_device(device) if isinstance(device, str) else device
    log.info("loaded %s (%s) on %s", target, model.model_version, dev)
    return model.to(dev).eval()
