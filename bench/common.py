"""Helpers shared by the benchmark scripts (sizes, timing, the RESULT line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
QUICK = os.environ.get("QUICK", "") not in ("", "0")
ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("BENCH_DIR", ROOT / "out" / "bench"))


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def generate(users: int, days: int, output: Path, seed: int = 11, flags: Sequence[str] = ()) -> Path:
    """Generator output at ``output`` (reused when it exists: name ``output`` after every argument,
    ``flags`` (more generator flags) included)."""
    if output.exists():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "generate",
            "--users",
            str(users),
            "--days",
            str(days),
            "--seed",
            str(seed),
            "--output",
            str(output),
            *flags,
        ],
        check=True,
    )
    return output


def untrained_model(directory: Path) -> Path:
    """A seeded, untrained model of the default GemConfig saved in ``directory`` (re-made on every run, so it
    never predates the architecture); for benches whose cost does not depend on the weights."""
    import torch

    from pipelines.model import GemConfig, GemModel, save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(GemModel(GemConfig()), directory)
    return directory


def result(name: str, ratio: float, target: float, text: str) -> None:
    print(f"RESULT {name} ratio={ratio:.3f} target={target:g} {text}", flush=True)
