"""Input forms: a Parquet file without a required column fails as a file, a UTF-8
byte-order mark is stripped, and a UTF-16 (or UTF-32) file is refused as a file, not read as lines of
NUL bytes. End to end through the CLI on the local runner."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.io.files import read_line_batches, text_encoding_of
from tests.features.factories import T0, line, wire

N = 200


def _lines() -> list[bytes]:
    return [line(event_id=f"f{i}", user_id=i % 7, event_time=T0 + i * 1000) for i in range(N)]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_a_parquet_file_without_a_required_column_fails_as_a_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "no-user.parquet"
    rows = [wire(event_id=f"p{i}", user_id=i % 7, event_time=T0 + i) for i in range(N)]
    pq.write_table(pa.Table.from_pylist(rows).drop_columns(["user_id"]), path)
    out = tmp_path / "out"
    assert main(["features", "--input", str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: required column(s) user_id absent" in err and "Fix:" in err
    assert "Traceback" not in err and not out.exists()  # one error, not N missing_field dead letters


def test_a_parquet_file_without_an_optional_column_reads_it_as_nulls(tmp_path: Path) -> None:
    path = tmp_path / "no-device.parquet"
    rows = [wire(event_id=f"p{i}", user_id=i % 7, event_time=T0 + i) for i in range(N)]
    pq.write_table(pa.Table.from_pylist(rows).drop_columns(["device"]), path)
    assert main(["features", "--input", str(path), "--output", str(tmp_path / "out")]) == 0
    summary = _summary(tmp_path / "out")
    assert (summary["events_valid"], summary["dead_letters"]) == (N, 0)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_utf8_byte_order_mark_is_stripped(tmp_path: Path, suffix: str) -> None:
    data = b"\xef\xbb\xbf" + b"\n".join(_lines()) + b"\n"
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    [(first, _)] = list(read_line_batches(str(path), N))
    assert first[0] == _lines()[0]
    assert main(["features", "--input", str(path), "--output", str(tmp_path / "out")]) == 0
    summary = _summary(tmp_path / "out")
    assert (summary["events_valid"], summary["dead_letters"]) == (N, 0)


@pytest.mark.parametrize(
    ("encoding", "named"),
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
def test_a_utf16_or_utf32_file_is_refused_as_a_file(tmp_path: Path, capsys, encoding: str, named: str) -> None:
    path = tmp_path / "wide.jsonl"
    path.write_bytes((b"\n".join(_lines()) + b"\n").decode().encode(encoding))
    out = tmp_path / "out"
    assert main(["features", "--input", str(path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: the text is {named}" in err and "Fix:" in err and "iconv" in err
    assert "Traceback" not in err and not out.exists()


def test_skip_bad_files_records_a_utf16_file_as_one_bad_file(tmp_path: Path) -> None:
    wide, good = tmp_path / "wide.jsonl.gz", tmp_path / "good.jsonl"
    wide.write_bytes(gzip.compress((b"\n".join(_lines()) + b"\n").decode().encode("utf-16")))
    good.write_bytes(b"\n".join(_lines()) + b"\n")
    out = tmp_path / "out"
    assert main(["features", "--input", str(wide), str(good), "--output", str(out), "--skip-bad-files"]) == 0
    summary = _summary(out)
    assert summary["bad_files"] == 1 and summary["events_valid"] == N
    assert "dead_letters.nul_byte" not in summary


def test_one_stray_nul_byte_is_a_line_fault_not_an_encoding() -> None:
    assert text_encoding_of(b'{"event_id":"a\x00b","user_id":1}\n{"event_id":"c"}') is None
    assert text_encoding_of(b"\xef\xbb\xbf{}") is None
    assert text_encoding_of('{"a": 1}'.encode("utf-16-le")) == "UTF-16"
