"""A small generated world, its features and an untrained tiny model, shared by the precompute tests."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from pipelines.cli import main
from pipelines.io.files import match_files
from pipelines.io.parquet import read_table
from pipelines.schemas.layouts import HISTORY


@dataclass(frozen=True)
class World:
    root: Path
    events: Path
    candidates: Path
    features: Path
    model: Path

    @cached_property
    def histories(self) -> pa.Table:
        """Every user's history (HISTORY layout) from the features run (read once)."""
        paths = match_files(str(self.features / "histories/*/*.parquet"))
        return pa.concat_tables(read_table(p, HISTORY) for p in paths)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    from pipelines.model import GemConfig, GemModel, save_checkpoint

    root = tmp_path_factory.mktemp("precompute-world")
    events, candidates = root / "events.parquet", root / "candidates.parquet"
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
                str(events),
                "--candidates-output",
                str(candidates),
                "--requests",
                "120",
            ]
        )
        == 0
    )
    assert main(["features", "--input", str(events), "--output", str(root / "features"), "--num-shards", "4"]) == 0
    torch.manual_seed(0)
    config = GemConfig(d_model=16, num_heads=2, num_layers=2, max_len=48, block_size=16, representation_dim=8)
    save_checkpoint(GemModel(config), root / "model")
    return World(root, events, candidates, root / "features", root / "model")
