"""The candidates job (`solaris`): pairs in the store before the commit, deadlines, skip-if-fresh,
back-pressure, and each pair written once across a SIGKILL and a restart."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.generator import WorldConfig, generate_events, rngs
from pipelines.generator.funnel import FunnelConfig, generate_funnel, stage_rows
from pipelines.io.kafka.candidate_sets import candidate_sets_to_wire
from pipelines.io.kafka.config import KafkaConnection
from pipelines.store import default_redis_cluster_url, open_store
from pipelines.streaming.candidates import CandidatesConfig, CandidatesJob
from pipelines.streaming.pair_work import CandidateWork, WorkQueue, pair_keys, plan_pairs, split_by_deadline
from tests.conftest import require_redis_cluster
from tests.fixtures.kafka import BOOTSTRAP, MakeTopic, produce
from tests.precompute.conftest import World

ROOT = Path(__file__).resolve().parents[2]
SMALL = FunnelConfig(sizes=(120, 30, 8, 2))


def _work(offset: int, user: int, ads: list[int], needed_by_ms: int = 2**50) -> CandidateWork:
    return CandidateWork(0, offset, f"r{offset}", user, 0, 1_000, needed_by_ms, np.asarray(ads, np.int64), 0.0)


def test_work_queue_sheds_the_oldest() -> None:
    q = WorkQueue(3)
    assert q.put([_work(i, 1, [1]) for i in range(2)]) == []
    shed = q.put([_work(i, 1, [1]) for i in range(2, 6)])
    assert [w.offset for w in shed] == [0, 1, 2] and len(q) == 3
    assert [w.offset for w in q.take(10)] == [3, 4, 5] and len(q) == 0


def test_split_by_deadline() -> None:
    work = [_work(0, 1, [1], needed_by_ms=1_000), _work(1, 1, [1], needed_by_ms=2_000)]
    live, late = split_by_deadline(work, now_ms=1_500)
    assert [w.offset for w in live] == [1] and [w.offset for w in late] == [0]
    assert len(split_by_deadline(work, now_ms=1_500, grace_ms=600)[0]) == 2


def _reps(keys: list[tuple[int, int]], watermark_ms: int, computed_at_ms: int) -> pa.Table:
    from pipelines.schemas.layouts import representation_schema

    n = len(keys)
    return pa.table(
        {
            "user_id": [u for u, _ in keys],
            "ad_id": [a for _, a in keys],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(n * 8), pa.float16()), 8),
            "embedding_scale": pa.nulls(n, pa.float32()),
            "p_click": np.full(n, 0.1, np.float32),
            "p_conversion": np.full(n, 0.01, np.float32),
            "model_version": ["m"] * n,
            "history_watermark": pa.array([watermark_ms] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "computed_at": pa.array([computed_at_ms] * n, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        },
        schema=representation_schema(8),
    )


def test_plan_skips_fresh_pairs_and_repeats(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    with open_store(f"lmdb://{tmp_path}/store") as store:
        store.write_batch(_reps([(1, 10), (1, 11), (2, 10)], watermark_ms=5_000, computed_at_ms=now_ms))
        store.write_batch(_reps([(3, 10)], watermark_ms=5_000, computed_at_ms=now_ms - 7_200_000))  # too old
        work = [_work(0, 1, [10, 11, 12]), _work(1, 2, [10, 13]), _work(2, 1, [12, 14]), _work(3, 3, [10])]
        users, ads = pair_keys(work)
        stored = store.read_arrays(users, ads, np.ones(len(users), bool), max_age_s=3_600)
        # user 2 has a newer event than the stored pair saw: recompute; user 1's pairs are current
        plan = plan_pairs(work, stored, {1: 5_000, 2: 6_000}, "m")
    assert (plan.pairs_asked, plan.pairs_fresh, plan.pairs_repeated, plan.pairs_to_compute) == (8, 2, 1, 5)
    rows = plan.requests.to_pylist()
    assert [(r["user_id"], r["ad_ids"]) for r in rows] == [(1, [12]), (2, [10, 13]), (1, [14]), (3, [10])]
    assert rows[1]["request_time"].timestamp() * 1000 == 6_001  # after the user's last event
    assert rows[3]["request_time"].timestamp() * 1000 == 1_000  # no history: the stage time


def test_a_pair_of_another_model_version_is_never_fresh(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    with open_store(f"lmdb://{tmp_path}/store") as store:
        store.write_batch(_reps([(1, 10), (1, 11)], watermark_ms=5_000, computed_at_ms=now_ms))  # model "m"
        work = [_work(0, 1, [10, 11])]
        users, ads = pair_keys(work)
        stored = store.read_arrays(users, ads, np.ones(len(users), bool), max_age_s=3_600)
    assert plan_pairs(work, stored, {1: 5_000}, "m").pairs_fresh == 2
    swapped = plan_pairs(work, stored, {1: 5_000}, "m2")
    assert (swapped.pairs_fresh, swapped.pairs_to_compute) == (0, 2)
    assert swapped.requests["ad_ids"].to_pylist() == [[10, 11]]


# -- against the real broker and an LMDB store (or the Redis Cluster) ----------------------------------------


def _funnel_sets(requests: int, *, config: FunnelConfig = SMALL, seed: int = 5) -> pa.Table:
    """Early-stage candidate sets of the `world` fixture's world (same flags: same events)."""
    generated = generate_events(WorldConfig(users=300, days=5, seed=seed))
    funnel = generate_funnel(generated.world, generated.events, requests, rngs(seed)["funnel"], config)
    return funnel


