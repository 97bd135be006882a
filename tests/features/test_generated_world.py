"""Closed loop: what the generator injected is exactly what the features pipeline reports."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.cli import main


def test_injected_bad_lines_and_redeliveries_are_all_accounted(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl.gz"
    assert (
        main(
            [
                "generate",
                "--users",
                "400",
                "--days",
                "4",
                "--seed",
                "9",
                "--output",
                str(events),
                "--bad-fraction",
                "0.02",
                "--duplicate-fraction",
                "0.01",
            ]
        )
        == 0
    )
    assert main(["features", "--input", str(events), "--output", str(tmp_path / "out")]) == 0
    world = json.loads((tmp_path / "events.truth" / "world.json").read_text())["counts"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert world["bad_lines_total"] > 50
    assert summary["dead_letters"] == world["bad_lines_total"]
    assert summary["duplicates"] == world["duplicates"]
    assert summary["events_valid"] == world["events"]
    assert summary["records_in"] == world["records_written"]
