"""The as-of features pipeline on Beam: examples keyed by user shard -> snapshots + as-of join per shard.

::

    (shard, examples of the shard's users) ─ ParDo(AsOfShard: model loaded in setup, the shard's
        histories read, snapshots planned and computed, joined and resolved per setting)
        ─► (setting, (shard, examples, features)) ─ GroupByKey(setting)
        ─ ParDo(SimilarUsers: the similar-users step over every shard's rows of the setting, which
        needs the snapshot's index of every user and the neighbours' histories, in any shard)
        ─► asof_features rows ─ WriteShard ─► DIR/shard=NNNNN/part-SETTING.parquet

The logic is :func:`pipelines.transfer.snapshots.settings_asof` (pure numpy + the model's inference
path), cut in its two steps; this module only moves Arrow tables. :func:`run_asof_pipeline` runs
it and reads the features back for the variants.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

import pipelines.io.arrow_coder  # noqa: F401  (registers the pa.Table coder)
from pipelines.io.files import match_files
from pipelines.io.parquet import read_table, write_table
from pipelines.io.shards import shard_dir
from pipelines.schemas.layouts import ASOF_FEATURES, HISTORY
from pipelines.transfer.data import Splits
from pipelines.transfer.snapshots import AsOfSetting, RepFeatures

log = logging.getLogger(__name__)

__all__ = ["AsOfShard", "SimilarUsers", "features_table", "read_features", "run_asof_pipeline", "tag_examples"]

SPLIT_NAMES = ("train", "validation", "holdout")


def tag_examples(splits: Splits) -> pa.Table:
    """Every split's sampled rows in one table, with ``split`` and ``position`` columns."""
    parts = []
    for name in SPLIT_NAMES:
        rows = getattr(splits, name).rows
        n = rows.num_rows
        parts.append(
            rows.append_column("split", pa.array([name] * n, pa.string())).append_column(
                "position", pa.array(np.arange(n, dtype=np.int64))
            )
        )
    return pa.concat_tables(parts)


def features_table(setting: str, examples: pa.Table, f: RepFeatures) -> pa.Table:
    """ASOF_FEATURES rows of ``examples`` (tagged by :func:`tag_examples`) and their features."""
    n = examples.num_rows

    def vectors(x: np.ndarray) -> pa.Array:
        offsets = np.arange(n + 1, dtype=np.int32) * x.shape[1]
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(x.reshape(-1), pa.float32()))

    def ages(x: np.ndarray) -> pa.Array:
        return pa.array(x, pa.float64(), mask=np.isnan(x))

    return pa.Table.from_arrays(
        [
            pa.array([setting] * n, pa.string()),
            examples.column("split").combine_chunks(),
            examples.column("position").combine_chunks(),
            examples.column("event_id").combine_chunks(),
            pa.array(f.path.astype(np.int8)),
            ages(f.user_age_s),
            ages(f.pair_age_s),
            vectors(f.user),
            vectors(f.pair),
        ],
        schema=ASOF_FEATURES.schema,
    )


def _shard_histories(features_dir: str, shard: int | None) -> pa.Table:
    """One shard's histories, or every shard's (``None``); an empty HISTORY table when none."""
    pattern = f"{features_dir}/histories/shard=*" if shard is None else shard_dir(features_dir, "histories", shard)
    paths = match_files(pattern + "/*.parquet")
    if not paths:
        return HISTORY.schema.empty_table()
    return pa.concat_tables(read_table(p, HISTORY) for p in paths)


