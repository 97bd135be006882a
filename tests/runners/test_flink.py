"""Every batch pipeline on the local Flink cluster (``make flink-up``) writes what the local runner writes.

Each goes through a plain ``--runner FlinkRunner --flink_master 127.0.0.1:8081``, as a user runs
it: the cluster's standing job server submits it and its Python work runs in the cluster's SDK
worker pool (``--environment_type EXTERNAL``, see pipelines/jobservers.py). Outputs are compared
as sets of rows (file layout and row order are the runner's business).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from bench.flink_parts import HarnessCpu
from pipelines.cli import main
from pipelines.io.kafka.config import KafkaConnection
from pipelines.jobservers import REPO
from pipelines.similarity.artifact import read_id_map, read_manifest, read_vectors
from tests.fixtures.kafka import MakeTopic, produce
from tests.precompute.conftest import World
from tests.runners.conftest import FLINK, FLINK_MASTER, rows
from tests.similarity.data import T0_MS, clustered, rep_table, write_representations

pytestmark = pytest.mark.integration
KINDS = ("histories", "training_examples", "dead_letters")


ON_FLINK = ["--runner", "FlinkRunner", *FLINK]


def _summary(out: Path) -> dict:
    """A run's summary without what belongs to the run, not the data: its duration and its clock's bound."""
    found = json.loads((out / "summary.json").read_text())
    found.pop("seconds", None)
    found.pop("max_event_time_ms", None)
    return found


def test_features_on_flink_equals_local(flink: str, world: World, tmp_path: Path) -> None:
    base = ["features", "--input", str(world.events), "--num-shards", "4"]
    assert main([*base, "--output", str(tmp_path / "flink"), *ON_FLINK]) == 0
    for kind in KINDS:
        assert rows(tmp_path / "flink", kind) == rows(world.features, kind), kind
    assert _summary(tmp_path / "flink") == _summary(world.features)
    assert len(rows(world.features, "histories")) > 100


def test_features_on_flink_keeps_one_sdk_worker_per_taskmanager(flink: str, world: World, tmp_path: Path) -> None:
    """The runner's classes are on the cluster's classpath (scripts/flink.sh), so it keeps each
    TaskManager's SDK worker for the whole job: every stage of a p=2 job runs in the same 2 worker
    processes of the cluster's pool, not in a new worker per stage (10 for ``features``)."""
    pool = (REPO / ".cache" / "flink" / "run" / "worker-pool.pid").read_text().strip()
    with HarnessCpu(interval_s=0.05) as harness:
        assert main(["features", "--input", str(world.events), "--output", str(tmp_path / "out"), *ON_FLINK]) == 0
    assert len([p for p, parent in harness.parents.items() if parent == pool]) == 2, harness.lines()


def test_local_cluster_keeps_state_in_rocksdb_with_incremental_checkpoints_under_cache(flink: str) -> None:
    """``make flink-up``'s cluster (deploy/flink/config.yaml.in), as its REST API reports it."""
    with urllib.request.urlopen(f"http://{FLINK_MASTER}/jobmanager/config", timeout=10) as answer:
        conf = {e["key"]: str(e["value"]) for e in json.load(answer)}
    assert (conf["state.backend.type"], conf["state.backend.incremental"]) == ("rocksdb", "true")
    assert conf["state.backend.rocksdb.compaction.style"] == "UNIVERSAL"
    for key, leaf in (("state.checkpoints.dir", "checkpoints"), ("state.savepoints.dir", "savepoints")):
        assert conf[key].startswith("file:///") and conf[key].endswith(f"/.cache/flink/{leaf}"), conf[key]


def test_replay_on_flink_equals_local(
    flink: str, kafka: KafkaConnection, make_topic: MakeTopic, world: World, tmp_path: Path
) -> None:
    topic = make_topic(partitions=2)
    assert main(["produce", "--input", str(world.events), "--topic", topic, "--no-progress"]) == 0
    produce(kafka, topic, [b"{not json"], partition=1)
    base = ["replay", "--topic", topic, "--num-shards", "4", "--max-split", "1000"]
    assert main([*base, "--output", str(tmp_path / "local")]) == 0
    assert main([*base, "--output", str(tmp_path / "flink"), *ON_FLINK]) == 0
    for kind in KINDS:
        assert rows(tmp_path / "flink", kind) == rows(tmp_path / "local", kind), kind
    summary = _summary(tmp_path / "flink")
    assert summary == _summary(tmp_path / "local")
    assert (summary["records_in"], summary["dead_letters"]) == (_summary(world.features)["records_in"] + 1, 1)


def test_precompute_on_flink_equals_local(flink: str, world: World, tmp_path: Path) -> None:
    base = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    base += ["--model", str(world.model), "--all-users", "--device", "cpu"]
    assert main([*base, "--output", str(tmp_path / "local")]) == 0
    assert main([*base, "--output", str(tmp_path / "flink"), *ON_FLINK]) == 0
    # Inference batches form per bundle, so a runner's batches differ and floats differ in the last
    # bits of a float16 embedding (matmul order): everything else is equal, the floats close.
    floats = ("embedding", "p_click", "p_conversion")
    local = rows(tmp_path / "local", "representations", drop=("computed_at", *floats))
    assert rows(tmp_path / "flink", "representations", drop=("computed_at", *floats)) == local
    assert len(local) > 300
    a, b = _by_key(tmp_path / "local"), _by_key(tmp_path / "flink")
    assert np.allclose(_embeddings(a), _embeddings(b), rtol=0, atol=4e-3)
    for score in ("p_click", "p_conversion"):
        assert np.allclose(a.column(score).to_numpy(), b.column(score).to_numpy(), rtol=0, atol=1e-4)
    assert _summary(tmp_path / "flink") == _summary(tmp_path / "local")


def _by_key(out: Path) -> pa.Table:
    table = ds.dataset(out / "representations", format="parquet", partitioning="hive").to_table()
    ad = pc.fill_null(table.column("ad_id"), -1)
    return table.append_column("ad_key", ad).sort_by([("user_id", "ascending"), ("ad_key", "ascending")])


def _embeddings(table: pa.Table) -> np.ndarray:
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)


def test_index_on_flink_equals_local(flink: str, tmp_path: Path) -> None:
    vectors = clustered(1200, 16, seed=7)
    users = np.arange(1200)
    tables = [
        rep_table(p.tolist(), [None] * len(p), vectors[p], computed_at_ms=T0_MS) for p in np.array_split(users, 3)
    ]
    reps = write_representations(tmp_path / "reps", tables)
    base = ["index", "--representations", str(reps), "--factory", "IVF16,Flat", "--shards", "2", "--device", "cpu"]
    assert main([*base, "--output", str(tmp_path / "local")]) == 0
    assert main([*base, "--output", str(tmp_path / "flink"), *ON_FLINK]) == 0
    assert np.array_equal(read_id_map(tmp_path / "flink"), read_id_map(tmp_path / "local"))
    assert np.array_equal(read_vectors(tmp_path / "flink"), read_vectors(tmp_path / "local"))
    local, theirs = read_manifest(tmp_path / "local"), read_manifest(tmp_path / "flink")
    assert theirs.tuned_recall_at_10 == local.tuned_recall_at_10
    assert (theirs.count, theirs.search_params, theirs.shards) == (1200, local.search_params, 2)
