"""Secrets: a Dataflow dry run given a SASL password and a Redis password writes
neither into any file (``dataflow_job/pipeline.pb`` held the SASL password in a pickled DoFn), and
prints neither. Workers read both from their environment (GEM_KAFKA_SASL_PASSWORD, GEM_REDIS_PASSWORD,
or the ``*_FILE`` secret files)."""

from __future__ import annotations

import base64
import bz2
import contextlib
import os
import pickle
import re
import zlib
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.io.kafka.config import KafkaConnection
from tests.fixtures.kafka import SASL_PASSWORD, SASL_USER, MakeTopic, produce
from tests.precompute.conftest import World
from tests.runners.test_dataflow import DATAFLOW

pytestmark = pytest.mark.integration
REDIS_SECRET = "planted-redis-secret-7f3a"


def _unpacked(data: bytes) -> list[bytes]:
    """``data`` and what Beam packs into a job graph: pickled DoFns and elements are compressed (bz2 or
    zlib), then base64-encoded (``apache_beam.internal.pickler``), so a plain grep would see nothing."""
    found = [data]
    for run in re.findall(rb"[A-Za-z0-9+/]{24,}={0,2}", data):
        try:
            found.append(base64.b64decode(run + b"=" * (-len(run) % 4)))
        except ValueError:
            continue
    for blob in list(found):
        if blob.startswith(b"BZh"):
            with contextlib.suppress(OSError, ValueError):
                found.append(bz2.decompress(blob))
    for blob in list(found):
        for start in (i for i in range(len(blob) - 1) if blob[i] == 0x78 and blob[i + 1] in (0x01, 0x5E, 0x9C, 0xDA)):
            try:
                found.append(zlib.decompressobj().decompress(blob[start:]))
            except zlib.error:
                continue
    return found


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` that holds ``secret``: raw, as UTF-16 (as Java would write it), or inside
    a base64 / zlib payload of a job graph."""
    needles = (secret.encode(), secret.encode("utf-16-le"))
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and any(n in blob for blob in _unpacked(p.read_bytes()) for n in needles)
    ]


def test_the_grep_sees_into_a_pickled_dofn() -> None:
    """The check below can fail: a DoFn holding the secret, packed as Beam packs it, is found."""
    from apache_beam.internal import pickler

    packed = pickler.dumps({"password": REDIS_SECRET})
    assert REDIS_SECRET.encode() not in packed and any(REDIS_SECRET.encode() in b for b in _unpacked(packed))


def test_a_kafka_connection_pickles_without_its_password(
    kafka_sasl: KafkaConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEM_KAFKA_SASL_PASSWORD", raising=False)
    shipped = pickle.dumps(kafka_sasl)
    assert SASL_PASSWORD.encode() not in shipped
    on_worker = pickle.loads(shipped)
    assert on_worker.sasl_password is None and on_worker.sasl_username == SASL_USER
    monkeypatch.setenv("GEM_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
    assert on_worker.kafka_python()["sasl_plain_password"] == SASL_PASSWORD


def test_a_worker_reads_the_sasl_password_from_a_secret_file(
    kafka_sasl: KafkaConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEM_KAFKA_SASL_PASSWORD", raising=False)
    secret = tmp_path / "sasl-password"
    secret.write_text(SASL_PASSWORD + "\n")
    monkeypatch.setenv("GEM_KAFKA_SASL_PASSWORD_FILE", str(secret))
    assert pickle.loads(pickle.dumps(kafka_sasl)).librdkafka()["sasl.password"] == SASL_PASSWORD


def test_dataflow_dry_run_writes_no_sasl_password(
    kafka_sasl: KafkaConnection,
    kafka: KafkaConnection,
    make_topic: MakeTopic,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The password given on the command line, the worst case (``ps`` shows it: the env var is better)."""
    monkeypatch.delenv("GEM_KAFKA_SASL_PASSWORD", raising=False)
    topic = make_topic(2)
    produce(kafka, topic, [b'{"event_id": "e1", "user_id": 1}', b"not json"])
    out = tmp_path / "replay"
    sasl = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", SASL_USER]
    argv = ["replay", "--topic", topic, "--output", str(out), "--bootstrap-servers", kafka_sasl.bootstrap, *sasl]
    assert main([*argv, "--sasl-password", SASL_PASSWORD, *DATAFLOW]) == 0
    printed = capsys.readouterr()
    assert (out / "dataflow_job" / "pipeline.pb").stat().st_size > 1000
    graph = _unpacked((out / "dataflow_job" / "pipeline.pb").read_bytes())
    assert any(SASL_USER.encode() in blob for blob in graph)  # the connection is in it, without the password
    assert files_holding(tmp_path, SASL_PASSWORD) == []
    assert SASL_PASSWORD not in printed.out + printed.err
    assert "GEM_KAFKA_SASL_PASSWORD" not in os.environ  # the command left the environment as it found it


def test_dataflow_dry_run_writes_no_redis_password(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEM_REDIS_PASSWORD", raising=False)
    out = tmp_path / "precompute"
    # The project's server has no password, and redis-py's AUTH to it succeeds: the check goes through.
    store = f"redis://:{REDIS_SECRET}@127.0.0.1:16379/0?namespace=test-secrets-{os.getpid()}:"
    base = ["precompute", "--features", str(world.features), "--candidates", str(world.candidates)]
    argv = [*base, "--model", str(world.model), "--output", str(out), "--device", "cpu", "--store", store]
    assert main([*argv, *DATAFLOW]) == 0
    printed = capsys.readouterr()
    graph = _unpacked((out / "dataflow_job" / "pipeline.pb").read_bytes())
    assert any(b"127.0.0.1:16379" in blob for blob in graph)  # the store's URI is in it, without the password
    assert files_holding(tmp_path, REDIS_SECRET) == []
    assert REDIS_SECRET not in printed.out + printed.err


def test_beams_unparseable_args_warning_masks_a_misspelt_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text('{"event_id": "a", "user_id": 1}\n')
    argv = ["features", "--input", str(events), "--output", str(tmp_path / "o"), "--sasl_password", "hunter22"]
    assert main(argv) == 2
    printed = capsys.readouterr()
    assert "hunter22" not in printed.out + printed.err + caplog.text