class AsOfShard(beam.DoFn):
    """``(shard, examples)`` -> ASOF_FEATURES tables, one per setting; the model is loaded in ``setup``."""

    def __init__(self, features_dir: str, model_dir: str, settings: Sequence[AsOfSetting], device: str = "cpu") -> None:
        self.features_dir = features_dir
        self.model_dir = model_dir
        self.settings = list(settings)
        self.device = device

    def setup(self) -> None:
        from pipelines.model.checkpoint import load_model

        self.model = load_model(self.model_dir, device=self.device)
        self.computed = beam.metrics.Metrics.counter("transfer", "asof_rows")

    def process(self, element: tuple[int, pa.Table]) -> Iterator[tuple[str, tuple[int, pa.Table, RepFeatures]]]:
        from pipelines.model.inputs import HistoryIndex
        from pipelines.transfer.snapshots import base_features, example_keys

        shard, examples = element
        index = HistoryIndex(_shard_histories(self.features_dir, shard))
        base = base_features(self.model, index, example_keys(examples), self.settings, 0)
        for setting in self.settings:
            self.computed.inc(examples.num_rows)
            yield setting.name, (shard, examples, base[setting.name])


class SimilarUsers(beam.DoFn):
    """``(setting, [(shard, examples, features)])`` -> ``(shard, setting, ASOF_FEATURES table)`` per
    shard, after the similar-users step over all of the setting's rows (every user's histories are
    read only when some row needs it)."""

    def __init__(self, features_dir: str, model_dir: str, settings: Sequence[AsOfSetting], device: str = "cpu") -> None:
        self.features_dir = features_dir
        self.model_dir = model_dir
        self.settings = {s.name: s for s in settings}
        self.device = device

    def setup(self) -> None:
        from pipelines.model.checkpoint import load_model

        self.model = load_model(self.model_dir, device=self.device)
        self.everyone: Any = None
        self.answered = beam.metrics.Metrics.counter("transfer", "similar_users_rows")

    def process(
        self, element: tuple[str, Iterable[tuple[int, pa.Table, RepFeatures]]]
    ) -> Iterator[tuple[int, str, pa.Table]]:
        from pipelines.model.inputs import HistoryIndex
        from pipelines.similarity.policy import FallbackPath
        from pipelines.transfer.similar import needs_neighbours
        from pipelines.transfer.snapshots import example_keys, model_neighbours, with_similar_users

        name, grouped = element
        setting = self.settings[name]
        parts = sorted(grouped, key=lambda part: part[0])
        examples = pa.concat_tables([p[1] for p in parts])
        features = RepFeatures.concat([p[2] for p in parts])
        if (needs_neighbours(setting.policy, features.path) & np.isfinite(features.user_age_s)).any():
            if self.everyone is None:
                self.everyone = HistoryIndex(_shard_histories(self.features_dir, None))
            source = model_neighbours(self.model, self.everyone, setting)
            features = with_similar_users(example_keys(examples), features, setting, source)
            self.answered.inc(int((features.path == FallbackPath.SIMILAR_USERS).sum()))
        start = 0
        for shard, part, _ in parts:
            rows = np.arange(start, start + part.num_rows)
            start += part.num_rows
            yield shard, name, features_table(name, part, features.take(rows))


class _WriteShard(beam.DoFn):
    def __init__(self, output: str) -> None:
        self.output = output

    def process(self, element: tuple[int, str, pa.Table]) -> Iterator[str]:
        shard, setting, table = element
        path = Path(self.output) / f"shard={shard:05d}" / f"part-{setting}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(table, str(path), ASOF_FEATURES)
        yield str(path)


