"""A small world for the crash-recovery suite, and the results table printed at the end of the session."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.cli import main
from tests.recovery.crash import RESULTS


@dataclass(frozen=True)
class World:
    root: Path
    events: Path
    candidates: Path
    features: Path
    representations: Path
    model: Path

    @property
    def histories(self) -> int:
        """Histories in the reference features run (the count every recovered run must reach)."""
        return int(json.loads((self.features / "summary.json").read_text())["histories"])


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """~600 users x 4 days (JSONL, so it can be produced to Kafka too), its features, a tiny model and
    its user-level representations."""
    import torch

    from pipelines.model import GemConfig, GemModel, save_checkpoint

    root = tmp_path_factory.mktemp("recovery-world")
    events, candidates = root / "events.jsonl", root / "candidates.parquet"
    generate = ["generate", "--users", "600", "--days", "4", "--seed", "18", "--output", str(events)]
    assert main([*generate, "--candidates", str(candidates), "--requests", "150"]) == 0
    assert main(["features", "--input", str(events), "--output", str(root / "features"), "--num-shards", "4"]) == 0
    torch.manual_seed(0)
    config = GemConfig(d_model=16, num_heads=2, num_layers=1, max_len=32, block_size=16, representation_dim=8)
    save_checkpoint(GemModel(config), root / "model")
    reps = root / "reps"
    assert (
        main(
            [
                "precompute",
                "--features",
                str(root / "features"),
                "--candidates",
                str(candidates),
                "--model",
                str(root / "model"),
                "--output",
                str(reps),
                "--all-users",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    return World(root, events, candidates, root / "features", reps, root / "model")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    width = max(len(case) for case, _ in RESULTS)
    lines = [f"{'case':<{width}}  outcome", f"{'-' * width}  -------"]
    lines += [f"{case:<{width}}  {outcome}" for case, outcome in RESULTS]
    terminalreporter.write_sep("=", "crash-recovery results")
    for line in lines:
        terminalreporter.write_line(line)
    if target := os.environ.get("GEM_RECOVERY_TABLE"):
        Path(target).write_text("\n".join(lines) + "\n")
