"""The helpers of the stream benches (bench/flink_parts.py, bench/stream_flat.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.flink_parts import OwnFlink, cpu_seconds, cpu_used
from bench.stream_flat import events


def test_cpu_used_counts_new_processes_whole_and_gone_ones_up_to_before() -> None:
    before = {"1": 2.0, "2": 5.0, "3": 1.0}  # 3 is gone by the second reading
    after = {"1": 2.5, "2": 7.0, "4": 0.75}  # 4 started in between
    assert cpu_used(before, after) == 0.5 + 2.0 + 0.75


def test_cpu_seconds_reads_this_process_and_leaves_out_a_missing_one() -> None:
    found = cpu_seconds([str(os.getpid()), "999999999"])
    assert list(found) == [str(os.getpid())]
    assert found[str(os.getpid())] > 0


def test_events_are_keyed_by_user_in_order_and_the_same_for_the_same_seed() -> None:
    made = events(range(3), 2, start_ms=1_000, seed=7)
    values = [json.loads(v) for _, v in made]
    assert [k for k, _ in made] == [b"0", b"1", b"2", b"0", b"1", b"2"]
    assert [v["user_id"] for v in values] == [0, 1, 2, 0, 1, 2]
    assert [v["event_time"] for v in values] == list(range(1_000, 1_006))
    assert len({v["event_id"] for v in values}) == 6
    assert [v["item_id"] for v in values] == [json.loads(v)["item_id"] for _, v in events(range(3), 2, 5, seed=7)]


def test_cluster_processes_are_named_after_their_pid_files_and_the_pool_s_children(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "flink-gem-standalonesession.pid").write_text("101\n")
    (run / "flink-gem-taskexecutor.pid").write_text("102\n103\n")
    (run / "jobserver.pid").write_text("104")
    (run / "worker-pool.pid").write_text(str(os.getpid()))  # this process stands in for the pool
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cluster = OwnFlink({}, tmp_path, "127.0.0.1:1")
        named = cluster.processes()
        assert {p: named[p] for p in ("101", "102", "103", "104", str(os.getpid()), str(child.pid))} == {
            "101": "standalonesession",
            "102": "taskexecutor",
            "103": "taskexecutor",
            "104": "jobserver",
            str(os.getpid()): "worker-pool",
            str(child.pid): "sdk-worker",
        }
        work = set(cluster.work_pids())  # other children of this process may be in it too
        assert {"102", "103", str(os.getpid()), str(child.pid)} <= work
        assert not {"101", "104"} & work
    finally:
        child.kill()
        child.wait()
