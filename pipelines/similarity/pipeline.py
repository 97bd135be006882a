"""The index pipeline on Beam: user representations -> trained index -> shards in parallel -> one folder.

::

    files ─ ReadUserVectors ─► (shard, table) ─┬─ TrainingSample ─ Train ───────────► trained index (side input)
                                               └─ GroupByKey ─ AddShard(trained) ─► INDEX_DIR/_parts/NNNNN.* files
                                                                  └─ (shard, rows) ─ Collect ─ Finish ─► INDEX_DIR

The finishing step merges IVF shards' inverted lists on disk and streams the vectors
(:mod:`pipelines.similarity.ondisk`): it never holds every vector or code. The shard files
go under the output's staging folder, so a multi-host runner needs it on a shared filesystem.

Before the pipeline starts, :func:`scan` reads only the ``user_id``/``ad_id``/
``model_version`` columns: the sorted user ids fix every user's position (and so its
shard, a contiguous position range), and a wrong input (no user-level rows, mixed
model versions, several embedding dims, another layout) fails at construction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

import pipelines.io.arrow_coder  # noqa: F401  (registers the pa.Table coder)
from pipelines.dataflow_job import is_dry_run, write_dry_run
from pipelines.errors import ConfigError, LayoutError
from pipelines.io.commit import staged_output
from pipelines.io.objects import arrow_filesystem, local_stand_in
from pipelines.similarity.artifact import read_manifest
from pipelines.similarity.build import (
    BuildPlan,
    BuildSpec,
    build_shard,
    finish_parts,
    plan,
    train_empty,
)
from pipelines.similarity.ondisk import Part, write_part
from pipelines.similarity.vectors import (
    UserVectors,
    embedding_dim,
    read_user_vectors,
    representation_files,
)

log = logging.getLogger(__name__)

PARTS_DIR = "_parts"

__all__ = ["AddShards", "FinishIndex", "IndexConfig", "Scan", "TrainQuantizer", "build_pipeline", "run_index", "scan"]


@dataclass(frozen=True)
class IndexConfig:
    """The index command's inputs: representations folder, output folder, how to build."""

    representations: str
    output: str
    spec: BuildSpec = field(default_factory=BuildSpec)
    overwrite: bool = False


@dataclass(frozen=True)
class Scan:
    """What the driver learned from the id columns: ``files``, sorted unique ``user_ids``, ``dim``,
    the one ``model_version``."""

    files: list[str]
    user_ids: np.ndarray
    dim: int
    model_version: str


def scan(representations: str) -> Scan:
    """Read the id columns of every file; :class:`ConfigError` for inputs the index cannot use."""
    files = representation_files(representations)
    ids: list[np.ndarray] = []
    versions: set[str] = set()
    dims: set[int] = set()
    for path in files:
        try:
            fs, where = arrow_filesystem(path)
            dims.add(embedding_dim(pq.read_schema(where, filesystem=fs), path))
            table = pq.read_table(where, filesystem=fs, columns=["user_id", "ad_id", "model_version"])
        except (pa.ArrowException, OSError) as exc:
            raise LayoutError(
                f"{path}: not a readable Parquet file ({exc}). Fix: rerun `python -m pipelines precompute`"
            ) from exc
        users = table.filter(pc.is_null(table.column("ad_id")))
        ids.append(np.asarray(users.column("user_id").to_numpy(), dtype=np.int64))
        versions.update(pc.unique(users.column("model_version")).to_pylist())
    flag = "--representations"
    if len(dims) > 1:
        raise ConfigError(flag, f"files hold embeddings of several dims {sorted(dims)}", "index one model's output")
    if len(versions) > 1:
        raise ConfigError(
            flag,
            f"user representations of {len(versions)} model versions {sorted(versions)[:3]}",
            "index one precompute output (one model_version) at a time",
        )
    user_ids = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    if len(user_ids) == 0:  # an index of 0 users answers no lookup: refuse it rather than publish it
        raise ConfigError(
            flag,
            f"{representations!r} holds no user-level representations (rows with ad_id null), only pairs",
            "rerun `python -m pipelines precompute` with --all-users to get one per user, then index that",
        )
    return Scan(files, user_ids, dims.pop(), versions.pop() if versions else "")


