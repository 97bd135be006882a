"""Shards written as files and merged on disk; the compressed factory with its refine step."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from pipelines.similarity import faiss_ops as ops
from pipelines.similarity import ondisk
from pipelines.similarity.artifact import read_id_map, read_manifest, read_vectors
from pipelines.similarity.build import BuildSpec, build_index, build_shard, finish_parts, plan, train_empty
from pipelines.similarity.ondisk import Part, exact_search_files, write_part
from pipelines.similarity.user_index import UserIndex
from tests.similarity.data import VERSION, clustered, user_ids, users

DIM = 16
N = 4_000
COMPRESSED = "IVF32,PQ4,RFlat"


@pytest.fixture(scope="module")
def sample() -> np.ndarray:
    return clustered(N + 200, DIM, seed=7)


def build_from_parts(vectors: np.ndarray, spec: BuildSpec, out: Path) -> Path:
    """The index pipeline's steps without Beam: train, one part per shard on disk, finish from the parts."""
    build = plan(spec, len(vectors), DIM)
    trained = train_empty(build, spec, vectors[build.sample_positions])
    parts: list[Part] = []
    for shard, (lo, hi) in enumerate(build.bounds):
        index = build_shard(trained, vectors[lo:hi], lo, spec)
        parts.append(write_part(index, vectors[lo:hi], out / "_parts", shard))
    finish_parts(
        build, spec, trained, parts, user_ids(len(vectors)), VERSION, "", time.perf_counter(), out, remove_parts=True
    )
    return out


@pytest.fixture(scope="module")
def compressed(sample: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compressed index with its refine step, built from 3 parts on disk."""
    spec = BuildSpec(factory=COMPRESSED, shards=3, recall_target=0.9)
    return build_from_parts(sample[:N], spec, tmp_path_factory.mktemp("pq") / "idx")


@pytest.mark.parametrize("factory", ["IVF32,Flat", "Flat", "HNSW16", COMPRESSED])
def test_parts_merged_on_disk_equal_a_one_shard_build(
    tmp_path: Path, sample: np.ndarray, compressed: Path, factory: str
) -> None:
    data, queries = sample[:N], sample[N:]
    if factory == COMPRESSED:
        folder = compressed
    else:
        params = "nprobe=4" if "IVF" in factory else ""
        folder = build_from_parts(data, BuildSpec(factory=factory, shards=3, search_params=params), tmp_path / "idx")
    manifest = read_manifest(folder)
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)  # the lists file is found beside the index file, wherever it is
    loaded = UserIndex.load(moved, gpu="off")
    same = BuildSpec(factory=factory, search_params=manifest.search_params)
    one = UserIndex.from_built(build_index(users(data), same))
    assert manifest.layout == ("ondisk" if "IVF" in factory else "sharded" if "HNSW" in factory else "merged")
    assert manifest.shards == 3 and manifest.count == N and not (folder / "_parts").exists()
    np.testing.assert_array_equal(read_id_map(moved), user_ids(N))
    np.testing.assert_array_equal(read_vectors(moved), data.astype(np.float16))
    if "HNSW" not in factory:  # graph shards are searched together, not merged: same answers only for the rest
        np.testing.assert_array_equal(loaded.search(queries, 10)[1], one.search(queries, 10)[1])


def test_compressed_index_with_refine_reaches_recall_against_exact(sample: np.ndarray, compressed: Path) -> None:
    data, queries = sample[:N], sample[N:]
    truth = ops.exact_search(data, queries, 10, "ip")[1]
    loaded = UserIndex.load(compressed, gpu="off")
    assert isinstance(loaded.index, ops.RefinedIndex)
    refined = ops.recall_at_k(loaded.search(queries, 10)[1], truth)
    assert refined >= 0.9
    unrefined = ops.recall_at_k(loaded.index.base.search(queries, 10)[1], truth)
    assert unrefined < refined  # the refine step is what gets there


def test_compressed_folder_holds_codes_and_ids_only(compressed: Path) -> None:
    assert (compressed / "lists.ivfdata").stat().st_size == N * (4 + 8)  # 4 code bytes + an int64 id per user


def test_auto_factory_compresses_large_inputs() -> None:
    assert ops.resolve_factory("auto", ops.AUTO_COMPRESSED_FROM - 1) == "IVF8192,Flat"
    assert ops.resolve_factory("auto", 5_000_000, 64) == "IVF8192,PQ32,RFlat"
    assert ops.base_factory("IVF8192,PQ32,RFlat") == ("IVF8192,PQ32", True)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_chunked_exact_search_equals_in_memory(
    tmp_path: Path, sample: np.ndarray, metric: ops.Metric, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v.npy"
    np.save(path, sample[:N].astype(np.float16))
    monkeypatch.setattr(ondisk, "EXACT_CHUNK_ROWS", 1_000)  # several chunks
    chunked = exact_search_files(path, sample[N:], 10, metric)[1]
    np.testing.assert_array_equal(chunked, ops.exact_search(sample[:N], sample[N:], 10, metric)[1])


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_exact_search_equals_a_numpy_reference(sample: np.ndarray, metric: ops.Metric) -> None:
    """faiss's knn against scores computed by NumPy; past the rows, -1 positions."""
    rows, queries = sample[:300], sample[N : N + 20]
    if metric == "ip":
        scores = queries @ rows.T
        order = np.argsort(-scores, axis=1, kind="stable")
    else:
        scores = ((queries[:, None, :] - rows[None, :, :]) ** 2).sum(-1)
        order = np.argsort(scores, axis=1, kind="stable")
    got_scores, got = ops.exact_search(rows, queries, 10, metric)
    np.testing.assert_array_equal(got, order[:, :10])
    np.testing.assert_allclose(got_scores, np.take_along_axis(scores, order[:, :10], axis=1), rtol=1e-4, atol=1e-4)
    assert (ops.exact_search(rows[:3], queries, 5, metric)[1][:, 3:] == -1).all()
