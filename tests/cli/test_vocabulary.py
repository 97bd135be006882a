"""One flag vocabulary across commands; Beam's own options reach Beam exactly as given."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.cli import COMMANDS, main
from pipelines.cli.flags import add_runner, duration
from pipelines.errors import ConfigError
from pipelines.runners import merge_flags, pipeline_options
from tests.features.factories import T0, line

#: What each command's --help must show of the shared vocabulary.
SHARED = {
    "generate": ["--output", "--overwrite", "--candidates-output", "--seed"],
    "features": [
        "--output",
        "--overwrite",
        "--click-window",
        "DURATION",
        "--max-future",
        "--skip-bad-files",
        "--runner",
    ],
    "replay": ["--output", "--overwrite", "--click-window", "--runner", "--direct_num_workers"],
    "train": ["--features", "--output", "--overwrite", "--device", "{auto,cpu,cuda}", "--holdout", "--seed"],
    "precompute": ["--features", "--model", "--output", "--overwrite", "--device", "{auto,cpu,cuda}", "--runner"],
    "index": ["--output", "--overwrite", "--device", "{auto,cpu,cuda}", "--runner", "--seed"],
    "lookup": ["--device", "{auto,cpu,cuda}", "--max-age", "DURATION"],
    "evaluate-fallback": ["--features", "--model", "--output", "--overwrite", "--device", "--holdout", "--seed"],
    "stream": [
        "--device",
        "{auto,cpu,cuda}",
        "--flush-interval",
        "--candidate-ttl",
        "DURATION",
        "--prism_location",
        "--metrics-port",
    ],
    "produce": ["--num-partitions", "--no-progress"],
    "solaris": ["--candidates-topic", "--model", "--device", "{auto,cpu,cuda}", "--pair-max-age", "DURATION"],
    "inspect": ["PATH"],
    "transfer": ["--features", "--model", "--output", "--overwrite", "--device", "--cadence", "DURATION", "--runner"],
}


def _runner_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_runner(parser)
    return parser.parse_args(list(argv))


def test_every_command_is_checked() -> None:
    assert set(SHARED) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(SHARED))
def test_help_shows_the_shared_vocabulary(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    missing = [flag for flag in SHARED[command] if flag not in text]
    assert not missing, f"{command} --help lacks {missing}"


def test_beam_spelling_reaches_beam_as_given() -> None:
    args = _runner_args("--direct_running_mode", "multi_threading", "--direct_num_workers", "4")
    options = pipeline_options(args).get_all_options()
    assert (options["direct_running_mode"], options["direct_num_workers"]) == ("multi_threading", 4)


def test_kebab_alias_means_the_same_option() -> None:
    args = _runner_args("--direct-running-mode", "multi_processing")
    assert pipeline_options(args).get_all_options()["direct_running_mode"] == "multi_processing"


def test_pass_through_beam_flag_is_not_overridden_by_a_default() -> None:
    options = pipeline_options(_runner_args(), ["--direct_num_workers=3"]).get_all_options()
    assert options["direct_num_workers"] == 3
    assert options["direct_running_mode"] == "in_memory"  # the project's default where none was given


def test_spellings_that_disagree_stop_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["features", "--input", "x.jsonl", "--output", "o", "--direct-running-mode", "in_memory",
              "--direct_running_mode", "multi_threading"])  # fmt: skip
    assert "set the same Beam option" in capsys.readouterr().err


def test_unknown_flag_stops_the_command_instead_of_being_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "e.jsonl"
    src.write_bytes(line(event_id="a", user_id=1, event_time=T0))
    code = main(["features", "--input", str(src), "--output", str(tmp_path / "o"), "--click-window-minutes", "30"])
    assert code == 2
    assert "--click-window-minutes" in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_setting_a_command_needs_must_agree() -> None:
    with pytest.raises(ConfigError, match="--runner"):
        merge_flags(["--runner=DirectRunner"], required={"runner": "PrismRunner"}, defaults={})
    merged = merge_flags(
        ["--environment_type=DOCKER"], required={"streaming": None}, defaults={"environment_type": "LOOPBACK"}
    )
    assert merged == ["--environment_type=DOCKER", "--streaming"]


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("30", 30)])
def test_one_duration_syntax(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-5m", "3w"])
def test_bad_durations_name_the_syntax(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="90s, 15m, 2h"):
        duration(text)


def _workers_of(pid: int) -> set[int]:
    """Pids of Beam SDK worker processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"sdk_worker_main" in cmdline:
            found.add(int(entry.name))
    return found


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_features_runs_on_two_worker_processes_when_asked(tmp_path: Path) -> None:
    lines = [line(event_id=f"e{i}", user_id=i % 53, event_time=T0 + i * 1000, item_id=i % 7) for i in range(4000)]
    src = tmp_path / "e.jsonl"
    src.write_bytes(b"\n".join(lines))
    base = [sys.executable, "-m", "pipelines", "features", "--input", str(src), "--num-shards", "4"]
    flags = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
    job = subprocess.Popen([*base, "--output", str(tmp_path / "multi"), *flags], env={**os.environ},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    seen: set[int] = set()
    while job.poll() is None:
        seen |= _workers_of(job.pid)
        time.sleep(0.05)
    assert job.returncode == 0, job.stderr.read().decode()[-2000:] if job.stderr else ""
    assert len(seen) == 2, f"worker processes seen: {sorted(seen)}"
    assert main(["features", "--input", str(src), "--num-shards", "4", "--output", str(tmp_path / "one")]) == 0
    for rel in sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.parquet")):
        assert pq.read_table(tmp_path / "one" / rel).equals(pq.read_table(tmp_path / "multi" / rel)), rel
