"""Killing a writer: run ``python -m pipelines ...`` as a subprocess and ``kill -9`` it at a seeded point.

The point is drawn after the run's staging folder appears (the writer holds the lock and is
writing): a seeded delay in ``[0, span)``. A run that finishes first is a valid outcome too
(``finished``); the test then checks the committed snapshot instead of the refusal.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, str]] = []


def record(case: str, outcome: str) -> None:
    """One row of the results table printed at the end of the session (see conftest)."""
    RESULTS.append((case, outcome))


def short(message: str, width: int = 150) -> str:
    """``message`` without temporary folder prefixes, cut to ``width`` characters (for the table)."""
    text = re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/' ]+/", "", message)
    return text if len(text) <= width else text[: width - 3] + "..."


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pipelines ARGS`` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@dataclass(frozen=True)
class Killed:
    """How a killed run ended: ``killed`` (SIGKILL landed after ``delay_s`` in staging) or ``finished``."""

    outcome: str
    delay_s: float
    returncode: int
    stderr: str


def staging_of(output: Path) -> list[Path]:
    return sorted(output.parent.glob(f"{output.name}.staging-*"))


def kill_mid_run(args: list[str], output: Path, *, seed: int, span_s: float) -> Killed:
    """Start ``python -m pipelines ARGS`` (its own session), wait for ``OUTPUT.staging-*``, sleep a
    seeded ``uniform(0, span_s)``, then SIGKILL the whole session (its Beam workers too)."""
    delay = random.Random(f"kill-{seed}").uniform(0.0, span_s)  # a str seed spreads near seeds apart
    log = output.parent / f"{output.name}.kill-{seed}.log"
    with log.open("w") as err:
        job = subprocess.Popen(
            [sys.executable, "-m", "pipelines", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while not staging_of(output) and job.poll() is None:
            assert time.monotonic() < deadline, "the run never started writing"
            time.sleep(0.01)
        if job.poll() is None:
            time.sleep(delay)
        finished = job.poll() is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        code = job.wait(timeout=60)
    stderr = log.read_text()
    log.unlink()
    if finished:
        assert code == 0, f"the run failed on its own before the kill:\n{stderr[-3000:]}"
    return Killed("finished" if finished else "killed", delay, code, stderr)
