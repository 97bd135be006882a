"""``stream`` on Flink: it reads whenever its bundles end, and its keyed state, checkpointed by
Flink, survives a SIGKILL of the TaskManager.

Each job runs at parallelism 2 on a Flink cluster of its own, shaped like ``make flink-up``'s
(two TaskManagers of one slot each, an SDK worker pool, a standing job server; the same Flink
home, its own ports, configuration, checkpoints and logs), so killing a TaskManager disturbs no
other job. Mid-topic, after a checkpoint has completed, the
TaskManager is SIGKILLed; a replacement is started (a standalone cluster never restarts
one by itself), Flink restarts the job from its last checkpoint, and once the group has
committed the whole topic the histories must equal a ``replay`` of the same offsets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.flink_parts import OwnFlink, own_flink_missing
from bench.flink_parts import own_flink as own_flink_cluster
from pipelines.io.kafka.config import KafkaConnection
from pipelines.store.redis_store import default_redis_url
from pipelines.streaming.state import latest_histories
from tests.conftest import require_redis
from tests.fixtures.kafka import MakeTopic, produce
from tests.streaming.streams import (
    committed,
    generate,
    keyed,
    replay,
    same_histories,
    skewed,
    stream_cmd,
    trickle,
    wait_for_a_commit,
)
from tests.streaming.test_stream_refresh import assert_store_equals_precompute, world_with_model

pytestmark = pytest.mark.integration


@pytest.fixture
def own_flink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnFlink]:
    missing = own_flink_missing()
    if missing:
        pytest.fail(f"{missing}: run `make flink-up` and `make flink-jobserver`")
    # one slot per TaskManager: a parallelism-2 job has a subtask on each; a killed TaskManager is
    # noticed within seconds, not the default 50 s
    heartbeat = {"FLINK_HEARTBEAT_INTERVAL_MS": "1000", "FLINK_HEARTBEAT_TIMEOUT_MS": "10000"}
    with own_flink_cluster(tmp_path_factory.mktemp("own-flink"), slots=1, **heartbeat) as cluster:
        yield cluster


def _flink_args(cluster: OwnFlink, checkpoint_ms: int = 2000, parallelism: int = 2) -> list[str]:
    return [
        "--runner=FlinkRunner",
        f"--flink_master={cluster.rest}",
        f"--parallelism={parallelism}",
        f"--checkpointing_interval={checkpoint_ms}",  # restarts: Flink's default strategy with checkpoints on
        "--experiments=disable_logging_submission_environment",
    ]


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``stream`` in a session of its own (its job server JVM too), stderr to ``log``."""
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)


def _stop(job: subprocess.Popen[bytes]) -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)


def _finish(job: subprocess.Popen[bytes], log: Path, cluster: OwnFlink, timeout: float) -> int:
    """The job's exit status; past ``timeout``, a failure that shows where it hangs: the driver's
    thread stacks (SIGUSR1, faulthandler) and log, and the cluster's jobs with their exceptions."""
    try:
        return job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(job.pid, signal.SIGUSR1)
        time.sleep(2)
        jobs = cluster.get("/jobs/overview")["jobs"]
        failures = {j["jid"]: cluster.get(f"/jobs/{j['jid']}/exceptions").get("root-exception") for j in jobs}
        tail = log.read_text()[-8000:]
        pytest.fail(
            f"stream still running after {timeout} s; exceptions {failures}\n"
            f"{cluster.diagnosis()}\n--- the driver's log:\n{tail}"
        )


