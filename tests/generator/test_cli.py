"""``python -m pipelines generate``: end to end, and flags checked before any work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import build_parser, main
from pipelines.cli.generate import build_request
from pipelines.errors import ConfigError
from pipelines.io.parquet import read_table
from pipelines.schemas.layouts import CANDIDATES, EVENT

ROOT = Path(__file__).resolve().parents[2]


def test_generate_end_to_end(tmp_path: Path) -> None:
    out, cand = tmp_path / "w" / "events.parquet", tmp_path / "w" / "cand.parquet"
    command = [
        sys.executable,
        "-m",
        "pipelines",
        "generate",
        "--users",
        "120",
        "--days",
        "2",
        "--seed",
        "5",
        "--output",
        str(out),
        "--candidates-output",
        str(cand),
        "--requests",
        "30",
        "--duplicate-fraction",
        "0.01",
        "--start",
        "2025-01-01",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()
    assert len(summary) == 1 and "events" in summary[0] and str(out) in summary[0]
    events = read_table(str(out), EVENT)
    world = json.loads((tmp_path / "w" / "events.truth" / "world.json").read_text())
    assert events.num_rows == world["counts"]["events"] + world["counts"]["duplicates"]
    assert f"{events.num_rows:,} records" in summary[0]
    assert world["parameters"]["start"].startswith("2025-01-01")
    assert read_table(str(cand), CANDIDATES).num_rows == 30


def test_help_describes_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--users",
        "--days",
        "--seed",
        "--output",
        "--overwrite",
        "--candidates-output",
        "--requests",
        "--bad-fraction",
        "--duplicate-fraction",
        "--niche-affinity",
        "--niche-exposure",
        "--start",
    ):
        assert flag in text
    assert "events per user" in text


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--output", "x.csv"], "--output"),
        (["--output", "x.jsonl", "--users", "0"], "--users"),
        (["--output", "x.jsonl", "--days", "-3"], "--days"),
        (["--output", "x.jsonl", "--seed", "-1"], "--seed"),
        (["--output", "x.parquet", "--bad-fraction", "0.1"], "--bad-fraction"),
        (["--output", "x.jsonl", "--bad-fraction", "0.9"], "--bad-fraction"),
        (["--output", "x.jsonl", "--duplicate-fraction", "1.5"], "--duplicate-fraction"),
        (["--output", "x.jsonl", "--start", "yesterday"], "--start"),
        (["--output", "x.jsonl", "--candidates-output", "c.csv"], "--candidates-output"),
        (["--output", "x.jsonl", "--requests", "10"], "--requests"),
        (["--output", "x.jsonl", "--users", "5000000", "--days", "366"], "--users"),
        (["--output", "x.jsonl", "--niche-affinity", "0.5"], "--niche-affinity"),
        (["--output", "x.jsonl", "--niche-affinity", "16", "--niche-exposure", "0.9"], "--niche-exposure"),
        (["--output", "x.jsonl", "--niche-exposure", "0.1"], "--niche-exposure"),
    ],
)
def test_bad_flags_fail_with_exit_code_2_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], named: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["generate", *flags]) == 2
    err = capsys.readouterr().err
    assert f"error: {named}:" in err and "Fix:" in err
    assert list(tmp_path.iterdir()) == []


def test_config_error_names_the_flag() -> None:
    argv = ["generate", "--output", "x.txt"]
    args, _extra = build_parser(argv).parse_known_args(argv)
    with pytest.raises(ConfigError) as info:
        build_request(args)
    assert info.value.flag == "--output"


def test_unwritable_output_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["generate", "--output", str(blocker / "sub" / "x.jsonl"), "--users", "5"]) == 2
    assert "not a writable folder" in capsys.readouterr().err
