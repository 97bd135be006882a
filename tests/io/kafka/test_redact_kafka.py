"""A Kafka SASL password given on the command line or in the environment is in no stream and no file
the command writes, whether the broker accepts it or refuses it (``replay`` end to end, verbose)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.io.kafka.config import KafkaConnection
from tests.features.factories import line
from tests.fixtures.kafka import SASL_PASSWORD, SASL_PORT_OFFSET, SASL_USER, MakeTopic, produce

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def _replay(kafka: KafkaConnection, topic: str, out: Path, password: str, via_env: bool) -> subprocess.CompletedProcess:
    host, _, port = kafka.bootstrap_servers[0].rpartition(":")
    argv = [
        *(sys.executable, "-m", "pipelines", "-v", "replay", "--topic", topic, "--output", str(out)),
        *("--bootstrap-servers", f"{host}:{int(port) + SASL_PORT_OFFSET}", "--security-protocol", "SASL_PLAINTEXT"),
        *("--sasl-mechanism", "PLAIN", "--sasl-username", SASL_USER),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEM_KAFKA_SASL")}
    if via_env:
        env["GEM_KAFKA_SASL_PASSWORD"] = password
    else:
        argv += ["--sasl-password", password]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _nowhere(secret: str, done: subprocess.CompletedProcess, folder: Path) -> None:
    assert secret not in done.stdout and secret not in done.stderr
    for path in folder.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"{path} holds the password"


@pytest.mark.parametrize("via_env", [False, True])
def test_an_accepted_sasl_password_is_never_printed(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path, via_env: bool
) -> None:
    topic = make_topic(partitions=1)
    produce(kafka, topic, [line(event_id=f"r{i}") for i in range(20)])
    done = _replay(kafka, topic, tmp_path / "out", SASL_PASSWORD, via_env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "replay: 20 messages" in done.stdout
    _nowhere(SASL_PASSWORD, done, tmp_path)


def test_a_refused_sasl_password_is_never_printed(
    kafka: KafkaConnection, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(partitions=1)
    planted = "pw-PLANTED-kafka-91c"
    done = _replay(kafka, topic, tmp_path / "out", planted, via_env=False)
    assert done.returncode != 0
    _nowhere(planted, done, tmp_path)
