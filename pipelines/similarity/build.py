"""Building a user index, step by step (pure; the Beam pipeline runs the same steps on workers).

1. :func:`plan` resolves the factory, checks the input can train it and draws a seeded
   sample of positions (the real vectors, never random data);
2. :func:`train_empty` trains one empty index on that sample and serializes it;
3. :func:`build_shard` adds one contiguous range of positions to a copy of it, in batches;
4. :func:`finish` merges the shards (IVF, flat codes) or keeps them as an ``IndexShards``
   (HNSW), tunes the search parameter on sample queries against exact search, and
   :func:`write_built` writes the folder described in :mod:`pipelines.similarity.artifact`.

:func:`build_index` does all of it in one process. The index pipeline instead writes each
shard to files (:func:`pipelines.similarity.ondisk.write_part`) and :func:`finish_parts`
merges IVF shards' inverted lists on disk and streams the vectors, so the finishing process
holds one inverted list and the trained quantizer, never every vector or code.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipelines.errors import ConfigError
from pipelines.io.commit import COMMITTED, commit_folder
from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.artifact import (
    INDEX_NAME,
    VECTORS_NAME,
    IndexManifest,
    Layout,
    write_id_map,
    write_manifest,
    write_vectors,
)
from pipelines.similarity.faiss_ops import faiss
from pipelines.similarity.ondisk import (
    IVFDATA_NAME,
    FileRows,
    MappedIndex,
    Part,
    concat_vectors,
    exact_search_files,
    merge_lists,
    read_rows,
    remove_part,
)
from pipelines.similarity.vectors import UserVectors, as_vectors

log = logging.getLogger(__name__)

__all__ = [
    "BuildPlan",
    "BuildSpec",
    "BuiltIndex",
    "build_index",
    "finish_parts",
    "plan",
    "shard_bounds",
    "write_built",
]

TUNE_K = 10


@dataclass(frozen=True)
class BuildSpec:
    """How to build: factory string (or ``auto``), metric, GPU use, shards, training sample,
    search parameters (None: the cheapest reaching ``recall_target`` recall@10 on
    ``tune_queries`` sample queries), the seed of every sample."""

    factory: str = "auto"
    metric: ops.Metric = "ip"
    gpu: ops.GpuMode = "auto"
    shards: int = 1
    train_size: int | None = None
    seed: int = 0
    search_params: str | None = None
    recall_target: float = 0.95
    tune_queries: int = 500
    batch_size: int = ops.ADD_BATCH

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ConfigError("--shards", f"got {self.shards}", "pass a positive number of shards")
        if self.metric not in ops.METRICS:
            raise ConfigError("--metric", f"got {self.metric!r}", "pass ip or l2")
        if self.gpu not in ("auto", "off"):
            raise ConfigError("--gpu", f"got {self.gpu!r}", "pass auto or off")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError("--train-size", f"got {self.train_size}", "pass a positive number or leave it out")
        if not 0 < self.recall_target <= 1:
            raise ConfigError("--recall-target", f"got {self.recall_target}", "pass a value in (0, 1]")
        if self.batch_size < 1 or self.tune_queries < 0:
            raise ConfigError("--batch-size", "batch size and tune queries must be positive", "pass positive values")


@dataclass(frozen=True)
class BuildPlan:
    """What :func:`plan` decided: the concrete factory, the sample positions, the shard ranges."""

    factory: str
    dim: int
    count: int
    sample_positions: np.ndarray
    bounds: list[tuple[int, int]]


@dataclass
class BuiltIndex:
    """A built index in memory: ``index`` (CPU; an ``IndexShards`` over ``parts`` when sharded),
    ``user_ids (N,)`` by position, ``vectors (N, D) float32`` by position, the manifest."""

    index: Any
    parts: list[Any]
    user_ids: np.ndarray
    vectors: np.ndarray
    manifest: IndexManifest


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous position ranges covering ``0..n`` (fewer when n is small)."""
    shards = max(1, min(shards, n))
    edges = [n * s // shards for s in range(shards + 1)]
    return list(itertools.pairwise(edges))


def plan(spec: BuildSpec, count: int, dim: int) -> BuildPlan:
    """Resolve the factory, check it can be trained on ``count`` vectors, draw the training sample."""
    factory = ops.resolve_factory(spec.factory, count, dim)
    empty = ops.new_index(factory, dim, spec.metric)
    n_train = ops.train_size(empty, count, spec.train_size)
    ops.check_trainable(empty, factory, n_train if not empty.is_trained else count)
    rng = np.random.default_rng(spec.seed)
    sample = np.sort(rng.choice(count, size=n_train, replace=False)) if n_train else np.zeros(0, np.int64)
    return BuildPlan(factory, dim, count, sample.astype(np.int64), shard_bounds(count, spec.shards))


def train_empty(build: BuildPlan, spec: BuildSpec, sample: np.ndarray) -> bytes:
    """The empty index trained on ``sample`` (rows at ``build.sample_positions``, in order), serialized."""
    index = ops.new_index(build.factory, build.dim, spec.metric)
    if not index.is_trained:
        ops.seed_training(index, spec.seed)
        index = ops.train(index, as_vectors(sample, build.dim, "training sample"), spec.gpu)
    return ops.serialize(index)


def build_shard(trained: bytes, vectors: np.ndarray, first_position: int, spec: BuildSpec) -> Any:
    """A copy of the trained index holding ``vectors`` at positions ``first_position...``."""
    index = ops.deserialize(trained)
    positions = np.arange(first_position, first_position + len(vectors), dtype=np.int64)
    ids = positions if ops.uses_explicit_ids(index) else None
    return ops.add_in_batches(index, as_vectors(vectors, index.d, "shard vectors"), ids, spec.gpu, spec.batch_size)


def _combine(parts: list[Any]) -> tuple[Any, Literal["merged", "sharded"]]:
    if len(parts) == 1:
        return parts[0], "merged"
    if ops.mergeable(parts[0]):
        return ops.merge_indexes(parts), "merged"
    shards = faiss.IndexShards(parts[0].d, True, True)  # threaded, ids offset by earlier shards
    for part in parts:
        shards.add_shard(part)
    shards.metric_type = parts[0].metric_type
    return shards, "sharded"


def _tune(index: Any, vectors: np.ndarray, spec: BuildSpec) -> tuple[str, float | None]:
    """Tune (or just measure) recall@10 on sample users as queries, each user's own vector left out."""
    return _tune_with(
        index,
        spec,
        len(vectors),
        lambda own: vectors[own],
        lambda queries, k: ops.exact_search(vectors, queries, k, spec.metric)[1],
    )


def _tune_with(
    index: Any,
    spec: BuildSpec,
    n: int,
    rows: Callable[[np.ndarray], np.ndarray],
    exact: Callable[[np.ndarray, int], np.ndarray],
) -> tuple[str, float | None]:
    """:func:`_tune` over ``n`` vectors reached through ``rows(positions)`` and ``exact(queries, k)``."""
    if n < 2 or spec.tune_queries == 0:
        if spec.search_params:
            ops.set_search_params(index, spec.search_params)
        return spec.search_params or "", None
    rng = np.random.default_rng(spec.seed + 1)
    own = np.sort(rng.choice(n, size=min(n, spec.tune_queries), replace=False))
    k = min(TUNE_K, n - 1)
    queries = np.ascontiguousarray(rows(own), dtype=np.float32)
    truth = ops.without_self(exact(queries, k + 1), own, k)
    if spec.search_params is None:
        return ops.tune_search(index, queries, truth, spec.recall_target, own)
    ops.set_search_params(index, spec.search_params)
    found = ops.without_self(index.search(queries, k + 1)[1], own, k)
    return spec.search_params, ops.recall_at_k(found, truth)


def _manifest(
    build: BuildPlan,
    spec: BuildSpec,
    count: int,
    layout: Layout,
    files: list[str],
    shards: int,
    tuned: tuple[str, float | None],
    model_version: str,
    source: str,
    started: float,
) -> IndexManifest:
    return IndexManifest(
        model_version=model_version,
        dim=build.dim,
        metric=spec.metric,
        factory=build.factory,
        count=count,
        built_at=IndexManifest.now(),
        layout=layout,
        files=files,
        shards=shards,
        search_params=tuned[0],
        tuned_recall_at_10=tuned[1],
        train_size=len(build.sample_positions),
        seed=spec.seed,
        gpu_used=ops.gpu_count(spec.gpu) > 0,
        build_seconds=round(time.perf_counter() - started, 3),
        source=source,
    )


def finish(
    build: BuildPlan,
    spec: BuildSpec,
    parts: list[Any],
    users: UserVectors,
    model_version: str,
    source: str,
    started: float,
    log_level: int = logging.INFO,
) -> BuiltIndex:
    """Merge or shard ``parts``, tune the search parameter, and describe the result."""
    index, layout = _combine(parts)
    if index.ntotal != len(users):
        raise RuntimeError(f"index holds {index.ntotal} vectors, the id map {len(users)}")
    tuned = _tune(ops.searchable(index, build.factory, users.vectors, spec.metric), users.vectors, spec)
    files = [INDEX_NAME] if layout == "merged" else _shard_files(len(parts))
    manifest = _manifest(build, spec, len(users), layout, files, len(parts), tuned, model_version, source, started)
    _log_built(manifest, log_level)
    return BuiltIndex(index, parts if layout == "sharded" else [index], users.user_id, users.vectors, manifest)


def _shard_files(n: int) -> list[str]:
    return [f"shard-{i:05d}.faiss" for i in range(n)]


def _log_built(m: IndexManifest, log_level: int = logging.INFO) -> None:
    log.log(
        log_level,
        "index %s: %d vectors x %d, %s, %s recall@10 %s",
        m.factory,
        m.count,
        m.dim,
        m.layout,
        m.search_params or "exact",
        m.tuned_recall_at_10,
    )


def finish_parts(
    build: BuildPlan,
    spec: BuildSpec,
    trained: bytes,
    parts: list[Part],
    user_ids: np.ndarray,
    model_version: str,
    source: str,
    started: float,
    output: str | Path,
    *,
    remove_parts: bool = False,
) -> IndexManifest:
    """Finish from shard files (``parts``, in position order) into the folder ``output``, committed.

    IVF shards: their inverted lists merged on disk (``layout="ondisk"``); other types (small
    inputs: Flat, HNSW) are read and merged or kept as shards as :func:`finish` does. The vectors
    are streamed into ``vectors.npy`` and tuning reads them in chunks, so this process holds one
    inverted list, one chunk of vectors, the trained quantizer and the id map. With
    ``remove_parts`` the parts' files are deleted once merged (before the commit).
    """
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMMITTED).unlink(missing_ok=True)
    vectors = concat_vectors(parts, folder / VECTORS_NAME, build.dim)
    base = ops.deserialize(trained)
    layout: Layout
    if ops.nlist_of(base) is not None:
        merged, layout, files = merge_lists(base, parts, folder), "ondisk", [INDEX_NAME, IVFDATA_NAME]
        faiss.write_index(merged, str(folder / INDEX_NAME))
        del merged  # unmaps the lists: tuning maps them a batch of queries at a time
        index = MappedIndex(folder / INDEX_NAME)
    else:
        held = [faiss.read_index(str(p.index)) for p in parts] or [base]  # small inputs only: see auto
        index, layout = _combine(held)
        files = [INDEX_NAME] if layout == "merged" else _shard_files(len(held))
        for part, name in zip([index] if layout == "merged" else held, files, strict=True):
            faiss.write_index(part, str(folder / name))
    if index.ntotal != len(user_ids):
        raise RuntimeError(f"index holds {index.ntotal} vectors, the id map {len(user_ids)}")
    tuned = _tune_with(
        ops.searchable(index, build.factory, FileRows(vectors), spec.metric),  # type: ignore[arg-type]
        spec,
        len(user_ids),
        lambda own: read_rows(vectors, own),
        lambda queries, k: exact_search_files(vectors, queries, k, spec.metric)[1],
    )
    shards = max(len(parts), 1)
    manifest = _manifest(build, spec, len(user_ids), layout, files, shards, tuned, model_version, source, started)
    if remove_parts:
        for part in parts:
            remove_part(part)
        with contextlib.suppress(OSError):
            if parts:
                parts[0].folder.rmdir()
    write_id_map(folder, user_ids)
    write_manifest(folder, manifest)
    commit_folder(str(folder), holds="an index")
    _log_built(manifest)
    return manifest


