"""The end of a LOOPBACK job logs no traceback: the runner hanging up the SDK harness's
data stream is dropped at its source, and nothing else is."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from pipelines import harness_logs
from pipelines.jobservers import default_flink_jar

ROOT = Path(__file__).resolve().parents[1]


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_only_the_runner_hanging_up_is_taken_for_the_end_of_a_job() -> None:
    assert harness_logs.is_hang_up(_Status(grpc.StatusCode.CANCELLED, harness_logs.HANG_UP))
    assert not harness_logs.is_hang_up(_Status(grpc.StatusCode.CANCELLED, "something else"))
    assert not harness_logs.is_hang_up(_Status(grpc.StatusCode.UNAVAILABLE, harness_logs.HANG_UP))
    assert not harness_logs.is_hang_up(RuntimeError(harness_logs.HANG_UP))
    assert not harness_logs.is_hang_up(None)


def test_only_the_state_reader_losing_its_runner_is_taken_for_the_end_of_a_prism_job() -> None:
    closed = _Status(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
    assert harness_logs.is_state_stream_closed(closed, harness_logs.STATE_READER)
    assert not harness_logs.is_state_stream_closed(closed, "read_grpc_client_inputs")
    assert not harness_logs.is_state_stream_closed(_Status(grpc.StatusCode.UNAVAILABLE, "other"), "read_state")
    assert not harness_logs.is_state_stream_closed(_Status(grpc.StatusCode.CANCELLED, "Socket closed"), "read_state")
    assert not harness_logs.is_state_stream_closed(RuntimeError("Socket closed"), "read_state")
    assert not harness_logs.is_hang_up(closed)


def _raise_in_thread(exc: BaseException, name: str | None = None) -> None:
    def boom() -> None:
        raise exc

    thread = threading.Thread(target=boom, name=name)
    thread.start()
    thread.join()


def test_the_hang_up_is_dropped_from_the_data_plane_log_and_thread_ends_and_others_are_kept(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: ended.append(args.exc_type))
    monkeypatch.setattr(harness_logs, "_installed", False)
    harness_logs.install()
    harness_logs.install()  # once per process, however often called
    plane = logging.getLogger("apache_beam.runners.worker.data_plane")
    for exc in (_Status(grpc.StatusCode.CANCELLED, harness_logs.HANG_UP), ValueError("a real failure")):
        try:
            raise exc
        except Exception:
            plane.exception("Failed to read inputs in the data plane.")
    assert [r.exc_info[1].__class__ for r in caplog.records if r.exc_info] == [ValueError]
    _raise_in_thread(_Status(grpc.StatusCode.CANCELLED, harness_logs.HANG_UP))
    _raise_in_thread(ValueError("a real failure"))
    closed = _Status(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
    _raise_in_thread(closed, harness_logs.STATE_READER)  # Prism's process gone at the job's end
    _raise_in_thread(closed, "some other thread")
    assert ended == [ValueError, _Status]


@pytest.mark.integration
def test_a_loopback_job_on_an_embedded_flink_logs_no_traceback(tmp_path: Path) -> None:
    if not default_flink_jar():
        pytest.fail("no Flink job server jar: run `make flink-jobserver`")
    events = tmp_path / "events.jsonl"
    run = [sys.executable, "-m", "pipelines"]
    generate = [*run, "generate", "--users", "20", "--days", "1", "--seed", "1", "--output", str(events)]
    subprocess.run(generate, check=True, capture_output=True, timeout=120, cwd=ROOT)
    features = [*run, "features", "--input", str(events), "--output", str(tmp_path / "out")]
    done = subprocess.run(
        [*features, "--runner", "FlinkRunner", "--flink_master", "[local]"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "_COMMITTED").exists()
    assert "Traceback" not in done.stderr and harness_logs.HANG_UP not in done.stderr, done.stderr[-3000:]
