from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main
from pipelines.inspect.report import percentiles, text_histogram
from tests.features.factories import T0, line


@pytest.fixture(scope="module")
def features_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect")
    lines = [
        line(event_id=f"e{i}", user_id=i % 4, event_time=T0 + i, surface="threads" if i % 2 else "messenger")
        for i in range(40)
    ] + [b"{oops", b"[]"]
    (root / "e.jsonl").write_bytes(b"\n".join(lines))
    assert main(["features", "--input", str(root / "e.jsonl"), "--output", str(root / "out")]) == 0
    return root / "out"


def test_inspect_features_output(features_out: Path, capsys, tmp_path: Path) -> None:
    assert main(["inspect", str(features_out), "--user", "1", "--plot", str(tmp_path / "d.png")]) == 0
    out = capsys.readouterr().out
    assert "histories: 4 rows" in out and "history v1" in out
    assert "per user p50=10" in out
    assert "messenger 50.0%" in out and "threads 50.0%" in out
    assert "invalid_json" in out and "not_an_object" in out
    assert "user 1: 10 retained of 10 events" in out
    assert (tmp_path / "d.png").stat().st_size > 1000


def test_inspect_single_file(features_out: Path, capsys) -> None:
    assert main(["inspect", str(features_out / "dead_letters" / "part-00000.parquet")]) == 0
    assert "dead_letter v1" in capsys.readouterr().out


def test_missing_path_is_a_clear_error(capsys) -> None:
    assert main(["inspect", "/nonexistent/out"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_histogram_and_percentiles() -> None:
    values = np.array([1, 2, 3, 100, 20_000])
    assert percentiles(values)[100] == 20_000
    lines = text_histogram(values)
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == 5
