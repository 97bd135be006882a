"""The Solaris bench's job: the stream graph with candidate sets.

:class:`StreamGraphRunner` runs the candidate sets through ``python -m pipelines solaris``
(``stream --candidates-topic``): the sets meet their users' keyed state inside the streaming
graph. Its state is seeded once per bench run by
streaming the world's events (``produce`` of the events Parquet, then ``stream
--idle-exit`` on Prism) into a stream output; each rate then starts the graph on that
output, with the events topic already committed, on Prism or on a Flink cluster of the
bench's own at parallelism 2 (``bench/flink_parts.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import numpy as np
import pyarrow as pa

from bench.flink_parts import OwnFlink, free_port, stop_job


class JobRunner(Protocol):
    """Starts the job that answers a candidates topic, and stops it (returning its closing line)."""

    events_topic: str  # the topic of the events that flow into the same graph

    def start(self, topic: str, store: str, bootstrap: str, log: IO[bytes]) -> subprocess.Popen[str]: ...

    def stop(self, job: subprocess.Popen[str]) -> str: ...


@dataclass
class StreamGraphRunner:
    """``python -m pipelines stream --candidates-topic`` on a seeded stream output (see :func:`seed_stream`)."""

    events_topic: str
    group: str
    output: Path
    catalog: Path
    model: Path
    cluster: OwnFlink | None = None
    flags: list[str] = field(default_factory=list)  # more flags of the job (on either runner)
    _port: int | None = field(default=None, init=False)  # the running job's /metrics (Prism)

    @property
    def name(self) -> str:
        return "stream graph on Flink p=2" if self.cluster else "stream graph on Prism"

    def start(self, topic: str, store: str, bootstrap: str, log: IO[bytes]) -> subprocess.Popen[str]:
        # On Prism the workers run in the job's process, so its /metrics holds the pairs' outcomes; on
        # Flink they are in the worker pool's processes, which serve none.
        self._port = None if self.cluster else free_port()
        served = [] if self._port is None else ["--metrics-port", str(self._port)]
        return subprocess.Popen(
            [
                sys.executable, "-m", "pipelines", "solaris", "--topic", self.events_topic, "--group", self.group,
                "--output", str(self.output), "--candidates-topic", topic, "--model", str(self.model),
                "--store", store, "--ad-catalog", str(self.catalog), "--bootstrap-servers", bootstrap,
                "--device", "cpu", *served, *(self.cluster.runner_flags() if self.cluster else []), *self.flags,
            ],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True,
        )  # fmt: skip

    def stop(self, job: subprocess.Popen[str]) -> str:
        """Stop the job; its closing line: the pair outcomes, from its metrics where served."""
        counts = None if self._port is None else pair_outcomes(self._port)
        stop_job(job, self.cluster)
        if counts is None:
            return f"{self.name}: pair counts not served (the workers' metrics stay in their processes)"
        return (
            f"{self.name}: ({counts['computed']:,.0f} pairs computed, {counts['fresh']:,.0f} fresh in the store "
            f"= compute saved, {counts['repeated']:,.0f} repeated); {counts['dropped']:,.0f} sets past their deadline; "
            f"{counts['events']:,.0f} events read"
        )


def pair_outcomes(port: int) -> dict[str, float] | None:
    """``gem_pairs_total`` by outcome, ``gem_deadline_dropped_total`` (as ``dropped``) and the events read
    (``events``) from the job's /metrics on ``port``; None if it does not answer."""
    from bench.common import metric_samples

    try:
        samples = metric_samples(port, timeout_s=10)
    except OSError:
        return None
    counts = {"computed": 0.0, "fresh": 0.0, "repeated": 0.0, "dropped": 0.0, "events": 0.0}
    for sample in samples:
        if sample.name == "gem_pairs_total" and sample.labels.get("outcome") in counts:
            counts[sample.labels["outcome"]] += sample.value
        elif sample.name == "gem_deadline_dropped_total":
            counts["dropped"] += sample.value
        elif sample.name == "gem_records_total" and sample.labels.get("kind") == "events":
            counts["events"] += sample.value
    return counts


