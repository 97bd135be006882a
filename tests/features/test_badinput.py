"""File-level faults stop a features run with an error naming the file (or, with
--skip-bad-files, are recorded); far-future events, empty inputs and the project's
own outputs under a glob are handled. End to end through the CLI on the local runner."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.cli import main
from pipelines.features import reasons
from pipelines.features.pipeline import ZERO_COUNTS, FeaturesConfig, run_features
from tests.features.factories import T0, line, wire


def _lines(n: int, prefix: str = "g") -> list[bytes]:
    return [line(event_id=f"{prefix}{i}", user_id=i % 5, event_time=T0 + i * 1000) for i in range(n)]


def _truncated_gz(path: Path, n: int = 3000) -> Path:
    data = gzip.compress(b"\n".join(_lines(n)) + b"\n")
    path.write_bytes(data[: len(data) // 2])
    return path


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    notgz = tmp_path / "notgz.jsonl.gz"
    notgz.write_bytes(b"plain text, not gzip\n")
    notpq = tmp_path / "notpq.parquet"
    notpq.write_bytes(b"PAR1 but not parquet")
    listcol = tmp_path / "listcol.parquet"
    rows = [wire(event_id="l1")]
    table = pa.Table.from_pylist(rows).set_column(1, "user_id", pa.array([[1]], pa.list_(pa.int64())))
    pq.write_table(table, listcol)
    return {"truncated": _truncated_gz(tmp_path / "cut.jsonl.gz"), "notgz": notgz, "notpq": notpq, "list": listcol}


@pytest.mark.parametrize("kind", ["truncated", "notgz", "notpq", "list"])
def test_a_bad_file_stops_the_run_naming_it(tmp_path: Path, kind: str, capsys) -> None:
    path = _bad_files(tmp_path)[kind]
    assert main(["features", "--input", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}" in err
    assert "Traceback" not in err
    if kind == "truncated":
        assert "truncated" in err and "past line" in err
    if kind in ("notgz", "notpq", "list"):  # found before any work: no output folder is made
        assert not (tmp_path / "out").exists()


def test_skip_bad_files_records_each_one_and_keeps_the_balance(tmp_path: Path, capsys) -> None:
    bad = _bad_files(tmp_path)
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"\n".join(_lines(50, "ok")) + b"\n")
    out = tmp_path / "out"
    argv = ["features", "--input", *map(str, bad.values()), str(good), "--output", str(out), "--skip-bad-files"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bad_files"] == 4
    assert all(summary[f"bad_files.{p}"] == 1 for p in bad.values())
    dead = pq.read_table(out / "dead_letters").to_pylist()
    unreadable = {d["source"]: d["detail"] for d in dead if d["reason"] == reasons.UNREADABLE_FILE}
    assert set(unreadable) == {str(p) for p in bad.values()}
    assert "truncated" in unreadable[str(bad["truncated"])]
    parts = ("events_valid", "duplicates", "duplicates_previous", "dead_letters")
    assert summary["records_in"] == sum(summary[p] for p in parts)
    assert summary["events_valid"] >= 50  # the good file, plus what the truncated one held before its cut
    assert "4 bad file(s) skipped" in capsys.readouterr().out


def test_empty_input_gives_a_complete_summary(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert main(["features", "--input", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {k: summary[k] for k in ZERO_COUNTS} == ZERO_COUNTS


def test_a_glob_skips_the_projects_own_outputs(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pipelines.io.files")
    data = tmp_path / "data"
    data.mkdir()
    (data / "events.jsonl").write_bytes(b"\n".join(_lines(40)) + b"\n")
    assert main(["features", "--input", str(data / "events.jsonl"), "--output", str(data / "old")]) == 0
    assert main(["features", "--input", f"{data}/**", "--output", str(tmp_path / "new")]) == 0
    summary = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert summary["records_in"] == 40 and summary["dead_letters"] == 0
    assert "skipping" in caplog.text and "this project wrote" in caplog.text


def test_far_future_events_are_dead_letters_against_the_runs_clock(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    future = line(event_id="late", event_time=T0 + 2 * 86_400_000)
    year_9999 = line(event_id="y9999", event_time=253_402_300_000_000)
    path.write_bytes(b"\n".join([*_lines(20), future, year_9999]) + b"\n")
    config = FeaturesConfig(inputs=[str(path)], output=str(tmp_path / "out"), num_shards=2, clock=lambda: T0 / 1000)
    summary = run_features(config, PipelineOptions([]))
    assert summary["dead_letters.future_time"] == 2
    assert summary["max_event_time_ms"] == T0 + 86_400_000
    assert summary["max.event_time_ms"] <= T0 + 86_400_000


def test_uint64_ids_above_int64_are_out_of_range_rows(tmp_path: Path) -> None:
    rows = [wire(event_id=f"u{i}", user_id=i) for i in range(3)]
    table = pa.Table.from_pylist(rows)
    table = table.set_column(1, "user_id", pa.array([2**63 + 5, 1, 2], pa.uint64()))
    pq.write_table(table, tmp_path / "u64.parquet")
    assert main(["features", "--input", str(tmp_path / "u64.parquet"), "--output", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["events_valid"], summary["dead_letters.out_of_range"]) == (2, 1)