def shard_examples(features_dir: str, examples: pa.Table) -> list[tuple[int, pa.Table]]:
    """``examples`` cut by the histories shard that holds each example's user (read from the
    shards' ``user_id`` columns, so any sharding of the features folder works); users without a
    history go with the first shard (they read no events anyway)."""
    folders = sorted(Path(features_dir, "histories").glob("shard=*"))
    ids, shards = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for folder in folders:
        shard = int(folder.name.split("=")[1])
        for path in sorted(folder.glob("*.parquet")):
            users = pq.read_table(path, columns=["user_id"]).column("user_id").to_numpy()
            ids.append(users.astype(np.int64))
            shards.append(np.full(len(users), shard, np.int64))
    all_ids, all_shards = np.concatenate(ids), np.concatenate(shards)
    order = np.argsort(all_ids, kind="stable")
    all_ids, all_shards = all_ids[order], all_shards[order]
    users = examples.column("user_id").to_numpy()
    pos = np.minimum(np.searchsorted(all_ids, users), max(len(all_ids) - 1, 0))
    hit = (all_ids[pos] == users) if len(all_ids) else np.zeros(len(users), bool)
    first = int(all_shards.min()) if len(all_shards) else 0
    shard_of = np.where(hit, all_shards[pos] if len(all_shards) else first, first)
    return [(int(k), examples.filter(pa.array(shard_of == k))) for k in np.unique(shard_of)]


def read_features(output: str, splits: Splits, settings: Sequence[AsOfSetting]) -> dict[str, dict[str, RepFeatures]]:
    """The pipeline's rows back as ``features[setting][split]``, in each split's row order."""
    files = sorted(str(p) for p in Path(output).rglob("*.parquet"))
    table = pa.concat_tables(pq.read_table(f) for f in files) if files else ASOF_FEATURES.schema.empty_table()
    setting_col = np.asarray(table.column("setting").to_pylist())
    split_col = np.asarray(table.column("split").to_pylist())
    position = table.column("position").to_numpy()
    out: dict[str, dict[str, RepFeatures]] = {}
    for s in settings:
        out[s.name] = {}
        for name in SPLIT_NAMES:
            n = getattr(splits, name).rows.num_rows
            rows = np.flatnonzero((setting_col == s.name) & (split_col == name))
            if len(rows) != n or len(np.unique(position[rows])) != n:
                raise RuntimeError(f"as-of pipeline wrote {len(rows)} rows of {s.name}/{name}, expected {n}")
            rows = rows[np.argsort(position[rows])]
            part = table.take(pa.array(rows))

            def matrix(col: str, part: pa.Table = part) -> np.ndarray:
                flat = part.column(col).combine_chunks().flatten().to_numpy(zero_copy_only=False)
                return np.asarray(flat, np.float32).reshape(part.num_rows, -1)

            def ages(col: str, part: pa.Table = part) -> np.ndarray:
                return np.asarray(part.column(col).to_numpy(zero_copy_only=False), np.float64)

            out[s.name][name] = RepFeatures(
                matrix("user_embedding"),
                matrix("pair_embedding"),
                part.column("path").to_numpy().astype(np.int8),
                ages("user_age_s"),
                ages("pair_age_s"),
            )
    return out


def run_asof_pipeline(
    features_dir: str,
    model_dir: str,
    splits: Splits,
    settings: Sequence[AsOfSetting],
    output: str | Path,
    options: PipelineOptions | None = None,
    runner: Any = None,
    device: str = "cpu",
) -> dict[str, dict[str, RepFeatures]]:
    """Run the pipeline over every split's examples (keyed by the features' user shards), write
    ``output/shard=NNNNN/part-SETTING.parquet`` and read the features back. ``options``/``runner``:
    from :mod:`pipelines.runners` (default: Beam's in-process FnApiRunner)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    out = str(output)
    by_shard = shard_examples(features_dir, tag_examples(splits))
    if options is None:
        options = PipelineOptions(["--direct_running_mode=in_memory"], save_main_session=False)
        runner = runner or FnApiRunner()
    with beam.Pipeline(runner=runner, options=options) as p:
        _ = (
            p
            | "Examples" >> beam.Create(by_shard)
            | "AsOfShard" >> beam.ParDo(AsOfShard(features_dir, model_dir, settings, device))
            | "BySetting" >> beam.GroupByKey()
            | "SimilarUsers" >> beam.ParDo(SimilarUsers(features_dir, model_dir, settings, device))
            | "WriteShard" >> beam.ParDo(_WriteShard(out))
        )
    return read_features(out, splits, settings)
