"""write_world: files, ground truth, redeliveries, bad lines, and byte-for-byte determinism."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.generator import TRUTH_ITEMS, TRUTH_USERS, Request, WorldConfig, truth_dir_for, write_world
from pipelines.generator.output import format_of, with_redeliveries
from pipelines.io.parquet import read_table
from pipelines.schemas.layouts import CANDIDATES, EVENT
from tests.generator.wirecheck import wire_problem

CONFIG = WorldConfig(users=150, days=3, seed=21)


def _write(folder: Path, name: str, config: WorldConfig = CONFIG, **kwargs: Any) -> dict[str, Any]:
    return write_world(Request(config, folder / name, **kwargs))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", ["events.jsonl", "events.jsonl.gz", "events.parquet"])
def test_same_request_same_bytes_other_seed_other_bytes(tmp_path: Path, name: str) -> None:
    options: dict[str, Any] = {"candidates": None, "duplicate_fraction": 0.05}
    if name != "events.parquet":
        options["bad_fraction"] = 0.05
    _write(tmp_path / "a", name, **options)
    _write(tmp_path / "b", name, **options)
    _write(tmp_path / "c", name, WorldConfig(users=150, days=3, seed=22), **options)
    first, second, third = (_files(tmp_path / x) for x in "abc")
    assert first == second
    assert set(first) == {name, "events.truth/users.parquet", "events.truth/items.parquet", "events.truth/world.json"}
    assert first[name] != third[name]


def test_parquet_outputs_carry_their_layouts(tmp_path: Path) -> None:
    summary = _write(tmp_path, "ev.parquet", candidates=tmp_path / "cand.parquet", requests=40)
    events = read_table(str(tmp_path / "ev.parquet"), EVENT)
    assert events.schema.equals(EVENT.schema) and events.num_rows == summary["counts"]["events"]
    assert read_table(str(tmp_path / "cand.parquet"), CANDIDATES).num_rows == 40
    truth = tmp_path / "ev.truth"
    users = read_table(str(truth / "users.parquet"), TRUTH_USERS)
    items = read_table(str(truth / "items.parquet"), TRUTH_ITEMS)
    assert users.schema.equals(TRUTH_USERS.schema) and users.num_rows == CONFIG.users
    assert items.schema.equals(TRUTH_ITEMS.schema) and items.num_rows == CONFIG.num_ads + CONFIG.num_organic
    interest = np.stack(users["interest"].to_numpy(zero_copy_only=False))
    assert interest.shape == (CONFIG.users, CONFIG.categories)
    assert np.allclose(interest.sum(axis=1), 1.0, atol=1e-4)
    world = json.loads((truth / "world.json").read_text())
    assert world["seed"] == 21 and world["counts"]["candidates"]["requests"] == 40
    assert pq.read_metadata(tmp_path / "ev.parquet").num_rows == events.num_rows


def test_jsonl_with_bad_lines_and_redeliveries_adds_up(tmp_path: Path) -> None:
    summary = _write(tmp_path, "ev.jsonl.gz", bad_fraction=0.1, duplicate_fraction=0.04)
    counts = summary["counts"]
    lines = gzip.decompress((tmp_path / "ev.jsonl.gz").read_bytes())[:-1].split(b"\n")
    assert (
        len(lines) == counts["records_written"] == counts["events"] + counts["duplicates"] + counts["bad_lines_total"]
    )
    good = [line for line in lines if wire_problem(line) is None]
    assert len(lines) - len(good) == counts["bad_lines_total"] == sum(counts["bad_lines"].values())
    # a tenth of all lines: bad / (good + bad) = 0.1
    assert counts["bad_lines_total"] == round(0.1 / 0.9 * (counts["events"] + counts["duplicates"]))
    ids = Counter(json.loads(line)["event_id"] for line in good)
    assert len(ids) == counts["events"]
    assert sum(n - 1 for n in ids.values()) == counts["duplicates"] == round(0.04 * counts["events"])
    world = json.loads((tmp_path / "ev.truth" / "world.json").read_text())
    assert world["counts"] == json.loads(json.dumps(counts))


def test_redeliveries_are_identical_records_later_on(small_table_rows: int = 500) -> None:
    from pipelines.generator import generate_events

    events = generate_events(CONFIG).events.slice(0, small_table_rows)
    out, count = with_redeliveries(events, 0.1, np.random.default_rng(0))
    assert count == 50 and out.num_rows == 550
    seen: dict[str, int] = {}
    rows = out.to_pylist()
    for position, row in enumerate(rows):
        first = seen.setdefault(row["event_id"], position)
        if first != position:
            assert rows[first] == row and first < position
    assert len(seen) == 500


def test_truth_folder_and_format_follow_the_name() -> None:
    assert truth_dir_for(Path("/d/x.jsonl.gz")) == Path("/d/x.truth")
    assert truth_dir_for(Path("x.parquet")) == Path("x.truth")
    assert [format_of(Path(n)) for n in ("a.jsonl", "a.jsonl.gz", "a.parquet", "a.csv", ".jsonl")] == [
        "jsonl",
        "jsonl.gz",
        "parquet",
        None,
        None,
    ]
