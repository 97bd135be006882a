"""Errors instead of tracebacks: each case could end in a traceback (or a wrong exit 0) if flags were
not checked first; flags are checked before work and the CLI's top-level handler turns the known failure
classes into one ``error: ... Fix: ...`` line with exit 2."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.cli.failures import explain
from pipelines.io.kafka.config import KafkaConnection
from tests.fixtures.kafka import SASL_USER
from tests.recovery.conftest import World
from tests.recovery.crash import record, refused, short

ROOT = Path(__file__).resolve().parents[2]


def usage_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """A flag refused by the parser: exit 2 and the fix, before any work."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2, argv
    err = capsys.readouterr().err
    assert "Fix:" in err and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_train_learning_rate_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    err = refused(["train", "--features", str(tmp_path), "--output", str(out), "--learning-rate", "nan"], capsys)
    assert err.startswith("error: --learning-rate: got nan") and not out.exists()
    record("train --learning-rate nan", short(err))


def test_train_positive_share_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    err = refused(["train", "--features", str(tmp_path), "--output", str(out), "--positive-share", "2"], capsys)
    assert err.startswith("error: --positive-share: got 2.0") and not out.exists()
    record("train --positive-share 2", short(err))


SOLARIS = ["solaris", "--topic", "t", "--candidates-topic", "c", "--group", "g", "--output", "o", "--model", "m"]
SOLARIS += ["--store", "lmdb:///s"]
STREAM = ["stream", "--topic", "t", "--group", "g", "--output", "o"]


