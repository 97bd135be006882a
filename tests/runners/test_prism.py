"""The features pipeline on Beam's Prism runner (built locally by `make prism`) equals the local runner."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.runners import default_prism
from tests.features.factories import T0, line


@pytest.mark.integration
def test_prism_output_equals_local(tmp_path: Path) -> None:
    assert default_prism(), "no Prism binary: run `make prism`"
    lines = [
        line(
            event_id=f"e{i}",
            user_id=i % 37,
            event_time=T0 + i * 1000,
            item_id=i % 11,
            event_type="click" if i % 5 == 0 else "impression",
        )
        for i in range(3000)
    ] + [b"{bad"]
    src = tmp_path / "e.jsonl"
    src.write_bytes(b"\n".join(lines))
    base = ["features", "--input", str(src), "--num-shards", "4"]
    assert main([*base, "--output", str(tmp_path / "local")]) == 0
    assert (
        main([*base, "--output", str(tmp_path / "prism"), "--runner", "PrismRunner", "--environment_type=LOOPBACK"])
        == 0
    )
    files = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("*.parquet"))
    assert len(files) == 9
    for rel in files:
        assert pq.read_table(tmp_path / "local" / rel).equals(pq.read_table(tmp_path / "prism" / rel)), rel