def seed_stream(events: Path, features: Path, model: Path, root: Path, bootstrap: str) -> StreamGraphRunner:
    """Stream the world's ``events`` into a fresh stream output (Prism, ``--idle-exit``) and write the
    ad catalog of the ``features`` snapshot: what the graph's runs start from."""
    topic = f"bench-solaris-events-{uuid.uuid4().hex[:8]}"
    output = root / topic
    common = ["--bootstrap-servers", bootstrap]
    run = [sys.executable, "-m", "pipelines"]
    subprocess.run([*run, "produce", "--input", str(events), "--topic", topic, "--no-progress", *common], check=True)
    subprocess.run(
        [*run, "stream", "--topic", topic, "--group", topic, "--output", str(output), "--idle-exit", "3", *common],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    catalog = write_ad_catalog(features, root / f"{topic}-ad-catalog.parquet")
    return StreamGraphRunner(topic, topic, output, catalog, model)


def write_ad_catalog(features: Path, path: Path) -> Path:
    """The ad catalog of the ``features`` snapshot's histories, written to ``path``."""
    import pyarrow.parquet as pq

    from pipelines.model.inputs import ad_catalog

    pq.write_table(ad_catalog(snapshot_histories(features)), path)
    return path


def snapshot_histories(features: Path) -> pa.Table:
    """Every user's HISTORY row of a ``features`` snapshot (one row per user), by user: the histories
    the benches' in-process baselines compute on."""
    from pipelines.io.files import match_files
    from pipelines.io.parquet import read_table
    from pipelines.io.shards import kind_glob
    from pipelines.io.snapshot import HISTORIES
    from pipelines.schemas.layouts import HISTORY

    files = match_files(kind_glob(str(features), HISTORIES))
    histories = pa.concat_tables([HISTORY.schema.empty_table(), *(read_table(f, HISTORY) for f in files)])
    return histories.sort_by("user_id")


def rows_of(histories: pa.Table, users: np.ndarray) -> pa.Table:
    """The rows of ``histories`` of ``users`` (in the table's order)."""
    import pyarrow.compute as pc

    return histories.filter(pc.is_in(histories.column("user_id"), value_set=pa.array(np.unique(users))))


@dataclass
class EventFlow:
    """The stream's own events flowing in the same graph while the sets do: ``produce --rate`` (a
    subprocess) of fresh events for the world's users (new ids, stamped from now at the rate: the
    shapes of the world's events) to the graph's events topic, so their flushes change the histories
    the sets meet. ``rate`` 0: no flow."""

    events: Path  # the world's events Parquet
    rate: int
    _job: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _offsets: tuple[str, int, float] | None = field(default=None, init=False)  # (topic, end offset, time)

    def start(self, topic: str, bootstrap: str, seconds: float, folder: Path) -> None:
        if self.rate <= 0:
            return
        path = folder / f"flow-{uuid.uuid4().hex[:8]}.parquet"
        _write_flow(self.events, path, int(self.rate * seconds), self.rate)
        self._offsets = (topic, _end_offset(topic, bootstrap), time.time())
        self._job = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "produce", "--input", str(path), "--topic", topic,
             "--rate", str(self.rate), "--no-progress", "--bootstrap-servers", bootstrap],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self, bootstrap: str) -> str:
        """Stop the flow; what it sent, from the topic's end offsets."""
        if self._job is None or self._offsets is None:
            return "no events flowing"
        self._job.terminate()
        self._job.wait(timeout=60)
        topic, before, since = self._offsets
        sent = _end_offset(topic, bootstrap) - before
        return (
            f"events flowing: {sent:,} sent at {sent / max(time.time() - since, 1e-9):,.0f}/s (asked {self.rate:,}/s)"
        )


def _write_flow(events: Path, path: Path, count: int, rate: int) -> None:
    """``count`` events shaped like the world's (users, items, kinds), each with a new id, event ``i``
    stamped ``now + i / rate`` (when ``produce --rate`` sends it)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    world = pq.read_table(events)
    rows = np.random.default_rng(7).integers(0, world.num_rows, count)
    flow = world.take(pa.array(rows))
    now_ms = int(time.time() * 1000)
    stamp = flow.schema.field("event_time").type
    times = pa.array(now_ms + np.arange(count, dtype=np.int64) * 1000 // rate).cast(pa.timestamp("ms"))
    flow = flow.set_column(flow.schema.get_field_index("event_time"), "event_time", times.cast(stamp))
    ids = pc.binary_join_element_wise(f"flow-{uuid.uuid4().hex[:8]}-", pa.array(np.arange(count)).cast(pa.string()), "")
    flow = flow.set_column(
        flow.schema.get_field_index("event_id"), "event_id", ids.cast(flow.schema.field("event_id").type)
    )
    pq.write_table(flow, path)


def _end_offset(topic: str, bootstrap: str) -> int:
    """The sum of ``topic``'s end offsets (the project's offset lookup)."""
    from bench.common import kafka_connection
    from pipelines.io.kafka.consume import open_lookup

    lookup = open_lookup(kafka_connection(bootstrap))
    try:
        return sum(end for _, end in lookup.bounds(topic, lookup.partitions(topic)).values())
    finally:
        lookup.close()