def _retimed(table: pa.Table, needed_in_s: float) -> pa.Table:
    now = int(time.time() * 1000)
    stamp = pa.timestamp("ms", tz="UTC")
    table = table.set_column(
        table.schema.get_field_index("stage_time"), "stage_time", pa.array([now] * table.num_rows).cast(stamp)
    )
    needed = pa.array([now + int(needed_in_s * 1000)] * table.num_rows).cast(stamp)
    return table.set_column(table.schema.get_field_index("needed_by"), "needed_by", needed)


def _send(kafka: KafkaConnection, topic: str, table: pa.Table) -> None:
    messages = candidate_sets_to_wire(table)
    produce(kafka, topic, [v for _, v in messages], keys=[k for k, _ in messages])


def _config(world: World, topic: str, store: str, **overrides: object) -> CandidatesConfig:
    values: dict = dict(
        topic=topic,
        group=f"g-{uuid.uuid4().hex[:8]}",
        histories=str(world.features),
        model=str(world.model),
        store=store,
        idle_exit_s=1.5,
    )
    return CandidatesConfig(**(values | overrides))


def _all_found(store_uri: str, table: pa.Table) -> np.ndarray:
    return np.isfinite(_computed_at(store_uri, table))


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["lmdb", "redis-cluster"])
def test_job_writes_pairs_drops_late_sets_and_skips_fresh_ones(
    kafka: KafkaConnection, make_topic: MakeTopic, world: World, tmp_path: Path, backend: str
) -> None:
    funnel = _funnel_sets(18)
    early = stage_rows(funnel, "early")
    live, late = _retimed(early.slice(0, 10), 3_600), _retimed(early.slice(10, 5), -60)
    others = _retimed(stage_rows(funnel, "late").slice(0, 3), 3_600)
    topic, store = make_topic(partitions=2), f"lmdb://{tmp_path}/store"
    if backend == "redis-cluster":
        store = f"{default_redis_cluster_url()}?namespace=gem-test:{uuid.uuid4().hex}:"
        require_redis_cluster(store)
    _send(kafka, topic, pa.concat_tables([live, late, others]))
    produce(kafka, topic, [b"{not json"])
    job = CandidatesJob(kafka, _config(world, topic, store, dead_letters=str(tmp_path / "dl")))
    counts = job.run()
    dead = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "dl" / "dead_letters").glob("*.parquet")))
    assert dead["reason"].to_pylist() == ["bad_json"] and dead["payload"].to_pylist() == [b"{not json"]
    assert (counts.requests_done, counts.deadline_dropped, counts.other_stage, counts.dead_letters) == (10, 5, 3, 1)
    assert sum(counts.committed.values()) == 19  # everything is done, so everything is committed
    assert _all_found(store, live).all()
    asked = sum(len(a) for a in live["ad_ids"].to_pylist())
    assert counts.pairs_computed + counts.pairs_repeated == asked and counts.pairs_fresh == 0
    assert job.metrics.value("gem_deadline_dropped_total") == 5
    assert job.metrics.value("gem_pairs_total", outcome="late") == sum(len(a) for a in late["ad_ids"].to_pylist())
    assert job.metrics.value("gem_dead_letters_total", reason="bad_json") == 1
    # the same sets again (another group): every pair is fresh in the store, nothing is computed
    again = CandidatesJob(kafka, _config(world, topic, store)).run()
    assert again.pairs_computed == 0 and again.pairs_fresh + again.pairs_repeated == asked


