"""deploy/flink/flinkdeployment.yaml (the Flink Kubernetes Operator's shape of the cluster) parses,
and its parts agree with each other and with what the runner configuration expects. Parsed only:
it is not applied to a live Kubernetes cluster."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pipelines.jobservers import (
    JOB_ENDPOINT_KEY,
    REPO,
    SHARED_PATHS_KEY,
    WORKER_POOL_KEY,
    default_options,
    versions,
)

MANIFEST = REPO / "deploy" / "flink" / "flinkdeployment.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    found = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    by_kind = {d["kind"]: d for d in found}
    assert sorted(by_kind) == ["Deployment", "FlinkDeployment", "PersistentVolumeClaim", "Service"]
    assert len(found) == len(by_kind)
    return by_kind


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def _sidecar(flink: dict[str, Any]) -> dict[str, Any]:
    containers = flink["spec"]["taskManager"]["podTemplate"]["spec"]["containers"]
    (pool,) = [c for c in containers if "apache_beam.runners.worker.worker_pool_main" in c.get("command", [])]
    return pool


def test_state_is_rocksdb_with_incremental_checkpoints_in_a_bucket(docs: dict[str, dict[str, Any]]) -> None:
    spec = docs["FlinkDeployment"]["spec"]
    conf = spec["flinkConfiguration"]
    assert spec["flinkVersion"] == f"v{versions()['FLINK_MINOR'].replace('.', '_')}"
    assert spec["image"] == f"flink:{versions()['FLINK_MINOR']}"
    assert (conf["state.backend.type"], conf["state.backend.incremental"]) == ("rocksdb", "true")
    assert conf["state.backend.rocksdb.compaction.style"] == "UNIVERSAL"
    assert conf["state.checkpoints.dir"].startswith("s3://")
    assert conf["state.savepoints.dir"].startswith("s3://")
    assert spec["taskManager"]["replicas"] == 2


def test_the_sidecar_is_the_worker_pool_the_runner_is_told_of(
    docs: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = docs["FlinkDeployment"]["spec"]["flinkConfiguration"]
    pool = _sidecar(docs["FlinkDeployment"])
    port = int(_flags(pool["command"])["service_port"])
    assert pool["command"][:3] == ["python", "-m", "apache_beam.runners.worker.worker_pool_main"]
    assert [p["containerPort"] for p in pool["ports"]] == [port]
    # the runner, told what this cluster offers, submits to its job server with the sidecar's pool
    offers = {k: str(v) for k, v in conf.items() if k.startswith("gem.beam.")}
    monkeypatch.setattr("pipelines.jobservers.cluster_offers", lambda master: offers)
    found = default_options("FlinkRunner", {"flink_master": "gem-flink-rest:8081"})
    assert found["environment_type"] == "EXTERNAL"
    assert found["environment_config"] == conf[WORKER_POOL_KEY] == f"localhost:{port}"
    assert found["job_endpoint"] == conf[JOB_ENDPOINT_KEY]


def test_the_job_server_serves_this_cluster_where_the_runner_looks(docs: dict[str, dict[str, Any]]) -> None:
    flink, deployment, service = docs["FlinkDeployment"], docs["Deployment"], docs["Service"]
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = _flags(server["args"])
    beam = versions()
    assert server["image"] == f"apache/beam_flink{beam['FLINK_MINOR']}_job_server:{beam['BEAM_FLINK_RUNNER_VERSION']}"
    assert flags["flink-master"] == f"{flink['metadata']['name']}-rest:8081"  # the operator's REST service
    host, port = flink["spec"]["flinkConfiguration"][JOB_ENDPOINT_KEY].split(":")
    assert host == service["metadata"]["name"]
    assert int(port) == int(flags["job-port"]) in {p["port"] for p in service["spec"]["ports"]}
    assert int(flags["artifact-port"]) in {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def test_staged_artifacts_and_local_paths_are_on_the_shared_volume(docs: dict[str, dict[str, Any]]) -> None:
    flink, deployment, claim = docs["FlinkDeployment"], docs["Deployment"], docs["PersistentVolumeClaim"]
    shared = flink["spec"]["flinkConfiguration"][SHARED_PATHS_KEY]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pod = flink["spec"]["taskManager"]["podTemplate"]["spec"]
    server = deployment["spec"]["template"]["spec"]
    for spec in (pod, server):
        assert [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]] == [claim["metadata"]["name"]]
        for container in spec["containers"]:
            assert [m["mountPath"] for m in container["volumeMounts"]] == [shared], container["name"]
    assert _flags(server["containers"][0]["args"])["artifacts-dir"].startswith(f"{shared}/")
