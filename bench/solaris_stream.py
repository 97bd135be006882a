"""The Solaris bench's jobs: the candidates job, or the stream graph (``SOLARIS_JOB=stream``).

:class:`CandidatesJobRunner` starts ``python -m pipelines solaris`` on the world's
features snapshot. :class:`StreamGraphRunner` runs the same candidate sets through
``python -m pipelines stream --candidates-topic`` instead: the sets meet their users'
keyed state inside the streaming graph. Its state is seeded once per bench run by
streaming the world's events (``produce`` of the events Parquet, then ``stream
--idle-exit`` on Prism) into a stream output; each rate then starts the graph on that
output, with the events topic already committed, on Prism or on a Flink cluster of the
bench's own at parallelism 2 (``bench/flink_parts.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from bench.flink_parts import OwnFlink, free_port, stop_job


class JobRunner(Protocol):
    """Starts the job that answers a candidates topic, and stops it (returning its closing line)."""

    def start(self, topic: str, store: str, bootstrap: str, log: IO[bytes]) -> subprocess.Popen[str]: ...

    def stop(self, job: subprocess.Popen[str]) -> str: ...


@dataclass
class CandidatesJobRunner:
    """``python -m pipelines solaris`` on a features snapshot."""

    features: Path
    model: Path
    batch_requests: str

    def start(self, topic: str, store: str, bootstrap: str, log: IO[bytes]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable, "-m", "pipelines", "solaris", "--topic", topic, "--group", topic,
                "--histories", str(self.features), "--model", str(self.model), "--store", store,
                "--bootstrap-servers", bootstrap, "--batch-requests", self.batch_requests,
            ],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True,
        )  # fmt: skip

    def stop(self, job: subprocess.Popen[str]) -> str:
        os.killpg(job.pid, signal.SIGTERM)
        out, _ = job.communicate(timeout=60)
        return out.strip().splitlines()[-1] if out.strip() else "(the job printed nothing)"


@dataclass
class StreamGraphRunner:
    """``python -m pipelines stream --candidates-topic`` on a seeded stream output (see :func:`seed_stream`)."""

    events_topic: str
    group: str
    output: Path
    catalog: Path
    model: Path
    cluster: OwnFlink | None = None
    flags: list[str] = field(default_factory=list)  # more Beam flags of the Flink job
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
                sys.executable, "-m", "pipelines", "stream", "--topic", self.events_topic, "--group", self.group,
                "--output", str(self.output), "--candidates-topic", topic, "--model", str(self.model),
                "--store", store, "--ad-catalog", str(self.catalog), "--bootstrap-servers", bootstrap,
                "--device", "cpu", *served, *(self.cluster.runner_flags() + self.flags if self.cluster else []),
            ],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True,
        )  # fmt: skip

    def stop(self, job: subprocess.Popen[str]) -> str:
        """Stop the job; its closing line in the candidates job's words, from its metrics where served."""
        counts = None if self._port is None else pair_outcomes(self._port)
        stop_job(job, self.cluster)
        if counts is None:
            return f"{self.name}: pair counts not served (the workers' metrics stay in their processes)"
        return (
            f"{self.name}: ({counts['computed']:,.0f} pairs computed, {counts['fresh']:,.0f} fresh in the store "
            f"= compute saved, {counts['repeated']:,.0f} repeated); {counts['dropped']:,.0f} sets past their deadline"
        )


def pair_outcomes(port: int) -> dict[str, float] | None:
    """``gem_pairs_total`` by outcome and ``gem_deadline_dropped_total`` (as ``dropped``) from the job's
    /metrics on ``port``; None if it does not answer."""
    from bench.common import metric_samples

    try:
        samples = metric_samples(port, timeout_s=10)
    except OSError:
        return None
    counts = {"computed": 0.0, "fresh": 0.0, "repeated": 0.0, "dropped": 0.0}
    for sample in samples:
        if sample.name == "gem_pairs_total" and sample.labels.get("outcome") in counts:
            counts[sample.labels["outcome"]] += sample.value
        elif sample.name == "gem_deadline_dropped_total":
            counts["dropped"] += sample.value
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

    from pipelines.io.files import match_files
    from pipelines.model.inputs import ad_catalog

    histories = pq.ParquetDataset(match_files(str(features / "histories/*/*.parquet"))).read()
    pq.write_table(ad_catalog(histories), path)
    return path
