"""Precompute into a real Redis Cluster: what it stores equals the Parquet output and the LMDB store's
(looked up through the store and through `lookup`), and a master SIGKILLed mid-run fails over with
every row stored and no reader ever given a wrong record."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.store import (
    OnlineStore,
    RedisClusterConfig,
    RedisClusterStore,
    StoreOptions,
    StoreUnavailableError,
    default_redis_cluster_url,
    open_store,
)
from tests.conftest import require_redis_cluster
from tests.fixtures.redis_cluster import PrivateCluster
from tests.precompute.conftest import World

pytestmark = pytest.mark.integration


class KillingClusterStore(RedisClusterStore):
    """The cluster store, plus a trigger: its second write batch first SIGKILLs the master that serves
    the batch's first key (so the write certainly meets the dead node). ``kill_dir`` holds the
    cluster's state dir (file ``cluster``); the store leaves ``killed`` (the port) and ``retries``."""

    uri_options: ClassVar[tuple[str, ...]] = (*RedisClusterStore.uri_options, "kill_dir")

    @classmethod
    def config_from_uri(cls, uri: str, location: str, options: dict[str, str]) -> Any:
        kill_dir = options.pop("kill_dir")
        return super().config_from_uri(uri, location, options), kill_dir

    def __init__(self, config: Any, options: StoreOptions | None = None, clock: Any = None) -> None:
        cluster_config, kill_dir = config
        super().__init__(cluster_config, options, clock)
        self._kill_dir = Path(kill_dir)

    def _put(self, keys: list[bytes], values: list[bytes], versions: dict[int, str]) -> int:
        if _first(self._kill_dir / "armed") is False and _first(self._kill_dir / "killed") is True:
            from redis.crc import key_slot

            node = self._cluster.nodes_manager.get_node_from_slot(key_slot(self._key(keys[0])))
            state = Path((self._kill_dir / "cluster").read_text())
            PrivateCluster(0, state, "").kill(int(node.port))
            (self._kill_dir / "killed").write_text(str(node.port))
        return super()._put(keys, values, versions)

    def _refresh(self) -> None:
        with open(self._kill_dir / "retries", "a") as f:
            f.write("1\n")
        super()._refresh()


def _first(path: Path) -> bool:
    """True for the one caller (of any thread or process) that creates ``path``."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _precompute(world: World, out: Path, store: str, *extra: str) -> dict:
    args = ["--features", str(world.features), "--candidates", str(world.candidates), "--model", str(world.model)]
    assert main(["precompute", *args, "--output", str(out), "--all-users", "--store", store, *extra]) == 0
    return json.loads((out / "summary.json").read_text())


def _parquet(out: Path) -> pa.Table:
    table = ds.dataset(out / "representations", format="parquet", partitioning="hive").to_table()
    return table.sort_by([("user_id", "ascending"), ("ad_id", "ascending")])


def _keys(table: pa.Table) -> list[tuple[int, int | None]]:
    return list(zip(table.column("user_id").to_pylist(), table.column("ad_id").to_pylist(), strict=True))


def _assert_store_holds(store: OnlineStore, table: pa.Table) -> None:
    """Every row of ``table`` is in ``store``, field for field (the float16 codes bit for bit)."""
    got = store.read_batch(_keys(table))
    assert got.found.all(), f"{int((~got.found).sum())} of {len(got)} rows missing"
    stored = got.to_arrow().drop_columns(["age_s", "stale"])
    assert stored.equals(table.select(stored.column_names).cast(stored.schema))


def _requests(world: World) -> list[tuple[int, list[int]]]:
    candidates = pq.read_table(world.candidates)
    users, ads = candidates.column("user_id").to_pylist(), candidates.column("ad_ids").to_pylist()
    return list(zip(users, ads, strict=True))


class _Reader(threading.Thread):
    """Reads every request (pairs, user record) from the cluster in a loop until stopped; keeps each
    found record's bytes-level fields by key, and the first error."""

    def __init__(self, uri: str, requests: list[tuple[int, list[int]]]) -> None:
        super().__init__(daemon=True)
        self.uri, self.requests = uri, requests
        self.stop = threading.Event()
        self.seen: dict[tuple[int, int | None], tuple[bytes, float, float, str, int]] = {}
        self.error: Exception | None = None
        self.reads = 0

    def run(self) -> None:
        try:
            with open_store(self.uri) as store:
                while not self.stop.is_set():
                    for user, ads in self.requests:
                        got = store.read_for_request(user, ads)
                        self.reads += 1
                        for part in (got.pairs, got.user):
                            for i in np.flatnonzero(part.found).tolist():
                                key = (int(part.user_id[i]), int(part.ad_id[i]) if part.has_ad[i] else None)
                                self.seen[key] = _fields(part, i)
                        if self.stop.is_set():
                            return
        except Exception as exc:  # reported by the test
            self.error = exc