def model_version_of(users: UserVectors, flag: str = "--representations") -> str:
    """The one model_version of ``users``; :class:`ConfigError` when they mix versions."""
    versions = sorted(set(users.model_version.tolist()))
    if len(versions) > 1:
        raise ConfigError(
            flag,
            f"user representations of {len(versions)} model versions {versions[:3]}",
            "index one precompute output (one model_version) at a time",
        )
    return versions[0] if versions else ""


def build_index(
    users: UserVectors,
    spec: BuildSpec | None = None,
    *,
    model_version: str | None = None,
    source: str = "",
    log_level: int = logging.INFO,
) -> BuiltIndex:
    """Build in this process: newest row per user, train on a seeded sample, add shard by shard. The
    summary line is logged at ``log_level`` (DEBUG for callers that build many small indexes)."""
    spec = spec or BuildSpec()
    started = time.perf_counter()
    users = users.newest_per_user()
    version = model_version if model_version is not None else model_version_of(users)
    build = plan(spec, len(users), users.dim)
    trained = train_empty(build, spec, users.vectors[build.sample_positions])
    parts = [build_shard(trained, users.vectors[lo:hi], lo, spec) for lo, hi in build.bounds]
    return finish(build, spec, parts, users, version, source, started, log_level)


def write_built(built: BuiltIndex, output: str | Path) -> Path:
    """Write the index files, the id map, the vectors, the manifest and (last) the commit into ``output``.

    In place: a crash leaves no ``_COMMITTED`` and readers refuse the folder; the ``index``
    command writes into a staging folder and publishes it (:mod:`pipelines.io.commit`).
    """
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMMITTED).unlink(missing_ok=True)
    for part, name in zip(built.parts, built.manifest.files, strict=True):
        faiss.write_index(part, str(folder / name))
    write_id_map(folder, built.user_ids)
    write_vectors(folder, built.vectors)
    write_manifest(folder, built.manifest)
    commit_folder(str(folder), holds="an index")
    return folder