def _table(users: UserVectors, positions: np.ndarray) -> pa.Table:
    flat = pa.array(users.vectors.reshape(-1), pa.float32())
    return pa.table(
        {
            "position": pa.array(positions, pa.int64()),
            "user_id": pa.array(users.user_id),
            "computed_at_ms": pa.array(users.computed_at_ms, pa.int64()),
            "model_version": pa.array(users.model_version.tolist(), pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(flat, users.dim),
        }
    )


def _users(table: pa.Table, dim: int) -> tuple[UserVectors, np.ndarray]:
    vectors = np.asarray(table.column("vector").combine_chunks().flatten().to_numpy(), np.float32)
    users = UserVectors(
        np.asarray(table.column("user_id").to_numpy(), np.int64),
        vectors.reshape(-1, dim),
        np.asarray(table.column("computed_at_ms").to_numpy(), np.int64),
        np.asarray(table.column("model_version").to_pylist(), dtype=object),
    )
    return users, np.asarray(table.column("position").to_numpy(), np.int64)


def _read_shards(path: str, user_ids: np.ndarray, bounds: list[tuple[int, int]]) -> Iterator[tuple[int, pa.Table]]:
    users = read_user_vectors(path)
    positions = np.searchsorted(user_ids, users.user_id)
    starts = np.array([lo for lo, _ in bounds])
    shard = np.searchsorted(starts, positions, side="right") - 1
    for s in np.unique(shard).tolist():
        rows = np.flatnonzero(shard == s)
        yield int(s), _table(users.take(rows), positions[rows])


def _newest(tables: Iterable[pa.Table], dim: int) -> tuple[UserVectors, np.ndarray]:
    """The newest row per user of ``tables`` and each kept user's position (both by position)."""
    parts = [t for t in tables if t.num_rows]
    if not parts:
        return UserVectors.empty(dim), np.zeros(0, np.int64)
    users, positions = _users(pa.concat_tables(parts), dim)
    newest = users.newest_per_user()  # sorted by user id, i.e. by position
    position_of = dict(zip(users.user_id.tolist(), positions.tolist(), strict=True))
    return newest, np.array([position_of[u] for u in newest.user_id.tolist()], dtype=np.int64)


class TrainQuantizer(beam.PTransform):
    """(shard, table) -> one serialized index trained on the rows at the plan's sample positions."""

    def __init__(self, build: BuildPlan, spec: BuildSpec) -> None:
        super().__init__()
        self._build, self._spec = build, spec

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        sample = self._build.sample_positions
        dim = self._build.dim

        def pick(element: tuple[int, pa.Table]) -> Iterator[pa.Table]:
            table = element[1]
            keep = np.isin(table.column("position").to_numpy(), sample, assume_unique=False)
            if keep.any():
                yield table.filter(pa.array(keep))

        def train(tables: list[pa.Table]) -> bytes:
            users, positions = _newest(tables, dim)
            if not np.array_equal(positions, self._build.sample_positions):
                raise RuntimeError(
                    f"training sample has {len(positions)} of {len(self._build.sample_positions)} planned positions"
                )
            return train_empty(self._build, self._spec, users.vectors)

        return (
            tables
            | "Pick" >> beam.FlatMap(pick).with_output_types(pa.Table)
            | "Gather" >> beam.combiners.ToList()
            | "Train" >> beam.Map(train)
        )


class AddShards(beam.PTransform):
    """(shard, table) -> (shard, rows): one worker per shard adds its contiguous position range to a
    copy of the one trained index and writes it, with its vectors, into ``parts`` (see
    :mod:`pipelines.similarity.ondisk`); only the shard number and its row count travel on."""

    def __init__(self, build: BuildPlan, spec: BuildSpec, trained: beam.pvalue.AsSingleton, parts: str) -> None:
        super().__init__()
        self._build, self._spec, self._trained, self._parts = build, spec, trained, parts

    def expand(self, tables: beam.PCollection) -> beam.PCollection:
        build, spec, parts = self._build, self._spec, self._parts

        def add(element: tuple[int, Iterable[pa.Table]], trained: bytes) -> tuple[int, int]:
            shard, tables = element
            lo, hi = build.bounds[shard]
            users, positions = _newest(tables, build.dim)
            if not np.array_equal(positions, np.arange(lo, hi)):
                raise RuntimeError(f"shard {shard} holds {len(positions)} of positions {lo}..{hi - 1}")
            write_part(build_shard(trained, users.vectors, lo, spec), users.vectors, parts, shard)
            return shard, len(users)

        return tables | "ByShard" >> beam.GroupByKey() | "Add" >> beam.Map(add, trained=self._trained)


class FinishIndex(beam.PTransform):
    """Every shard's (shard, rows) -> one index folder: IVF lists merged on disk, tuned, written with
    id map, vectors and manifest (:func:`~pipelines.similarity.build.finish_parts`); the shard
    files are deleted before the commit."""

    def __init__(
        self,
        build: BuildPlan,
        found: Scan,
        config: IndexConfig,
        trained: beam.pvalue.AsSingleton,
        started: float,
        parts: str,
    ) -> None:
        super().__init__()
        self._build, self._scan, self._config, self._started = build, found, config, started
        self._trained, self._parts = trained, parts

    def expand(self, shards: beam.PCollection) -> beam.PCollection:
        build, found, config, started, parts = self._build, self._scan, self._config, self._started, self._parts

        def write(done: list[tuple[int, int]], trained: bytes) -> dict[str, Any]:
            planned = [s for s, (lo, hi) in enumerate(build.bounds) if hi > lo]
            if sorted(s for s, _ in done) != planned:
                raise RuntimeError(f"{len(done)} shards arrived, {len(planned)} planned")
            manifest = finish_parts(
                build,
                config.spec,
                trained,
                [Part(Path(parts), s) for s in planned],
                found.user_ids,
                found.model_version,
                config.representations,
                started,
                config.output,
                remove_parts=True,
            )
            return asdict(manifest)

        return shards | "Collect" >> beam.combiners.ToList() | "Write" >> beam.Map(write, trained=self._trained)


def build_pipeline(
    p: beam.Pipeline, config: IndexConfig, found: Scan, build: BuildPlan, started: float
) -> beam.PCollection:
    """Add the index steps to ``p``; the output is the written manifest as a dict."""
    user_ids = beam.pvalue.AsSingleton(p | "UserIds" >> beam.Create([found.user_ids]))  # position = rank
    tables = (
        p
        | "Files" >> beam.Create(found.files)
        | "ReadUserVectors"
        >> beam.FlatMap(_read_shards, user_ids=user_ids, bounds=build.bounds).with_output_types(tuple[int, pa.Table])
    )
    trained = beam.pvalue.AsSingleton(tables | "TrainQuantizer" >> TrainQuantizer(build, config.spec))
    parts = str(Path(config.output).resolve() / PARTS_DIR)
    shards = tables | "AddShards" >> AddShards(build, config.spec, trained, parts)
    return shards | "FinishIndex" >> FinishIndex(build, found, config, trained, started, parts)


def run_index(
    config: IndexConfig, options: PipelineOptions | None = None, runner: object | None = None
) -> dict[str, Any]:
    """Validate, run the pipeline into a staging folder, commit and publish it (see
    :mod:`pipelines.io.commit`), and return the manifest it wrote (as a dict)."""
    found = scan(config.representations)
    build = plan(config.spec, len(found.user_ids), found.dim)
    log.info(
        "indexing %d users x %d dims from %d files: %s, %d shard(s), training on %d",
        len(found.user_ids),
        found.dim,
        len(found.files),
        build.factory,
        len(build.bounds),
        len(build.sample_positions),
    )
    if options is not None and is_dry_run(options):  # a job graph, built offline: no index to stage
        with beam.Pipeline(runner=runner, options=options) as p:  # type: ignore[arg-type]
            build_pipeline(p, config, found, build, time.perf_counter())
        return write_dry_run(p.result, options, config.output)
    inputs = [("--representations", config.representations)]
    with (
        staged_output(config.output, overwrite=config.overwrite, holds="an index", inputs=inputs) as staging,
        local_stand_in(staging.root, prefix="gem-index-") as root,  # FAISS writes local files
    ):
        started = time.perf_counter()
        staged = replace(config, output=root)
        with beam.Pipeline(runner=runner, options=options or PipelineOptions([])) as p:  # type: ignore[arg-type]
            build_pipeline(p, staged, found, build, started)
        manifest = asdict(read_manifest(root))
    return manifest
