"""Index building: factory strings, seeded training, shards that merge (or not), recall against exact search."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.errors import ConfigError
from pipelines.io.commit import commit_folder
from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.artifact import read_id_map, read_manifest
from pipelines.similarity.build import BuildSpec, build_index, shard_bounds, write_built
from pipelines.similarity.user_index import UserIndex
from pipelines.similarity.vectors import UserVectors, as_vectors
from tests.similarity.data import VERSION, clustered, user_ids, users

DIM = 16


@pytest.fixture(scope="module")
def sample() -> np.ndarray:
    return clustered(4_200, DIM, seed=1)


@pytest.fixture(scope="module")
def data(sample: np.ndarray) -> np.ndarray:
    return sample[:4_000]


@pytest.fixture(scope="module")
def queries(sample: np.ndarray) -> np.ndarray:
    """Fresh points of the same distribution (not in the index)."""
    return sample[4_000:]


def test_auto_factory_is_flat_when_small_and_ivf_when_large() -> None:
    assert ops.resolve_factory("auto", 5_000) == "Flat"
    assert ops.resolve_factory("auto", 1_000_000) == "IVF4096,Flat"
    assert ops.resolve_factory("HNSW32", 10) == "HNSW32"


def test_bad_factory_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--factory"):
        ops.new_index("NotAnIndex7", DIM, "ip")


def test_ivf_needs_enough_training_vectors(data: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="needs at least 64 training vectors"):
        build_index(users(data[:50]), BuildSpec(factory="IVF64,Flat"))


@pytest.mark.parametrize("factory", ["IVF32,Flat", "HNSW16", "Flat"])
def test_recall_against_exact_search(data: np.ndarray, queries: np.ndarray, factory: str) -> None:
    built = build_index(users(data), BuildSpec(factory=factory, recall_target=0.95))
    truth = ops.exact_search(data, queries, 10, "ip")[1]
    found = UserIndex.from_built(built).search(queries, 10)[1]
    assert ops.recall_at_k(found, truth) >= 0.95
    assert built.manifest.tuned_recall_at_10 is not None and built.manifest.tuned_recall_at_10 >= 0.95


@pytest.mark.parametrize("factory", ["IVF32,Flat", "Flat", "IVF16,PQ4x4"])
def test_merged_shards_equal_one_shard(data: np.ndarray, queries: np.ndarray, factory: str) -> None:
    spec = BuildSpec(factory=factory, search_params="nprobe=4" if "IVF" in factory else "", train_size=2_000)
    one = build_index(users(data), spec)
    three = build_index(users(data), BuildSpec(**{**spec.__dict__, "shards": 3}))
    assert three.manifest.layout == "merged" and three.manifest.shards == 3
    s1, p1 = UserIndex.from_built(one).search(queries, 10)
    s3, p3 = UserIndex.from_built(three).search(queries, 10)
    np.testing.assert_array_equal(p1, p3)
    np.testing.assert_allclose(s1, s3, rtol=1e-6)


def test_hnsw_shards_are_served_together_and_approximate_one(data: np.ndarray, queries: np.ndarray) -> None:
    three = build_index(users(data), BuildSpec(factory="HNSW16", shards=3))
    assert three.manifest.layout == "sharded" and len(three.parts) == 3
    truth = ops.exact_search(data, queries, 10, "ip")[1]
    assert ops.recall_at_k(UserIndex.from_built(three).search(queries, 10)[1], truth) >= 0.95


def test_build_is_deterministic(data: np.ndarray) -> None:
    a = build_index(users(data), BuildSpec(factory="IVF32,Flat", seed=3))
    b = build_index(users(data), BuildSpec(factory="IVF32,Flat", seed=3))
    assert ops.serialize(a.index) == ops.serialize(b.index)


def test_written_folder_loads_with_manifest_and_id_map(tmp_path: Path, data: np.ndarray) -> None:
    built = build_index(users(data), BuildSpec(factory="IVF32,Flat"), source="here")
    write_built(built, tmp_path / "idx")
    manifest = read_manifest(tmp_path / "idx")
    assert (manifest.model_version, manifest.dim, manifest.metric, manifest.factory, manifest.count) == (
        VERSION,
        DIM,
        "ip",
        "IVF32,Flat",
        len(data),
    )
    assert manifest.built_at.endswith("+00:00") and manifest.search_params.startswith("nprobe=")
    np.testing.assert_array_equal(read_id_map(tmp_path / "idx"), user_ids(len(data)))
    loaded = UserIndex.load(tmp_path / "idx", gpu="auto")
    assert not loaded.on_gpu  # this faiss build has no GPU support
    found = loaded.neighbors(user_ids(3), 5)
    assert (found.user_ids >= 0).all() and not np.isin(found.user_ids, user_ids(3)[:, None]).any(axis=1).all()
    for row, user in enumerate(user_ids(3)):
        assert user not in found.user_ids[row]  # never its own neighbour
    assert np.all(np.diff(found.similarity, axis=1) <= 1e-6)  # nearest first


def test_sharded_folder_loads(tmp_path: Path, data: np.ndarray) -> None:
    write_built(build_index(users(data), BuildSpec(factory="HNSW16", shards=2)), tmp_path / "idx")
    assert read_manifest(tmp_path / "idx").files == ["shard-00000.faiss", "shard-00001.faiss"]
    loaded = UserIndex.load(tmp_path / "idx")
    assert len(loaded) == len(data) and (loaded.neighbors(user_ids(2), 4).user_ids >= 0).all()


def test_l2_metric_similarity_is_cosine_on_unit_vectors(data: np.ndarray) -> None:
    built = build_index(users(data), BuildSpec(factory="Flat", metric="l2"))
    found = UserIndex.from_built(built).neighbors(user_ids(1), 3)
    first = int((found.user_ids[0, 0] - 10) // 3)
    assert found.similarity[0, 0] == pytest.approx(float(data[0] @ data[first]), abs=2e-3)


def test_empty_input_gives_an_empty_flat_index() -> None:
    built = build_index(UserVectors.empty(DIM), BuildSpec())
    index = UserIndex.from_built(built)
    assert built.manifest.count == 0 and built.manifest.factory == "Flat"
    assert (index.neighbors(np.array([1, 2]), 5).user_ids == -1).all()


def test_unknown_user_has_no_neighbours(data: np.ndarray) -> None:
    index = UserIndex.from_built(build_index(users(data[:100]), BuildSpec(factory="Flat")))
    got = index.neighbors(np.array([11, 10]), 3)  # 11 is not an id (ids are 10 + 3i)
    assert (got.user_ids[0] == -1).all() and (got.user_ids[1] >= 0).all()


def test_newest_row_per_user_wins(data: np.ndarray) -> None:
    old = users(data[:10], computed_at_ms=1_000)
    new = users(data[10:20], computed_at_ms=2_000)
    kept = UserVectors.concat([new, old], DIM).newest_per_user()
    np.testing.assert_array_equal(kept.vectors, data[10:20])


def test_mixed_model_versions_are_refused(data: np.ndarray) -> None:
    mixed = UserVectors.concat([users(data[:10]), users(data[10:20], version="other")], DIM)
    mixed = mixed.take(np.r_[0:10, 10:20])
    mixed = UserVectors(np.arange(20), mixed.vectors, mixed.computed_at_ms, mixed.model_version)
    with pytest.raises(ConfigError, match="2 model versions"):
        build_index(mixed)


def test_array_checks_name_expected_and_actual() -> None:
    with pytest.raises(TypeError, match=r"expected shape \(N, 16\), got \(3, 8\)"):
        as_vectors(np.zeros((3, 8), np.float32), 16)
    with pytest.raises(TypeError, match=r"expected dtype float32.*got int64"):
        as_vectors(np.zeros((3, 16), np.int64), 16)
    with pytest.raises(TypeError, match="got list"):
        as_vectors([[0.0] * 16], 16)


def test_shard_bounds_cover_every_position_once() -> None:
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 5) == [(0, 1), (1, 2)]
    assert shard_bounds(0, 4) == [(0, 0)]


def test_gpu_auto_uses_the_gpu_copy_when_faiss_reports_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(ops.faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(ops.faiss, "get_num_gpus", lambda: 1)

    def fake_to_gpu(index: object) -> object:
        calls.append("to_gpu")
        return index

    monkeypatch.setattr(ops.faiss, "index_cpu_to_all_gpus", fake_to_gpu, raising=False)
    index, on_gpu = ops.to_gpu(ops.new_index("Flat", DIM, "ip"), "auto")
    assert on_gpu and calls == ["to_gpu"]
    assert ops.to_gpu(index, "off") == (index, False)


@pytest.mark.skipif(
    hasattr(ops.faiss, "StandardGpuResources") and ops.faiss.get_num_gpus() > 0, reason="faiss sees a GPU here"
)
def test_gpu_auto_stays_on_cpu_without_gpu_support() -> None:
    assert ops.gpu_count("auto") == 0
    index = ops.new_index("Flat", DIM, "ip")
    assert ops.to_gpu(index, "auto") == (index, False)


@pytest.mark.parametrize("name", ["../other/index.faiss", "/etc/passwd", "..", "sub/index.faiss", ""])
def test_a_manifest_cannot_name_files_outside_its_folder(tmp_path: Path, data: np.ndarray, name: str) -> None:
    import json

    write_built(build_index(users(data), BuildSpec(factory="Flat")), tmp_path / "idx")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.faiss").write_bytes((tmp_path / "idx" / "index.faiss").read_bytes())
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    manifest["files"] = [name]
    (tmp_path / "idx" / "manifest.json").write_text(json.dumps(manifest))
    commit_folder(str(tmp_path / "idx"), holds="an index")  # a committed, hostile manifest: the path check must hold
    with pytest.raises(ConfigError, match="outside its folder"):
        UserIndex.load(tmp_path / "idx", gpu="off")