@pytest.mark.parametrize("port", ["-1", "70000", "99999", "http"])
@pytest.mark.parametrize("command", [SOLARIS, STREAM], ids=["solaris", "stream"])
def test_metrics_port_out_of_range(command: list[str], port: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_refused([*command, "--metrics-port", port], capsys)
    assert "--metrics-port" in err and "1..65535" in err
    record(f"{command[0]} --metrics-port {port}", short(err))


@pytest.mark.parametrize("command", [SOLARIS, STREAM], ids=["solaris", "stream"])
def test_metrics_port_in_use(
    command: list[str], busy_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any input is read or any store opened (the store's folder is never created)."""
    argv = [a.replace("lmdb:///s", f"lmdb://{tmp_path}/store") for a in command]
    argv[argv.index("--output") + 1] = str(tmp_path / "out")
    err = refused([*argv, "--metrics-port", str(busy_port)], capsys)
    assert f"port {busy_port} is in use" in err and not (tmp_path / "store").exists()
    record(f"{command[0]} --metrics-port (in use)", short(err))


@pytest.mark.integration
def test_precompute_candidates_given_a_histories_file(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    histories = sorted((world.features / "histories").rglob("*.parquet"))[0]
    argv = ["precompute", "--features", str(world.features), "--candidates", str(histories)]
    err = refused([*argv, "--model", str(world.model), "--output", str(tmp_path / "r"), "--device", "cpu"], capsys)
    assert "--candidates" in err and "ad_ids" in err and not (tmp_path / "r").exists()
    record("precompute --candidates <a histories file>", short(err))


def test_inspect_etc_passwd(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["inspect", "/etc/passwd"], capsys)
    assert "not a Parquet file" in err
    record("inspect /etc/passwd", short(err))


@pytest.mark.integration
def test_produce_num_partitions_100000(
    kafka: KafkaConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text('{"event_id": "a", "user_id": 1}\n')
    topic = f"test-partitions-{uuid.uuid4().hex[:12]}"
    argv = ["produce", "--input", str(events), "--topic", topic, "--bootstrap-servers", kafka.bootstrap]
    err = refused([*argv, "--num-partitions", "100000", "--no-progress"], capsys)
    assert err.startswith("error: --num-partitions: the cluster refused")
    record("produce --num-partitions 100000", short(err))


@pytest.mark.integration
@pytest.mark.parametrize("command", ["produce", "replay", "solaris"])
def test_a_wrong_sasl_password_is_an_auth_failure(
    command: str,
    world: World,
    kafka_sasl: KafkaConnection,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was reported as "cannot reach Kafka"."""
    monkeypatch.setenv("GEM_KAFKA_SASL_PASSWORD", "not-the-password")
    argv = {
        "produce": ["produce", "--input", str(world.events), "--topic", "unused"],
        "replay": ["replay", "--topic", "unused", "--output", str(tmp_path / "o")],
        "solaris": _solaris(world, tmp_path),
    }[command]
    sasl = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", SASL_USER]
    err = refused([*argv, "--bootstrap-servers", kafka_sasl.bootstrap, *sasl], capsys)
    assert "authentication failed" in err and "cannot reach" not in err and "not-the-password" not in err
    record(f"{command} with a wrong SASL password", short(err))


def _solaris(world: World, tmp_path: Path) -> list[str]:
    """``solaris`` with every input real but the broker's."""
    argv = [*SOLARIS[:7], "--output", str(tmp_path / "o"), "--model", str(world.model)]
    return [*argv, "--store", f"lmdb://{tmp_path}/store"]


@pytest.mark.integration
def test_solaris_with_no_broker_names_it(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = f"127.0.0.1:{_closed_port()}"
    err = refused([*_solaris(world, tmp_path), "--bootstrap-servers", server], capsys)
    assert f"cannot reach Kafka at {server}" in err and "make kafka-up" in err
    record("solaris with no broker", short(err))


@pytest.mark.parametrize("rate", ["nan", "inf", "-1"])
def test_produce_rate_not_a_rate(rate: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["produce", "--input", str(tmp_path / "e.jsonl"), "--topic", "unused", "--rate", rate]
    err = usage_refused(argv, capsys)
    assert "--rate" in err
    record(f"produce --rate {rate}", short(err))


def test_solaris_torch_threads_0(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*SOLARIS, "--torch-threads", "0"], capsys)
    assert err.startswith("error: --torch-threads: got 0")
    record("solaris --torch-threads 0", short(err))


def test_replay_from_latest_to_earliest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before Kafka is asked (it read 0 messages and exited 0)."""
    argv = ["replay", "--topic", "t", "--bootstrap-servers", f"127.0.0.1:{_closed_port()}"]
    err = refused([*argv, "--from", "latest", "--to", "earliest", "--output", str(tmp_path / "o")], capsys)
    assert err.startswith("error: --to: --from latest --to earliest ends before it starts")
    record("replay --from latest --to earliest", short(err))


def test_bench_solaris_without_a_broker(capsys: pytest.CaptureFixture[str]) -> None:
    """`make bench B=solaris` with no broker: the bench's first call names `make kafka-up`."""
    from bench.common import kafka_connection

    with pytest.raises(SystemExit) as exited:
        kafka_connection(f"127.0.0.1:{_closed_port()}")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "make kafka-up" in err and "Fix:" in err
    record("make bench B=solaris (no broker)", short(err.strip()))


def test_the_docs_deadline_grace_examples_parse() -> None:
    """Every `--deadline-grace X` in the README and the docs is a value the flag takes (1e10 was not)."""
    from pipelines.cli.flags import duration

    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    values = [m for path in texts if path.exists() for m in re.findall(r"--deadline-grace[ =](\S+)", path.read_text())]
    for value in values:
        assert duration(value.strip("`'\",)")) > 0, value
    with pytest.raises(Exception, match="not a duration"):
        duration("1e10")


def test_the_handler_names_each_known_failure_class() -> None:
    """Unit level: the classes as Beam hands them over (the original, or its text inside another)."""
    full = OSError(errno.ENOSPC, "No space left on device", "/data/out/part-0.parquet")
    message = str(explain(full))
    assert message.startswith("no space left on ") and "writing /data/out/part-0.parquet. Fix:" in message
    wrapped = RuntimeError("step failed: OSError: [Errno 28] No space left on device")
    assert "writing /data/out. Fix:" in str(explain(wrapped, written=["/data/out"]))
    lmdb_full = Exception("mdb_txn_commit: Input/output error")
    assert str(explain(lmdb_full, written=["/data/store"])).startswith("no space left on ")
    denied = PermissionError(errno.EACCES, "Permission denied", "/root/x")
    assert str(explain(denied)).startswith("permission denied on /root/x. Fix:")
    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    assert "Fix: pick a free port" in str(explain(in_use, ports=[9000]))
    assert explain(KeyError("a bug keeps its traceback")) is None


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m pipelines ARGV`` as the unprivileged user ``nobody`` (root may read and write anything)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run a command as an unprivileged user")
    command = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    command += [sys.executable, "-m", "pipelines", *argv]
    env = os.environ | {"HOME": "/tmp", "PYTHONPATH": str(ROOT)}
    return subprocess.run(command, cwd="/tmp", env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder any user may enter (pytest's own tmp folders are private to root), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="gem-permission-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("case", ["read", "write"])
def test_permission_denied(case: str, open_folder: Path) -> None:
    """A file this user may not read, a folder it may not write: one line naming the path and the fix."""
    private = open_folder / "private"
    private.mkdir(mode=0o700)
    (private / "data.parquet").write_bytes(b"PAR1")
    events = open_folder / "e.jsonl"
    events.write_text('{"event_id": "a", "user_id": 1}\n')
    events.chmod(0o644)
    argv = {
        "read": ["inspect", str(private / "data.parquet")],
        "write": ["features", "--input", str(events), "--output", str(private / "features")],
    }[case]
    done = _as_nobody(argv)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert str(private) in last and "Fix:" in last and ("permission denied" in last or "not writable" in last)
    record(f"permission denied ({case})", short(last))
