"""Pure summaries of Parquet outputs (no printing): used by the CLI and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.errors import InputNotFoundError
from pipelines.io.commit import COMMITTED
from pipelines.io.snapshot import open_snapshot
from pipelines.io.summary import SUMMARY
from pipelines.schemas.embeddings import decode_embeddings
from pipelines.schemas.enums import EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import layout_of

KINDS = ("histories", "training_examples", "dead_letters", "representations")
PERCENTILES = (50, 90, 99, 100)


@dataclass(frozen=True)
class Dataset:
    """One Parquet dataset found under a path: its name, layout and table."""

    name: str
    layout: tuple[str, int] | None
    files: list[str]
    table: pa.Table


def find_datasets(path: str) -> list[Dataset]:
    """Every Parquet dataset at ``path``: a file, a committed snapshot (or one kind's folder of it),
    a streaming job's output, or a folder of parts that is not a snapshot.

    A snapshot (a folder with ``summary.json``, ``_COMMITTED`` or a kind's sub-folder) is read
    through :func:`~pipelines.io.snapshot.open_snapshot`: refused when uncommitted or damaged,
    and only its committed files are read.
    """
    root = Path(path)
    if root.is_file():
        return [_load(root.name, [str(root)])]
    groups = _groups(root, path)
    found = [_load(name, files) for name, files in groups if files]
    if not found:
        raise InputNotFoundError(f"{path!r} holds no Parquet files")
    return found


def is_streaming_output(root: Path) -> bool:
    """A streaming job's output: flush files instead of a committed snapshot (see pipelines.streaming.state)."""
    return not (root / COMMITTED).exists() and any(root.glob("histories/shard=*/f*-*.parquet"))


def _groups(root: Path, path: str) -> list[tuple[str, list[str]]]:
    parent = root.parent
    if (parent / COMMITTED).is_file() and not (root / COMMITTED).exists():  # one kind of a snapshot
        snapshot = open_snapshot(str(parent), flag="PATH", writer="the command that wrote it")
        return [(root.name, snapshot.files(root.name))]
    looks_like_snapshot = (root / SUMMARY).exists() or any((root / k).is_dir() for k in KINDS)
    if not root.exists() or (looks_like_snapshot and not is_streaming_output(root)):
        snapshot = open_snapshot(path, flag="PATH", writer="the command that wrote it")
        return [(k, snapshot.files(k)) for k in KINDS if snapshot.files(k)] or [
            (
                root.name,
                [f for f in map(snapshot.path, (e.path for e in snapshot.manifest.files)) if f.endswith(".parquet")],
            )
        ]
    subdirs = [root / k for k in KINDS if (root / k).is_dir()]
    return [(d.name, sorted(map(str, d.rglob("*.parquet")))) for d in subdirs] or [
        (root.name, sorted(map(str, root.rglob("*.parquet"))))
    ]


def _load(name: str, files: list[str]) -> Dataset:
    table = ds.dataset(files, format="parquet").to_table()
    first = ds.dataset(files[:1], format="parquet").schema
    return Dataset(name, layout_of(first), files, table)


def percentiles(values: np.ndarray) -> dict[int, float]:
    if values.size == 0:
        return {p: 0.0 for p in PERCENTILES}
    return {p: float(np.percentile(values, p)) for p in PERCENTILES}


def text_histogram(values: np.ndarray, bins: int = 12, width: int = 40) -> list[str]:
    """Log-spaced histogram lines (``lo-hi | #### count``) for heavy-tailed counts."""
    if values.size == 0:
        return ["(empty)"]
    top = max(int(values.max()), 1)
    edges = np.unique(np.logspace(0, np.log10(top + 1), bins + 1).astype(np.int64))
    counts, _ = np.histogram(values, bins=np.r_[0, edges[1:]])
    peak = max(int(counts.max()), 1)
    lows, highs = np.r_[0, edges[1:-1]], edges[1:] - 1
    highs[-1] += 1  # numpy's last bin is closed
    return [
        f"{lo:>7}-{hi:<7} | {'#' * round(width * n / peak):<{width}} {n}"
        for lo, hi, n in zip(lows, highs, counts, strict=True)
    ]


def history_lengths(table: pa.Table) -> np.ndarray:
    return pc.list_value_length(table.column("events")).to_numpy(zero_copy_only=False)


def enum_mix(codes: pa.ChunkedArray | pa.Array, names: tuple[str, ...]) -> list[tuple[str, int, float]]:
    """(name, count, share) per enum value present, most common first."""
    counts = pl.Series(codes.to_numpy(zero_copy_only=False)).value_counts(sort=True)
    total = max(int(counts["count"].sum()), 1)
    return [
        (names[int(c)] if 0 <= int(c) < len(names) else str(c), int(n), int(n) / total) for c, n in counts.iter_rows()
    ]


def history_event_mix(table: pa.Table) -> dict[str, list[tuple[str, int, float]]]:
    flat = pc.list_flatten(table.column("events"))
    return {
        "surface": enum_mix(pc.struct_field(flat, "surface"), SURFACES),
        "event_type": enum_mix(pc.struct_field(flat, "event_type"), EVENT_TYPES),
    }


def reason_counts(table: pa.Table) -> list[tuple[str, int]]:
    frame = pl.from_arrow(table.select(["reason"]))
    assert isinstance(frame, pl.DataFrame)
    return [(r, n) for r, n in frame["reason"].value_counts(sort=True).iter_rows()]


def user_timeline(table: pa.Table, user_id: int) -> list[str]:
    """One line per retained event of ``user_id``, oldest first, plus the summary."""
    rows = table.filter(pc.equal(table.column("user_id"), user_id)).to_pylist()
    if not rows:
        return [f"user {user_id}: no history"]
    row = rows[0]
    summary = row["summary"]
    lines = [
        f"user {user_id}: {len(row['events'])} retained of {row['num_events_total']} events, "
        f"{summary['evicted_count']} evicted, watermark {row['watermark']}"
    ]
    for e in row["events"]:
        kind = "ad" if e["is_ad"] else "organic"
        lines.append(
            f"  {e['event_time']}  {SURFACES[e['surface']]:<22} {EVENT_TYPES[e['event_type']]:<19} "
            f"item={e['item_id']} ({kind}, cat {e['item_category']}) value={e['value']}"
        )
    return lines


def embedding_vectors(table: pa.Table) -> np.ndarray:
    """``(N, D) float32`` embeddings of a REPRESENTATION table (int8 codes times their scale)."""
    emb = table.column("embedding")
    if not pa.types.is_fixed_size_list(emb.type):
        return np.zeros((0, 0), np.float32)
    if not table.num_rows:
        return np.zeros((0, emb.type.list_size), np.float32)
    scale = table.column("embedding_scale") if "embedding_scale" in table.column_names else pa.nulls(table.num_rows)
    return decode_embeddings(emb, scale)


def pca_2d(vectors: np.ndarray, max_rows: int = 5_000) -> tuple[np.ndarray, np.ndarray]:
    """``(M, 2)`` coordinates of ``vectors`` (N, D) on their first two principal components, and
    the share of variance each explains. At most ``max_rows`` rows, evenly spaced (deterministic)."""
    if len(vectors) > max_rows:
        vectors = vectors[np.linspace(0, len(vectors) - 1, max_rows).astype(np.int64)]
    coords = np.zeros((len(vectors), 2), np.float64)
    if len(vectors) < 2 or vectors.shape[1] == 0:
        return coords, np.zeros(2)
    centred = vectors.astype(np.float64) - vectors.mean(axis=0)
    _, singular, components = np.linalg.svd(centred, full_matrices=False)
    k = min(2, components.shape[0])
    coords[:, :k] = centred @ components[:k].T
    variance = singular**2
    explained = np.zeros(2)
    explained[:k] = variance[:k] / max(float(variance.sum()), 1e-30)
    return coords, explained


def event_timeline(times_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """Events per day (per hour when they span at most two days): bin starts (ms), counts, unit."""
    if times_ms.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), "day"
    lo, hi = int(times_ms.min()), int(times_ms.max())
    unit, width = ("hour", 3_600_000) if hi - lo <= 2 * 86_400_000 else ("day", 86_400_000)
    first = lo // width
    counts = np.bincount((times_ms.astype(np.int64) // width - first).astype(np.int64))
    return (first + np.arange(len(counts), dtype=np.int64)) * width, counts, unit


def history_event_times(table: pa.Table) -> np.ndarray:
    """Every retained event's time (ms since the epoch) of a HISTORY table."""
    times = pc.struct_field(pc.list_flatten(table.column("events")), "event_time")
    return np.asarray(times.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def representation_stats(table: pa.Table) -> dict[str, object]:
    """Pair vs user-level counts, model versions, embedding dim and norms, score means."""
    is_user = table.column("ad_id").is_null()
    vectors = embedding_vectors(table)
    norms = np.linalg.norm(vectors, axis=1) if vectors.size else np.zeros(0)
    return {
        "pairs": int(table.num_rows - pc.sum(is_user).as_py()) if table.num_rows else 0,
        "users": int(pc.sum(is_user).as_py() or 0),
        "model_versions": sorted(set(table.column("model_version").to_pylist())),
        "dim": int(vectors.shape[1]),
        "embedding_norm_p50": float(np.median(norms)) if norms.size else 0.0,
        "p_click_mean": float(pc.mean(table.column("p_click")).as_py() or 0.0),
        "p_conversion_mean": float(pc.mean(table.column("p_conversion")).as_py() or 0.0),
    }


def example_label_rates(table: pa.Table) -> dict[str, float]:
    n = max(table.num_rows, 1)
    return {
        "clicked": pc.sum(table.column("clicked")).as_py() / n if table.num_rows else 0.0,
        "converted": pc.sum(table.column("converted")).as_py() / n if table.num_rows else 0.0,
    }
