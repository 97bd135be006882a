"""The commit protocol and the one-writer lock on a real S3-compatible store (the project's S3Proxy)."""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems

from pipelines.errors import OutputLockedError
from pipelines.io.commit import COMMITTED, read_commit, staged_output, writer_lock
from pipelines.io.lease import LOCK_DIR, object_lock
from pipelines.io.objects import delete_object, exists, list_tree
from tests.fixtures.s3 import arrow_s3

pytestmark = pytest.mark.integration


def put(path: str, data: bytes) -> None:
    with FileSystems.create(path) as f:
        f.write(data)


def foreign_claim(output: str, token: str, lease_s: float) -> str:
    """A claim as a writer on another machine would leave it."""
    path = f"{output}/{LOCK_DIR}/{token}.json"
    body = {
        "token": token,
        "pid": 4242,
        "host": "elsewhere",
        "machine": "elsewhere|pid:[1]|boot",
        "started": "2026-12-04T00:00:00+00:00",
        "pid_start": "",
        "command": "python -m pipelines features",
        "lease_s": lease_s,
    }
    put(path, json.dumps(body).encode())
    return path


def test_s3proxy_overwrites_despite_if_none_match(s3_folder: str) -> None:
    """Why the lock is a lease and not a conditional put: S3Proxy 2.6.0 accepts ``If-None-Match: *``
    on an existing key and overwrites it. If this fails, the server honours it now."""
    import boto3
    from botocore.config import Config

    bucket, _, prefix = s3_folder.removeprefix("s3://").partition("/")
    client = boto3.client("s3", config=Config(request_checksum_calculation="when_required"))
    client.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"first", IfNoneMatch="*")
    client.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"second", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key=f"{prefix}/k")["Body"].read() == b"second"


def test_a_run_commits_a_run_folder_that_pyarrow_reads_back(s3_folder: str) -> None:
    out = f"{s3_folder}/snap"
    with staged_output(out, overwrite=False, holds="a test snapshot") as staging:
        assert staging.mode == "manifest" and staging.root == f"{out}/run-{staging.run_id}"
        with FileSystems.create(f"{staging.root}/data/part-0.parquet") as f:
            pq.write_table(pa.table({"x": [1, 2, 3]}), f)
        assert read_commit(out) is None  # nothing is visible before the commit
    manifest = read_commit(out)
    assert manifest is not None and manifest.root == f"run-{staging.run_id}"
    assert [(e.path, e.rows) for e in manifest.files] == [("data/part-0.parquet", 3)]
    assert not [p for p in list_tree(out) if f"/{LOCK_DIR}/" in p]  # the claim went with the run
    fs = arrow_s3()
    table = pq.read_table(f"{out.removeprefix('s3://')}/{manifest.root}/data/part-0.parquet", filesystem=fs)
    assert table.column("x").to_pylist() == [1, 2, 3]


def test_an_overwrite_replaces_the_run_folder_and_drops_the_old_one(s3_folder: str) -> None:
    out = f"{s3_folder}/snap"
    roots = []
    for value in (b"one", b"two"):
        with staged_output(out, overwrite=True, holds="a test snapshot") as staging:
            put(f"{staging.root}/v.txt", value)
        roots.append(staging.root)
    assert read_commit(out).root == roots[1].rsplit("/", 1)[1]  # type: ignore[union-attr]
    assert sorted(list_tree(out)) == [f"{out}/{COMMITTED}", f"{roots[1]}/v.txt"]


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(s3_folder: str) -> None:
    out = f"{s3_folder}/snap"
    with writer_lock(out):
        with pytest.raises(OutputLockedError, match=f"being written right now by pid {os.getpid()} "):
            with writer_lock(out):
                pass
    with writer_lock(out):  # released: the next writer gets it
        pass


def test_a_live_claim_from_another_machine_refuses_and_an_expired_one_is_taken_over(s3_folder: str) -> None:
    held, expiring = f"{s3_folder}/held", f"{s3_folder}/expiring"
    foreign_claim(held, "other-live", lease_s=3600)
    with pytest.raises(OutputLockedError, match="pid 4242 on elsewhere"):
        with object_lock(held, "--output"):
            pass
    stale = foreign_claim(expiring, "other-stale", lease_s=1)
    deadline = time.monotonic() + 60
    while True:  # the store's clock must pass the claim's lease; poll, bounded
        try:
            with object_lock(expiring, "--output"):
                break
        except OutputLockedError:
            assert time.monotonic() < deadline, "an expired claim was never taken over"
            time.sleep(0.5)
    assert stale not in list_tree(expiring)  # the dead claim was removed


def test_a_writer_that_lost_its_lock_never_commits(s3_folder: str) -> None:
    out = f"{s3_folder}/snap"
    with pytest.raises(OutputLockedError, match="lost its lock: it is now held by pid 4242"):
        with staged_output(out, overwrite=False, holds="a test snapshot") as staging:
            put(f"{staging.root}/v.txt", b"x")
            for claim in [p for p in list_tree(out) if f"/{LOCK_DIR}/" in p]:
                delete_object(claim)  # as if another writer had judged our lease expired
            foreign_claim(out, "taker", lease_s=3600)
    assert read_commit(out) is None


def test_beams_s3_filesystem_shares_one_client_per_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from apache_beam.io.aws.clients.s3.boto3_client import Client
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.io.objects import share_s3_clients

    share_s3_clients()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    options = PipelineOptions([])
    first, second = Client(options), Client(options)
    assert first.client is second.client and first is not second  # one boto3 client, two download states
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2")
    assert Client(options).client is not first.client  # another configuration, another client


def test_an_s3_path_without_the_s3_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.optional import MissingExtraError

    monkeypatch.setitem(sys.modules, "boto3", None)  # as when it is not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'gem-pipelines\[s3\]'"):
        exists("s3://gem/anything")
