"""Reading a features output folder and splitting its training examples in time.

The folder must be a committed snapshot (:func:`pipelines.io.snapshot.open_snapshot`); the
``histories`` and ``training_examples`` files its commit lists are read as Arrow datasets
(the ``shard`` folder names are not turned into a column).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipelines.durations import DAY_MS
from pipelines.errors import ConfigError, InputNotFoundError, LayoutError
from pipelines.io.snapshot import HISTORIES, TRAINING_EXAMPLES, open_snapshot
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE, Layout, layout_of

_EXAMPLE_COLUMNS = list(TRAINING_EXAMPLE.schema.names)


def _read(folder: str, files: list[str], layout: Layout, columns: list[str] | None = None) -> pa.Table:
    if not files:
        raise InputNotFoundError(f"{folder}: holds no Parquet files")
    dataset = ds.dataset(files, format="parquet")
    found = layout_of(dataset.schema)
    if found is not None and found != (layout.name, layout.version):
        raise LayoutError(f"{folder}: layout {found[0]} v{found[1]}, expected {layout.name} v{layout.version}")
    return dataset.to_table(columns=columns)


def load_features(data_dir: str | Path, flag: str = "--data") -> tuple[pa.Table, pa.Table]:
    """``(histories, training_examples)`` of a committed features snapshot (``flag`` names it in errors)."""
    root = Path(data_dir)
    if root.exists() and not root.is_dir():
        raise ConfigError(flag, f"{root} is not a folder", "pass the --output folder of `pipelines features`")
    snapshot = open_snapshot(str(root), flag=flag, writer="python -m pipelines features")
    try:
        histories = _read(f"{root}/{HISTORIES}", snapshot.files(HISTORIES), HISTORY)
        examples = _read(
            f"{root}/{TRAINING_EXAMPLES}", snapshot.files(TRAINING_EXAMPLES), TRAINING_EXAMPLE, _EXAMPLE_COLUMNS
        )
    finally:
        snapshot.release()
    return histories, examples


@dataclass(frozen=True)
class TimeSplit:
    """Training rows before ``cutoff_ms``; holdout rows at or after it."""

    train: pa.Table
    holdout: pa.Table
    cutoff_ms: int


def split_by_time(examples: pa.Table, holdout_days: float = 1.0) -> TimeSplit:
    """Hold out the last ``holdout_days`` of impressions (by ``event_time``)."""
    if examples.num_rows == 0:
        raise ConfigError("--features", "the folder holds no training examples", "generate a larger world")
    times = examples.column("event_time").cast(pa.int64())
    cutoff = int(pc.max(times).as_py()) - int(holdout_days * DAY_MS)
    is_train = pc.less(times, cutoff)
    split = TimeSplit(examples.filter(is_train), examples.filter(pc.invert(is_train)), cutoff)
    if split.train.num_rows == 0:
        raise ConfigError(
            "--holdout",
            f"every example falls in the last {holdout_days} days",
            "generate more days or pass a shorter --holdout",
        )
    return split


def sample_rows(table: pa.Table, max_rows: int | None, seed: int) -> pa.Table:
    """At most ``max_rows`` rows drawn uniformly without replacement, in their original order."""
    if max_rows is None or table.num_rows <= max_rows:
        return table
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(table.num_rows, size=max_rows, replace=False))
    return table.take(pa.array(keep))


def sample_by_label(
    table: pa.Table, max_rows: int | None, positive_share: float | None, seed: int
) -> tuple[pa.Table, np.ndarray]:
    """At most ``max_rows`` rows, in their original order, and the weight of each (the inverse
    of its group's sampling rate, so weighted means are the table's).

    With ``positive_share``, positives are kept first, up to that share of ``max_rows``
    (converted rows first, up to half of it while clicked-only rows exist, so each group
    keeps rows to stand for it) and negatives fill the rest: rare labels (a conversion
    per ~200-800 impressions) keep every example they have. Without it, or when
    the table is small enough, a uniform sample (weights 1)."""
    if max_rows is None or table.num_rows <= max_rows or positive_share is None:
        sampled = sample_rows(table, max_rows, seed)
        return sampled, np.ones(sampled.num_rows)
    converted = np.asarray(table.column("converted").to_numpy(zero_copy_only=False), bool)
    clicked = np.asarray(table.column("clicked").to_numpy(zero_copy_only=False), bool) & ~converted
    groups = [np.flatnonzero(converted), np.flatnonzero(clicked), np.flatnonzero(~(converted | clicked))]
    budget = round(positive_share * max_rows)
    keep_conv = min(len(groups[0]), budget // 2 if len(groups[1]) else budget)  # leave clicked-only rows room
    keep_click = min(len(groups[1]), budget - keep_conv)
    sizes = [keep_conv, keep_click, min(len(groups[2]), max_rows - keep_conv - keep_click)]
    rng = np.random.default_rng(seed)
    rows, weights = [], []
    for group, size in zip(groups, sizes, strict=True):
        rows.append(rng.choice(group, size=size, replace=False))
        weights.append(np.full(size, len(group) / max(size, 1)))
    all_rows, all_weights = np.concatenate(rows), np.concatenate(weights)
    order = np.argsort(all_rows, kind="stable")
    return table.take(pa.array(all_rows[order])), all_weights[order]