def _fields(part: Any, i: int) -> tuple[bytes, float, float, str, int]:
    return (
        part.codes[i].tobytes(),
        float(part.p_click[i]),
        float(part.p_conversion[i]),
        str(part.model_version[i]),
        int(part.computed_at_ms[i]),
    )


def test_a_master_killed_mid_precompute_fails_over_and_every_row_is_stored(
    world: World, private_cluster: PrivateCluster, tmp_path: Path
) -> None:
    namespace = f"gem-failover:{uuid.uuid4().hex[:8]}:"
    kill_dir = tmp_path / "kill"
    kill_dir.mkdir()
    (kill_dir / "cluster").write_text(str(private_cluster.state))
    plain = private_cluster.uri(namespace, failover_timeout="90s")
    trigger = plain.replace("redis-cluster://", f"{__name__}:KillingClusterStore://") + f"&kill_dir={kill_dir}"
    reader = _Reader(plain, _requests(world))
    reader.start()
    try:
        summary = _precompute(world, tmp_path / "out", trigger)
    finally:
        reader.stop.set()
        reader.join(timeout=120)
    assert (kill_dir / "killed").is_file(), "the trigger never fired: fewer than two write batches?"
    killed = int((kill_dir / "killed").read_text())
    assert (kill_dir / "retries").is_file(), "no write met the dead master"
    assert reader.error is None, f"a reader failed during the failover: {reader.error!r}"
    assert reader.reads > 0

    table = _parquet(tmp_path / "out")
    assert table.num_rows == summary["pairs_out"] + summary["users_out"]
    with open_store(plain) as store:
        _assert_store_holds(store, table)
        expected = store.read_batch(_keys(table))
    truth = {key: _fields(expected, i) for i, key in enumerate(_keys(table))}
    wrong = {key: got for key, got in reader.seen.items() if truth.get(key) != got}
    assert not wrong, f"readers saw {len(wrong)} records that differ from the Parquet output"

    roles = {port: private_cluster.role(port) for port in private_cluster.ports if port != killed}
    assert sorted(roles.values()).count("master") == 3, f"the killed master's replica was not promoted: {roles}"
    restarted = private_cluster.script("up")  # the killed node comes back and rejoins as a replica
    assert restarted.returncode == 0, restarted.stderr
    assert private_cluster.role(killed) == "slave"
    assert private_cluster.script("status").returncode == 0


def test_a_password_protected_cluster_takes_precompute_and_refuses_a_wrong_password(
    world: World, private_cluster: PrivateCluster, tmp_path: Path
) -> None:
    uri = private_cluster.uri(f"gem-auth:{uuid.uuid4().hex[:8]}:")
    summary = _precompute(world, tmp_path / "out", uri)  # the CLI moves the password into the environment
    assert private_cluster.password not in json.dumps(summary)
    with open_store(uri) as store:
        _assert_store_holds(store, _parquet(tmp_path / "out"))
    wrong = uri.replace(private_cluster.password, "not-the-password")
    with pytest.raises(StoreUnavailableError, match="fix the user:password in --store") as caught:
        open_store(wrong).close()
    assert "not-the-password" not in str(caught.value)


