"""The precompute pipeline: candidates + histories → RunInference(GEM) → representations.

Outputs ``OUTPUT/representations/shard=NNNNN/part-00000.parquet`` (REPRESENTATION
layout), with ``rep_history`` the historical representations of each user's newest events
(``OUTPUT/rep_history/``, REP_HISTORY layout), ``OUTPUT/dead_letters/part-00000.parquet``, ``OUTPUT/summary.json``, and
the same representations in the online store when ``store`` is given. Counters
prove pairs in = pairs out + pairs in dead letters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.errors import ConfigError
from pipelines.io.files import expand_inputs, splits_of
from pipelines.io.outputs import store_path
from pipelines.io.parquet import read_file
from pipelines.io.snapshot import COUNTS, DEAD, HISTORIES, Snapshot, open_snapshot, run_stage
from pipelines.io.summary import Balance
from pipelines.io.transforms import WriteDeadLetters, WriteSummary
from pipelines.model.gem import GemModel
from pipelines.precompute.handler import Batching, GemModelHandler
from pipelines.precompute.rep_history import WriteRepHistory
from pipelines.precompute.transforms import (
    AdCatalog,
    PrepareRequests,
    ReadCandidates,
    RunGemInference,
    WriteRepresentations,
)
from pipelines.redact import redact
from pipelines.schemas.layouts import CANDIDATES

log = logging.getLogger(__name__)

#: Pairs in = pairs out + pairs superseded by a later request of the same user + dead-lettered pairs
#: (not checked when inference failed: a failed batch's pairs are dead letters of another count).
PAIRS = Balance("pair", "pairs_in", ("pairs_out", "pairs_superseded", "dead_pairs"), unless="inference_failures")


@dataclass(frozen=True)
class PrecomputeConfig:
    """Everything the precompute pipeline needs; validated on construction."""

    features: str
    candidates: Sequence[str]
    model: str
    output: str
    store: str | None = None
    all_users: bool = False
    contexts: bool = False
    rep_history: int = 0  # historical representations of each user's newest N events (0: none)
    device: str = "auto"
    batching: Batching = "tokens"
    token_budget: int = 32_768
    batch_size: int = 64
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ConfigError("--token-budget", f"got {self.token_budget}", "pass a positive number of tokens")
        if self.batch_size < 1:
            raise ConfigError("--batch-size", f"got {self.batch_size}", "pass a positive number of requests")
        if self.rep_history < 0:
            raise ConfigError("--rep-history", f"got {self.rep_history}", "pass 0 (none) or a number of events")
        if self.contexts and not self.store:
            raise ConfigError("--contexts", "context records live only in the online store", "pass --store too")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("--device", f"got {self.device!r}", "pass auto, cpu or cuda")
        if self.store and self.store.startswith("lmdb://") and "://" not in self.output:
            store = Path(self.store.removeprefix("lmdb://").split("?", 1)[0]).resolve()
            output = Path(self.output).resolve()
            if store == output or output in store.parents:
                raise ConfigError(
                    "--store",
                    f"{self.store!r} lies inside --output {self.output!r}",
                    "put the store beside the output folder (a committed output is replaced whole on publish)",
                )


@dataclass(frozen=True)
class _Resolved:
    features: Snapshot  # pinned: the workers read this snapshot, whatever is published meanwhile
    num_shards: int
    watermark_ms: int | None
    model_version: str
    max_len: int


def _watermark(features: Snapshot) -> int | None:

    for path in features.files(HISTORIES):
        with FileSystems.open(path) as f:
            table = read_file(f, columns=["watermark"])
        if table.num_rows:
            return int(table.column("watermark").cast("int64")[0].as_py())
    return None


def load_model_flag(path: str, flag: str = "--model") -> GemModel:
    """The model at ``path`` on the CPU (to check it and read its version); a clear error naming ``flag``."""
    from pipelines.model.checkpoint import CheckpointError, load_model

    try:
        return load_model(path, device="cpu")
    except (CheckpointError, FileNotFoundError) as exc:
        raise ConfigError(flag, str(exc), "point it at the --output folder of `python -m pipelines train`") from exc


def _resolve(config: PrecomputeConfig) -> _Resolved:
    snapshot = open_snapshot(config.features, flag="--features", writer="python -m pipelines features")
    summary: dict[str, Any] = snapshot.summary()
    if "num_shards" not in summary:
        raise ConfigError(
            "--features", f"{config.features!r} is not a features snapshot", "pass the --output of `pipelines features`"
        )
    model = load_model_flag(config.model)
    return _Resolved(
        snapshot, int(summary["num_shards"]), _watermark(snapshot), model.model_version, model.config.max_len
    )


def build_precompute(
    p: beam.Pipeline,
    config: PrecomputeConfig,
    resolved: _Resolved,
    splits: Sequence,
    computed_at_ms: int,
    root: str | None = None,
) -> None:
    """Add the precompute steps to ``p``, writing under ``root`` (default ``config.output``)."""
    root = root or config.output
    read = p | "ReadCandidates" >> ReadCandidates(splits, num_shards=resolved.num_shards)
    catalog = p | "AdCatalog" >> AdCatalog(resolved.features)
    requests = read["candidates"] | "PrepareRequests" >> PrepareRequests(
        resolved.features,
        beam.pvalue.AsSingleton(catalog),
        num_shards=resolved.num_shards,
        max_len=resolved.max_len,
        all_users=config.all_users,
    )
    handler = GemModelHandler(
        config.model,
        device=config.device,
        batching=config.batching,
        token_budget=config.token_budget,
        batch_size=config.batch_size,
    )
    reps, failed = requests | "Infer" >> RunGemInference(handler)
    written = reps | "WriteRepresentations" >> WriteRepresentations(
        root,
        store_uri=config.store,
        model_version=resolved.model_version,
        watermark_ms=resolved.watermark_ms,
        computed_at_ms=computed_at_ms,
        contexts_from=resolved.features if config.contexts else None,
    )
    dead = (read[DEAD], failed) | "AllDead" >> beam.Flatten()
    _ = dead | "WriteDeadLetters" >> WriteDeadLetters(root)
    failed_counts = failed | "FailedCounts" >> beam.Map(lambda t: {"inference_failures": t.num_rows})
    counts = [read[COUNTS], written, failed_counts]
    if config.rep_history:
        counts.append(
            p
            | "RepHistory"
            >> WriteRepHistory(
                resolved.features,
                resolved.num_shards,
                config.model,
                length=config.rep_history,
                root=root,
                device=config.device,
            )
        )
    extra = {
        "features": config.features,
        "candidates": list(config.candidates),
        "model": config.model,
        "model_version": resolved.model_version,
        "store": redact(config.store) if config.store else None,
        "all_users": config.all_users,
        "contexts": config.contexts,
        "rep_history": config.rep_history,
        "batching": config.batching,
        "token_budget": config.token_budget,
    }
    _ = tuple(counts) | "AllCounts" >> beam.Flatten() | "WriteSummary" >> WriteSummary(root, extra)


def check_candidate_files(paths: Sequence[str]) -> None:
    """Refuse, before any work, a ``--candidates`` file that is not CANDIDATES Parquet (a histories or
    events file given by mistake): its missing columns are named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    required = [f.name for f in CANDIDATES.schema if not f.nullable]
    for path in paths:
        try:
            with FileSystems.open(path) as source:
                names = pq.read_schema(source).names
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(
                "--candidates", f"{path} is not a Parquet file ({exc})", "pass the candidates file of `generate`"
            ) from exc
        missing = [name for name in required if name not in names]
        if missing:
            raise ConfigError(
                "--candidates",
                f"{path} has no column(s) {', '.join(missing)}: it is not a candidates file",
                "pass the --candidates Parquet of `generate` (CANDIDATES layout: request_id, user_id, ad_ids, ...)",
            )


def run_precompute(
    config: PrecomputeConfig,
    options: PipelineOptions,
    runner: object | None = None,
    clock: Callable[[], float] = time.time,
) -> dict:
    """Validate, run, and return the summary (also written to ``<output>/summary.json``)."""
    resolved = _resolve(config)
    paths = expand_inputs(config.candidates, "--candidates")
    check_candidate_files(paths)
    splits = splits_of(paths)
    computed_at_ms = int(clock() * 1000)
    return run_stage(
        config.output,
        lambda p, root: build_precompute(p, config, resolved, splits, computed_at_ms, root),
        holds="representations",
        overwrite=config.overwrite,
        balance=PAIRS,
        options=options,
        runner=runner,
        reads=[resolved.features],
        inputs=[
            ("--features", config.features),
            *(("--candidates", path) for path in paths),
            ("--model", config.model),
            ("--store", store_path(config.store)),
        ],
    )


__all__ = ["PrecomputeConfig", "build_precompute", "check_candidate_files", "run_precompute"]
