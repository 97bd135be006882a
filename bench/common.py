"""Helpers shared by the benchmark scripts (sizes, timing, the RESULT line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
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


def generate(users: int, days: int, output: Path, seed: int = 11) -> Path:
    """Generator output at ``output`` (reused when it already exists for these arguments)."""
    if output.exists():
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pipelines", "generate", "--users", str(users), "--days", str(days),
                    "--seed", str(seed), "--output", str(output)], check=True)
    return output


def result(name: str, ratio: float, target: float, text: str) -> None:
    print(f"RESULT {name} ratio={ratio:.3f} target={target:g} {text}", flush=True)
