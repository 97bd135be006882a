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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, str]] = []


def record(case: str, outcome: str) -> None:
    """One row of the results table printed at the end of the session (see conftest)."""
    RESULTS.append((case, outcome))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a command in-process: it must exit 2 with a message that names the fix, never a traceback."""
    from pipelines.cli import main

    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "Fix:" in err and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


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


@contextlib.contextmanager
def paused_at(point: str, args: list[str], folder: Path) -> Iterator[subprocess.Popen[str]]:
    """Run ``python -m pipelines ARGS`` until it reaches the pause point ``point``
    (:mod:`pipelines.io.pause`); yield it stopped there, then let it go on and wait for its end. Its
    stderr goes to ``folder/stderr.log``; its exit is the caller's to check."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GEM_PAUSE_AT": point, "GEM_PAUSE_DIR": str(folder)}
    with (folder / "stderr.log").open("w") as err:
        job = subprocess.Popen(
            [sys.executable, "-m", "pipelines", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not (folder / f"{point}.reached").exists():
            if job.poll() is not None:
                log = (folder / "stderr.log").read_text()[-3000:]
                raise AssertionError(f"ended ({job.returncode}) before {point}:\n{log}")
            assert time.monotonic() < deadline, f"never reached {point}"
            time.sleep(0.01)
        yield job
    finally:
        (folder / f"{point}.go").touch()
        if job.poll() is None:
            try:
                job.wait(timeout=600)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                raise
