"""The features pipeline end to end on the local runner (the mode we ship)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.features import reasons
from pipelines.features.parse import MAX_LINE_BYTES
from pipelines.schemas.layouts import EVENT, layout_of
from tests.features.factories import T0, line, wire

BAD_LINES: list[tuple[bytes, str]] = [
    (b'{"event_id": "t1", "user_id": 4', reasons.INVALID_JSON),
    (b"42", reasons.NOT_AN_OBJECT),
    (json.dumps({k: v for k, v in wire(event_id="m1").items() if k != "surface"}).encode(), reasons.MISSING_FIELD),
    (line(event_id="w1", item_id="7"), reasons.WRONG_TYPE),
    (line(event_id="n1", user_id=-2), reasons.OUT_OF_RANGE),
    (line(event_id="u1", surface="REELS"), reasons.UNKNOWN_ENUM),
    (line(event_id="u2", event_type="Click"), reasons.UNKNOWN_ENUM),
    (line(event_id="f1", event_time=1.5e12), reasons.BAD_TIMESTAMP),
    (line(event_id="z1", event_time="2026-01-01T00:00:00"), reasons.BAD_TIMESTAMP),
    (line(event_id="z2", event_time=-1), reasons.BAD_TIMESTAMP),
    (line(event_id="x1")[:-1] + b', "value": NaN}', reasons.NON_FINITE),
    (line(event_id="x2")[:-1] + b', "value": -Infinity}', reasons.NON_FINITE),
    (b'{"event_id": "' + b"a" * MAX_LINE_BYTES + b'"}', reasons.LINE_TOO_LONG),
    (b'{"event_id": "bad\xc3\x28"}', reasons.INVALID_UTF8),
    (b'{"event_id":\x00 "nul"}', reasons.NUL_BYTE),
    (line(event_id="ad1", advertiser_id=None), reasons.AD_WITHOUT_ADVERTISER),
]


def _good_lines(n: int, users: int = 7) -> list[bytes]:
    types = ["impression", "click", "like", "conversion"]
    return [
        line(event_id=f"g{i}", user_id=i % users, item_id=i % 5, event_type=types[i % 4], event_time=T0 + i * 60_000)
        for i in range(n)
    ]


def _write_jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _features(*argv: str) -> int:
    return main(["features", *argv])


def _histories(out: Path) -> pa.Table:
    return ds.dataset(out / "histories", format="parquet", partitioning="hive").to_table().sort_by("user_id")


def test_bad_input_is_dead_lettered_and_every_good_line_kept(tmp_path: Path, capsys) -> None:
    good = _good_lines(300)
    mixed = []
    for i, g in enumerate(good):
        mixed.append(g)
        if i < len(BAD_LINES):
            mixed.append(BAD_LINES[i][0])
    mixed += [good[3], good[10]]  # redeliveries
    src = _write_jsonl(tmp_path / "events.jsonl", mixed)
    assert _features("--input", str(src), "--output", str(tmp_path / "out")) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["records_in"] == len(mixed)
    assert summary["events_valid"] == 300 and summary["duplicates"] == 2
    assert summary["dead_letters"] == len(BAD_LINES)
    dead = pq.read_table(tmp_path / "out" / "dead_letters" / "part-00000.parquet")
    got = {(r["source"], r["reason"]) for r in dead.select(["source", "reason"]).to_pylist()}
    lines_of_bad = [i + 1 for i, m in enumerate(mixed) if m in {b for b, _ in BAD_LINES}]
    expected = {(f"{src}:{n}", reason) for n, (_, reason) in zip(lines_of_bad, BAD_LINES, strict=True)}
    assert got == expected
    assert sum(len(e) for e in _histories(tmp_path / "out").column("events").to_pylist()) == 300
    assert "16 rejected" in capsys.readouterr().out


def test_incremental_run_equals_full_rebuild(tmp_path: Path) -> None:
    good = _good_lines(400)
    first = _write_jsonl(tmp_path / "a.jsonl", good[:250])
    second = _write_jsonl(tmp_path / "b.jsonl", good[250:] + good[240:250])
    both = _write_jsonl(tmp_path / "all.jsonl", good)
    common = ["--max-history", "20", "--num-shards", "4"]
    assert _features("--input", str(first), "--output", str(tmp_path / "s1"), *common) == 0
    assert (
        _features("--input", str(second), "--previous", str(tmp_path / "s1"), "--output", str(tmp_path / "s2"), *common)
        == 0
    )
    assert _features("--input", str(both), "--output", str(tmp_path / "full"), *common) == 0
    assert _histories(tmp_path / "s2").equals(_histories(tmp_path / "full"))
    summary = json.loads((tmp_path / "s2" / "summary.json").read_text())
    assert summary["duplicates_previous"] == 10


def test_parquet_input_and_layout_metadata(tmp_path: Path) -> None:
    rows = [json.loads(g) for g in _good_lines(50)]
    from pipelines.features.parse import parse_json_lines

    table = parse_json_lines(_good_lines(50), [""] * 50).events
    pq.write_table(table, tmp_path / "events.parquet", row_group_size=20)
    assert _features("--input", str(tmp_path / "*.parquet"), "--output", str(tmp_path / "out")) == 0
    hist_file = next((tmp_path / "out" / "histories").glob("*/*.parquet"))
    assert layout_of(pq.read_schema(hist_file)) == ("history", 1)
    assert sum(len(e) for e in _histories(tmp_path / "out").column("events").to_pylist()) == len(rows)
    assert table.schema == EVENT.schema


def test_same_input_gives_identical_output(tmp_path: Path) -> None:
    src = _write_jsonl(tmp_path / "e.jsonl", _good_lines(200))
    for name in ("r1", "r2"):
        assert _features("--input", str(src), "--output", str(tmp_path / name), "--num-shards", "3") == 0
    for kind in ("histories", "training_examples"):
        for f in sorted((tmp_path / "r1" / kind).glob("*/*.parquet")):
            twin = tmp_path / "r2" / f.relative_to(tmp_path / "r1")
            assert pq.read_table(f).equals(pq.read_table(twin))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--input", "/nonexistent/*.jsonl", "--output", "{tmp}/o"], "matches no file"),
        (["--input", "{src}", "--output", "/proc/forbidden/out"], "not writable"),
        (["--input", "{src}", "--output", "{tmp}/o", "--max-history", "0"], "--max-history"),
        (["--input", "{src}", "--output", "{tmp}/o", "--previous", "{tmp}/nothing"], "--previous"),
        (["--input", "{tmp}/x.csv", "--output", "{tmp}/o"], "unsupported file type"),
    ],
)
def test_bad_flags_fail_before_any_work(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    src = _write_jsonl(tmp_path / "e.jsonl", _good_lines(5))
    (tmp_path / "x.csv").write_text("a,b\n")
    argv = [a.format(tmp=tmp_path, src=src) for a in argv]
    assert _features(*argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_existing_snapshot_needs_overwrite(tmp_path: Path, capsys) -> None:
    src = _write_jsonl(tmp_path / "e.jsonl", _good_lines(5))
    assert _features("--input", str(src), "--output", str(tmp_path / "o")) == 0
    assert _features("--input", str(src), "--output", str(tmp_path / "o")) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _features("--input", str(src), "--output", str(tmp_path / "o"), "--overwrite") == 0


def test_events_cross_the_shuffle_as_scratch_files_that_the_commit_never_holds(tmp_path: Path) -> None:
    from pipelines.features.pipeline import WRITER
    from pipelines.features.transforms import SCRATCH
    from pipelines.io.snapshot import open_snapshot

    src = _write_jsonl(tmp_path / "e.jsonl", _good_lines(200))
    assert _features("--input", str(src), "--output", str(tmp_path / "o"), "--num-shards", "3") == 0
    assert not (tmp_path / "o" / SCRATCH).exists()
    snapshot = open_snapshot(str(tmp_path / "o"), flag="--input", writer=WRITER)
    try:
        assert snapshot.files("histories") and not snapshot.files(SCRATCH, ".arrow")
    finally:
        snapshot.release()
    assert sum(len(e) for e in _histories(tmp_path / "o").column("events").to_pylist()) == 200


@pytest.mark.integration
def test_large_elements_lose_nothing_at_group_by_key(tmp_path: Path) -> None:
    """Lab note: multi_threading lost events at GroupByKey with large elements; the shipped mode must not."""
    lines = [line(event_id=f"big{i}", user_id=i % 3000, event_time=T0 + i, item_id=i) for i in range(60_000)]
    src = _write_jsonl(tmp_path / "big.jsonl", lines)
    assert _features("--input", str(src), "--output", str(tmp_path / "o"), "--num-shards", "8") == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["records_in"] == summary["events_valid"] == 60_000
    assert sum(len(e) for e in _histories(tmp_path / "o").column("events").to_pylist()) == 60_000


def test_gzipped_jsonl_input(tmp_path: Path) -> None:
    import gzip

    lines = [*_good_lines(120), b"{nope"]
    src = tmp_path / "e.jsonl.gz"
    src.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    assert _features("--input", str(src), "--output", str(tmp_path / "o")) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert (summary["events_valid"], summary["dead_letters"]) == (120, 1)
    dead = pq.read_table(tmp_path / "o" / "dead_letters" / "part-00000.parquet")
    assert dead.column("source").to_pylist() == [f"{src}:121"]


def test_a_failed_shard_write_fails_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes overlap the next shard's build; a write error must surface at finish_bundle, not vanish."""
    from pipelines.features import transforms
    from tests.features.factories import event, events_table

    def broken_write(*args: object, **kwargs: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr(transforms, "write_table", broken_write)
    fn = transforms._BuildShardFn(str(tmp_path), max_history=16, windows=transforms.LabelWindows())
    fn.setup()
    counts = list(fn.process((0, [events_table([event("e1", 1, T0)])]), {}))
    assert counts[0]["histories"] == 1
    with pytest.raises(OSError, match="disk full"):
        fn.finish_bundle()
    fn.teardown()