@pytest.mark.integration
def test_after_a_model_swap_every_pair_is_computed_again_by_the_new_model(
    kafka: KafkaConnection, make_topic: MakeTopic, world: World, tmp_path: Path
) -> None:
    import torch

    from pipelines.model import GemModel, load_model, save_checkpoint

    old = load_model(world.model, device="cpu")
    torch.manual_seed(1)
    new_dir = tmp_path / "model-2"
    save_checkpoint(GemModel(old.config), new_dir)
    new_version = load_model(new_dir, device="cpu").model_version
    assert new_version != old.model_version
    sets = _retimed(stage_rows(_funnel_sets(12), "early").slice(0, 6), 3_600)
    topic, store = make_topic(partitions=1), f"lmdb://{tmp_path}/store"
    _send(kafka, topic, sets)
    asked = sum(len(a) for a in sets["ad_ids"].to_pylist())
    first = CandidatesJob(kafka, _config(world, topic, store)).run()
    assert first.pairs_fresh == 0 and first.pairs_computed > 0
    swapped = CandidatesJob(kafka, _config(world, topic, store, model=str(new_dir))).run()
    # the old model's pairs are not this model's: none is fresh, none counts as compute saved
    assert swapped.pairs_fresh == 0 and swapped.pairs_computed + swapped.pairs_repeated == asked
    assert set(_versions(store, sets)) == {new_version}  # the store now serves the new model's pairs
    again = CandidatesJob(kafka, _config(world, topic, store, model=str(new_dir))).run()
    assert again.pairs_computed == 0 and again.pairs_fresh + again.pairs_repeated == asked


@pytest.mark.integration
def test_overload_sheds_the_oldest_sets_and_commits_them(
    kafka: KafkaConnection, make_topic: MakeTopic, world: World, tmp_path: Path
) -> None:
    sets = _retimed(stage_rows(_funnel_sets(40), "early"), 3_600)
    topic, store = make_topic(partitions=1), f"lmdb://{tmp_path}/store"
    _send(kafka, topic, sets)
    job = CandidatesJob(kafka, _config(world, topic, store, queue_size=4, batch_requests=1))
    counts = job.run()
    assert counts.shed > 0 and counts.shed + counts.requests_done == 40
    assert counts.committed == {0: 40}
    assert job.metrics.value("gem_work_shed_total") == counts.shed
    assert job.metrics.value("gem_pairs_total", outcome="shed") > 0  # every pair asked for has an outcome:
    assert job.metrics.value("gem_pairs_total") == sum(len(a) for a in sets["ad_ids"].to_pylist())
    found = _all_found(store, sets.slice(39, 1))
    assert found.all()  # the newest set was kept and computed
    assert not _all_found(store, sets.slice(0, 1)).all()  # the oldest was shed


@pytest.mark.integration
def test_sigkill_and_restart_write_each_pair_once(
    kafka: KafkaConnection, make_topic: MakeTopic, world: World, tmp_path: Path
) -> None:
    sets = _retimed(stage_rows(_funnel_sets(80, config=FunnelConfig()), "early"), 3_600)
    topic, store = make_topic(partitions=2), f"lmdb://{tmp_path}/store"
    _send(kafka, topic, sets)
    group = f"g-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, "-m", "pipelines", "solaris", "--topic", topic, "--group", group,
        "--histories", str(world.features), "--model", str(world.model), "--store", store,
        "--batch-requests", "1", "--bootstrap-servers", BOOTSTRAP,
    ]  # fmt: skip
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=open(tmp_path / "job.log", "wb"))
    deadline = time.time() + 180
    total = sum(len(a) for a in sets["ad_ids"].to_pylist())
    found = np.zeros(total, bool)
    while found.sum() < total // 4 and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
        if Path(tmp_path / "store").exists():
            found = _all_found(store, sets)
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    before = _computed_at(store, sets)
    log = (tmp_path / "job.log").read_text()[-3000:]
    assert 0 < np.isfinite(before).sum() < len(before), f"killed before any write or after the last one: {log}"
    done = subprocess.run([*command, "--idle-exit", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _computed_at(store, sets)
    assert np.isfinite(after).all()  # nothing lost
    written = np.isfinite(before)
    assert np.array_equal(after[written], before[written])  # nothing written twice
    committed = ast.literal_eval(done.stdout.rsplit("committed ", 1)[1].strip())
    assert sum(committed.values()) == sets.num_rows  # the restart finished and committed everything


def _versions(store_uri: str, table: pa.Table) -> list[str | None]:
    users = np.repeat(table["user_id"].to_numpy(), [len(a) for a in table["ad_ids"].to_pylist()])
    ads = np.concatenate([np.asarray(a, np.int64) for a in table["ad_ids"].to_pylist()])
    with open_store(store_uri) as store:
        return list(store.read_arrays(users, ads, np.ones(len(users), bool)).model_version)


def _computed_at(store_uri: str, table: pa.Table) -> np.ndarray:
    users = np.repeat(table["user_id"].to_numpy(), [len(a) for a in table["ad_ids"].to_pylist()])
    ads = np.concatenate([np.asarray(a, np.int64) for a in table["ad_ids"].to_pylist()])
    with open_store(store_uri) as store:
        got = store.read_arrays(users, ads, np.ones(len(users), bool))
    return np.where(got.found, got.computed_at_ms, np.nan)
