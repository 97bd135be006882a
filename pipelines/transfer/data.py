"""The transfer experiment's examples: a vertical (one surface, one objective), split in time.

The GEM model's own split holds out the last ``holdout_days`` of impressions (the same
cutoff, computed on every example, so the downstream holdout is never in the GEM model's
training days). Before it, the last ``validation_days`` are the validation split (the
distillation temperature and weight are chosen there, and the freshness adapter learns
there, on the newest labels); the days before are the downstream training split. Each
split is sampled with every positive first and rows weighted by their sampling rate
(:func:`pipelines.model.train.data.sample_by_label`), as the GEM model's training is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.durations import DAY_MS
from pipelines.errors import ConfigError
from pipelines.model.inputs import ExampleSet, HistoryIndex
from pipelines.model.train.data import sample_by_label, split_by_time

__all__ = ["OBJECTIVES", "Split", "Splits", "VerticalSpec", "prepare_splits"]

#: objective name -> the training-example label column
OBJECTIVES = {"click": "clicked", "conversion": "converted"}


@dataclass(frozen=True)
class VerticalSpec:
    """Which examples and how many: ``surface`` code (None = every surface), ``objective``."""

    surface: int | None = None
    objective: str = "click"
    holdout_days: float = 1.0
    validation_days: float = 1.0
    max_train: int = 16_000
    max_validation: int = 4_000
    max_holdout: int = 8_000
    positive_share: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError("--objective", f"got {self.objective!r}", f"pass one of {sorted(OBJECTIVES)}")
        if min(self.max_train, self.max_validation, self.max_holdout) < 1:
            raise ConfigError("--max-train", "sample sizes must be positive", "pass positive sizes")

    @property
    def task(self) -> str:
        return OBJECTIVES[self.objective]


@dataclass(frozen=True)
class Split:
    """One split: its sampled rows (TRAINING_EXAMPLE), their weights, and the model-ready example set."""

    rows: pa.Table
    weights: np.ndarray
    examples: ExampleSet

    def event_ids(self) -> list[str]:
        return [str(x) for x in self.rows.column("event_id").to_pylist()]

    def digest(self) -> str:
        """A short hash of the rows' event ids, labels and weights: equal digests, identical examples."""
        h = hashlib.sha256()
        h.update("\n".join(self.event_ids()).encode())
        for name in ("clicked", "converted"):
            h.update(np.asarray(self.examples.fields[name], np.float32).tobytes())
        h.update(np.asarray(self.weights, np.float64).tobytes())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class Splits:
    train: Split
    validation: Split
    holdout: Split
    holdout_cutoff_ms: int
    validation_cutoff_ms: int

    def summary(self, task: str) -> dict[str, object]:
        return {
            name: {
                "rows": split.rows.num_rows,
                "positives": int(split.examples.fields[task].sum()),
                "digest": split.digest(),
            }
            for name, split in (("train", self.train), ("validation", self.validation), ("holdout", self.holdout))
        } | {"holdout_cutoff_ms": self.holdout_cutoff_ms, "validation_cutoff_ms": self.validation_cutoff_ms}


def _split(index: HistoryIndex, table: pa.Table, spec: VerticalSpec, cap: int, salt: int, name: str) -> Split:
    if table.num_rows == 0:
        raise ConfigError("--surface", f"the vertical has no {name} examples", "pick another surface or a larger world")
    rows, weights = sample_by_label(table, cap, spec.positive_share, spec.seed * 7 + salt)
    return Split(rows, weights, ExampleSet(index, rows))


def prepare_splits(index: HistoryIndex, examples: pa.Table, spec: VerticalSpec) -> Splits:
    """Train / validation / holdout of the vertical ``spec`` (see the module docstring)."""
    time_split = split_by_time(examples, spec.holdout_days)  # the GEM model's cutoff, on every example
    train, holdout = time_split.train, time_split.holdout
    if spec.surface is not None:
        train = train.filter(pc.equal(train.column("surface"), spec.surface))
        holdout = holdout.filter(pc.equal(holdout.column("surface"), spec.surface))
    val_cutoff = time_split.cutoff_ms - int(spec.validation_days * DAY_MS)
    is_train = pc.less(train.column("event_time").cast(pa.int64()), val_cutoff)
    return Splits(
        train=_split(index, train.filter(is_train), spec, spec.max_train, 1, "training"),
        validation=_split(index, train.filter(pc.invert(is_train)), spec, spec.max_validation, 2, "validation"),
        holdout=_split(index, holdout, spec, spec.max_holdout, 3, "holdout"),
        holdout_cutoff_ms=time_split.cutoff_ms,
        validation_cutoff_ms=val_cutoff,
    )