@pytest.fixture(scope="module")
def both_stores(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path, str]]:
    """The same precompute into LMDB and into the project's cluster (with contexts); an index of its users."""
    uri = f"{default_redis_cluster_url()}?namespace=gem-test-cmp:{uuid.uuid4().hex[:8]}:"
    require_redis_cluster(uri)
    root = tmp_path_factory.mktemp("cluster-vs-lmdb")
    lmdb_uri = f"lmdb://{root}/lmdb-store"
    _precompute(world, root / "lmdb", lmdb_uri, "--contexts")
    _precompute(world, root / "cluster", uri, "--contexts")
    assert main(["index", "--representations", str(root / "cluster"), "--output", str(root / "index")]) == 0
    yield root, lmdb_uri, root / "index", uri
    with open_store(uri) as store:
        store.clear()


def test_every_looked_up_representation_in_the_cluster_equals_the_lmdb_stores(
    world: World, both_stores: tuple[Path, str, Path, str]
) -> None:
    root, lmdb_uri, _, uri = both_stores
    table = _parquet(root / "cluster")
    run_clock = ["computed_at"]  # each run stamps its own time; every other field must agree
    assert table.drop_columns(run_clock).equals(_parquet(root / "lmdb").drop_columns(run_clock))
    with open_store(uri) as cluster, open_store(lmdb_uri) as lmdb:
        assert isinstance(cluster, RedisClusterStore) and isinstance(cluster.config, RedisClusterConfig)
        _assert_store_holds(cluster, table)
        requests = _requests(world)
        for user, ads in requests:
            near = [u for u, _ in requests[:5] if u != user]
            a = cluster.read_for_request(user, ads, near, with_context=True)
            b = lmdb.read_for_request(user, ads, near, with_context=True)
            assert a.pairs.found.all()
            for x, y in ((a.pairs, b.pairs), (a.user, b.user), (a.neighbor_pairs, b.neighbor_pairs)):
                assert (
                    x.to_arrow()
                    .drop_columns(["age_s", *run_clock])
                    .equals(y.to_arrow().drop_columns(["age_s", *run_clock]))
                )
            assert a.context is not None and b.context is not None
            assert (
                (a.context.found, a.context.payload)
                == (b.context.found, b.context.payload)
                == (True, b.context.payload)
            )


def test_lookup_answers_the_same_from_the_cluster_and_from_lmdb(
    world: World, both_stores: tuple[Path, str, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, lmdb_uri, index, uri = both_stores
    for user, ads in _requests(world)[:10]:
        answers = []
        for store in (uri, lmdb_uri):
            flags = ["--index", str(index), "--user", str(user), "--ads", ",".join(map(str, [*ads[:5], 999_999]))]
            assert main(["lookup", "--store", store, *flags, "--json"]) == 0
            lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
            answers.append([{k: v for k, v in a.items() if k != "age_s"} for a in lines])
        assert answers[0] == answers[1] and len(answers[0]) == 6


def test_a_shard_with_no_live_node_stops_writes_with_a_clear_error_and_a_rerun_completes(
    private_cluster: PrivateCluster,
) -> None:
    from redis.crc import key_slot

    from tests.store.reps import grid, reps

    table = reps(grid(40, 5))
    uri = private_cluster.uri(f"gem-down:{uuid.uuid4().hex[:8]}:", failover_timeout="3s")
    with open_store(uri) as store:
        assert isinstance(store, RedisClusterStore)
        node = store._cluster.nodes_manager.get_node_from_slot(key_slot(store._key((7).to_bytes(8, "big"))))
        master = int(node.port)
    replica = next(p for p in private_cluster.ports if private_cluster.master_of(p) == master)
    private_cluster.kill(replica)
    private_cluster.kill(master)  # user 7's slot has no live node now
    with open_store(uri) as store, pytest.raises(StoreUnavailableError) as caught:
        store.write_batch(table)
    message = str(caught.value)
    assert "still failing after 3s" in message and "Fix:" in message and "redis-cli --cluster check" in message
    assert private_cluster.password not in message

    restarted = private_cluster.script("up")  # both nodes come back (the shard's data is gone: no persistence)
    assert restarted.returncode == 0, restarted.stderr
    with open_store(uri) as store:  # the rerun
        assert store.write_batch(table).written == table.num_rows
        assert store.read_batch(grid(40, 5)).found.all()