def _running_job(cluster: OwnFlink, job: subprocess.Popen[bytes], log: Path, deadline: float) -> str:
    while True:
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no running Flink job"
        running = [j["jid"] for j in cluster.get("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        if running:
            return str(running[0])
        time.sleep(1)


def test_stream_on_flink_reads_although_every_bundle_ends_at_a_checkpoint(
    kafka: KafkaConnection, make_topic: MakeTopic, own_flink: OwnFlink, tmp_path: Path
) -> None:
    """The start-up stall, made certain: bundles that end only at checkpoints (200 ms apart, bundles
    of up to 10 minutes). Without ``--finish_bundle_before_checkpointing`` (which ``stream`` sets)
    Create's one output is held in the operator's checkpoint buffer until its next bundle, which
    never comes, and the job reads nothing."""
    lines = generate(tmp_path, 60, seed=37)
    topic, group = make_topic(2, prefix="i17-flink-bundles"), f"i17-g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    flags = [*_flink_args(own_flink, checkpoint_ms=200), "--max_bundle_time_mills=600000"]
    job = _start(stream_cmd(topic, group, out, "--idle-exit", "3", *flags), log)
    try:
        done = _finish(job, log, own_flink, timeout=240)
    finally:
        _stop(job)
    assert done == 0, log.read_text()[-3000:]
    same_histories(latest_histories(str(out)), replay(topic, tmp_path / "batch"))
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)


def test_stream_on_flink_survives_taskmanager_sigkill(
    kafka: KafkaConnection, make_topic: MakeTopic, own_flink: OwnFlink, tmp_path: Path
) -> None:
    lines = generate(tmp_path, 150, seed=31)
    first, second = lines[: len(lines) // 2], lines[len(lines) // 2 :]
    topic, group = make_topic(2, prefix="i17-flink-stream"), f"i17-g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, first, keys=keyed(first))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    cmd = stream_cmd(topic, group, out, "--idle-exit", "5", *_flink_args(own_flink))
    job = _start(cmd, log)

    late = trickle(kafka, topic, second, pause_s=0.5)
    try:
        deadline = time.monotonic() + 300
        jid = _running_job(own_flink, job, log, deadline)
        wait_for_a_commit(kafka, topic, group, 2, job, log, deadline)  # a checkpoint completed and committed
        late.start()
        time.sleep(1.0)
        at_kill = committed(kafka, topic, group, 2)
        os.kill(own_flink.taskmanager_pid(), signal.SIGKILL)  # the TaskManager dies mid-topic ...
        own_flink.sh("up")  # ... and a replacement registers its 2 slots
        late.join(timeout=120)
        done = _finish(job, log, own_flink, timeout=600)
    finally:
        _stop(job)
    assert done == 0, log.read_text()[-3000:]
    assert 0 < sum(c or 0 for c in at_kill) < len(lines), f"not mid-topic: {at_kill} of {len(lines)}"
    checkpoints = own_flink.get(f"/jobs/{jid}/checkpoints")["counts"]
    assert checkpoints["restored"] >= 1, checkpoints  # Flink restarted the job from a checkpoint
    same_histories(latest_histories(str(out)), replay(topic, tmp_path / "batch"))
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)


@pytest.mark.parametrize("flush", ["0.3", "0"])  # a timer per slot; each arrival merged at once
def test_stream_on_flink_a_skewed_topic_equals_replay_and_the_refresh_equals_precompute(
    kafka: KafkaConnection, make_topic: MakeTopic, own_flink: OwnFlink, tmp_path: Path, flush: str
) -> None:
    """One user holds a tenth of the events (a Zipf head: one key, one subtask); the refresh runs
    inside the graph on Flink and writes what the batch ``precompute`` computes. Flushed on arrival,
    the hot user is often flushed twice in one bundle."""
    base = default_redis_url()
    require_redis(base)
    store = f"{base}?namespace=gem-test:{uuid.uuid4().hex}:"
    lines, candidates, model = world_with_model(tmp_path)
    lines = skewed(lines)
    topic, group = make_topic(2, prefix="i26-flink-skew"), f"i26-g-{uuid.uuid4().hex[:8]}"
    produce(kafka, topic, lines, keys=keyed(lines))
    out, log = tmp_path / "stream", tmp_path / "stream.log"
    refresh = ["--model", str(model), "--store", store, "--candidates", str(candidates), "--candidate-ttl", "3600"]
    refresh += ["--flush-interval", flush]
    job = _start(stream_cmd(topic, group, out, "--idle-exit", "3", *refresh, *_flink_args(own_flink)), log)
    try:
        done = _finish(job, log, own_flink, timeout=400)
    finally:
        _stop(job)
    assert done == 0, log.read_text()[-3000:]
    streamed = latest_histories(str(out))
    assert 999_999 in streamed.column("user_id").to_pylist()
    assert sum(c or 0 for c in committed(kafka, topic, group, 2)) == len(lines)
    same_histories(streamed, assert_store_equals_precompute(tmp_path, topic, store, candidates, model))


def _committed_all(kafka: KafkaConnection, topic: str, group: str, records: int) -> bool:
    return sum(c or 0 for c in committed(kafka, topic, group, 2)) == records


def _stop_with_savepoint(cluster: OwnFlink, jid: str, target: Path, deadline: float) -> str:
    """Flink's stop-with-savepoint (REST ``POST /jobs/<jid>/stop``, no drain): the savepoint's path."""
    trigger = cluster.post(f"/jobs/{jid}/stop", {"targetDirectory": str(target), "drain": False})["request-id"]
    while True:
        answer = cluster.get(f"/jobs/{jid}/savepoints/{trigger}")
        if answer["status"]["id"] == "COMPLETED":
            assert "location" in answer["operation"], answer  # else a failure-cause
            return str(answer["operation"]["location"])
        assert time.monotonic() < deadline, f"no savepoint in time: {answer}"
        time.sleep(0.5)


def _restored_from(cluster: OwnFlink, jid: str) -> Any:
    return cluster.get(f"/jobs/{jid}/checkpoints")["latest"]["restored"]


def _hide_flush_files(out: Path, hidden: Path) -> None:
    """Move the flush files aside: a restarted job then finds a user's earlier events only in the
    keyed state it restored, never in the files (:class:`pipelines.streaming.keyed.FirstSight`)."""
    for f in (out / "histories").glob("shard=*/*.parquet"):
        (hidden / f.parent.name).mkdir(parents=True, exist_ok=True)
        f.rename(hidden / f.parent.name / f.name)


def _unhide(hidden: Path, out: Path) -> None:
    for f in hidden.glob("shard=*/*.parquet"):
        (out / "histories" / f.parent.name).mkdir(parents=True, exist_ok=True)
        f.rename(out / "histories" / f.parent.name / f.name)


def test_stream_on_flink_savepoint_and_restart_at_parallelism_2_1_2_keeps_every_history(
    kafka: KafkaConnection, make_topic: MakeTopic, own_flink: OwnFlink, tmp_path: Path
) -> None:
    """A third of the topic at parallelism 2, stop with a savepoint; restart from it at 1 on the next
    third, stop with a savepoint; restart at 2 on the rest and finish. Before each restart the flush
    files are moved aside, so a user's earlier events can reach the rows written after it only
    through the restored keyed state: with the files put back, the histories equal a ``replay``."""
    lines = generate(tmp_path, 80, seed=43)
    cut = len(lines) // 3
    parts = [lines[:cut], lines[cut : 2 * cut], lines[2 * cut :]]
    topic, group = make_topic(2, prefix="i26-flink-rescale"), f"i26-g-{uuid.uuid4().hex[:8]}"
    out, hidden, savepoints = tmp_path / "stream", tmp_path / "hidden", tmp_path / "savepoints"
    savepoint: str | None = None
    users_by_run: list[set[int]] = []
    for run, (parallelism, part) in enumerate(zip((2, 1, 2), parts, strict=True)):
        produce(kafka, topic, part, keys=keyed(part))
        flags = _flink_args(own_flink, parallelism=parallelism)
        last = run == len(parts) - 1
        if savepoint is not None:
            flags.append(f"--savepoint_path={savepoint}")
        log = tmp_path / f"stream-{run}.log"
        job = _start(stream_cmd(topic, group, out, *(["--idle-exit", "3"] if last else []), *flags), log)
        try:
            deadline = time.monotonic() + 300
            jid = _running_job(own_flink, job, log, deadline)
            if savepoint is not None:
                restored = _restored_from(own_flink, jid)
                assert restored and restored["is_savepoint"], restored
                assert restored["external_path"] == savepoint, restored
            if not last:  # everything produced so far is flushed: then stop with a savepoint
                while not _committed_all(kafka, topic, group, sum(map(len, parts[: run + 1]))):
                    assert job.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, f"not committed in time: {committed(kafka, topic, group, 2)}"
                    time.sleep(0.5)
                savepoint = _stop_with_savepoint(own_flink, jid, savepoints, deadline)
            done = _finish(job, log, own_flink, timeout=300)
        finally:
            _stop(job)
        assert done == 0, log.read_text()[-3000:]
        users_by_run.append(set(latest_histories(str(out)).column("user_id").to_pylist()))
        if not last:
            _hide_flush_files(out, hidden)
    assert users_by_run[0] & users_by_run[1] and users_by_run[1] & users_by_run[2]  # state had to carry them
    _unhide(hidden, out)
    same_histories(latest_histories(str(out)), replay(topic, tmp_path / "batch"))
    assert _committed_all(kafka, topic, group, len(lines))
