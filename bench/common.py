"""Helpers shared by the benchmark scripts (sizes, timing, FLOP/s, the RESULT line)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

    from pipelines.io.kafka.config import KafkaConnection

T = TypeVar("T")
QUICK = os.environ.get("QUICK", "") not in ("", "0")
ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("BENCH_DIR", ROOT / "out" / "bench"))


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def best_time(fn: Callable[[], object], repeats: int, device: torch.device | None = None) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up (noise on a shared machine is one-sided);
    waits for ``device`` (CUDA) work to finish before reading the clock."""
    import torch

    def sync() -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(device: torch.device, n: int = 2048) -> float:
    """This machine's fp32 matmul FLOP/s on ``device`` (one large ``torch.mm``, at the current torch
    thread setting): the peak that a model's achieved FLOP/s is measured against."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n**3 / best_time(lambda: a @ b, 5, device)


def flops_of(fn: Callable[[], T]) -> tuple[T, int]:
    """``fn()`` and the FLOPs torch's counter saw it run (matmuls, attention, convolutions)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        value = fn()
    return value, counter.get_total_flops()


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


def kafka_connection(bootstrap: str | None = None) -> KafkaConnection:
    """The broker a bench talks to (``GEM_KAFKA_BOOTSTRAP``, else the project's own); when nothing
    listens there, exit 2 with the fix before any work, instead of a client's traceback minutes later."""
    import socket

    from pipelines.io.kafka.config import DEFAULT_BOOTSTRAP, KafkaConnection

    server = bootstrap or os.environ.get("GEM_KAFKA_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    host, _, port = server.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        print(
            f"error: this bench needs Kafka, and nothing answers at {server} ({exc.strerror or exc}). "
            "Fix: start the project's broker with `make kafka-up` (or set GEM_KAFKA_BOOTSTRAP to a running one)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return KafkaConnection(bootstrap_servers=(server,))


def metric_samples(port: int, timeout_s: float = 5.0) -> list[Any]:
    """Every sample (``name``, ``labels``, ``value``) a job serves on ``/metrics`` at ``port`` on this host."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
