"""Write a generated world: events (JSONL, JSONL.gz or Parquet), candidates, a funnel, ground truth.

:func:`write_world` is what ``python -m pipelines generate`` does after parsing its
flags; it returns the summary that also goes into ``world.json``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.generator import corrupt, jsonl
from pipelines.generator.candidates import generate_candidates
from pipelines.generator.config import WorldConfig
from pipelines.generator.events import GeneratedEvents, generate_events, rngs
from pipelines.generator.funnel import generate_funnel, late_requests
from pipelines.generator.summary import candidates_summary, events_summary
from pipelines.generator.truth import truth_dir_for, write_truth
from pipelines.io.parquet import write_table
from pipelines.schemas.layouts import CANDIDATE_SET, CANDIDATES, EVENT

log = logging.getLogger(__name__)

FORMATS = {".jsonl": "jsonl", ".jsonl.gz": "jsonl.gz", ".parquet": "parquet"}
_REDELIVERY_LAG_LINES = 2_000.0  # median distance of a redelivery after the original line


def format_of(path: Path) -> str | None:
    """'jsonl', 'jsonl.gz' or 'parquet' from the file name, None for anything else."""
    for suffix, name in sorted(FORMATS.items(), key=lambda kv: -len(kv[0])):
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return name
    return None


@dataclass(frozen=True)
class Request:
    """What to write, as validated by the CLI."""

    config: WorldConfig
    output: Path
    candidates: Path | None = None
    requests: int = 0
    bad_fraction: float = 0.0
    duplicate_fraction: float = 0.0
    funnel: Path | None = None
    funnel_requests: int = 0


def late_path_for(funnel: Path) -> Path:
    """``X.late.parquet`` beside a funnel file ``X.parquet``: its late-stage requests (CANDIDATES)."""
    return funnel.with_name(funnel.name.removesuffix(".parquet") + ".late.parquet")


Stage = Callable[[str], None]


def write_world(
    request: Request, stage: Stage | None = None, on_bytes: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Generate and write everything ``request`` asks for; returns the world.json summary."""
    step = stage or (lambda _name: None)
    step("simulating events")
    generated = generate_events(request.config)
    streams = rngs(request.config.seed)
    step("redeliveries")
    events, duplicates = with_redeliveries(generated.events, request.duplicate_fraction, streams["duplicates"])
    step("writing events")
    bad_counts = _write_events(request, events, streams["corruption"], on_bytes)
    summary = _summary(request, generated, duplicates, bad_counts)
    if request.candidates is not None:
        step("candidates")
        table = generate_candidates(generated.world, request.requests, streams["candidates"])
        write_table(table, str(request.candidates), CANDIDATES)
        summary["counts"]["candidates"] = candidates_summary(table, request.candidates.name)
        log.info("wrote %d candidate requests to %s", table.num_rows, request.candidates)
    if request.funnel is not None:
        step("funnel")
        summary["counts"]["funnel"] = _write_funnel(request.funnel, generated, request.funnel_requests)
    step("ground truth")
    folder = write_truth(generated.world, truth_dir_for(request.output), summary)
    log.info("wrote ground truth (users, items, world.json) to %s", folder)
    return summary


def _write_funnel(path: Path, generated: GeneratedEvents, requests: int) -> dict[str, Any]:
    funnel = generate_funnel(generated.world, generated.events, requests, rngs(generated.world.config.seed)["funnel"])
    write_table(funnel, str(path), CANDIDATE_SET)
    late = late_requests(funnel)
    write_table(late, str(late_path_for(path)), CANDIDATES)
    log.info("wrote %d funnel requests (%d candidate sets) to %s", late.num_rows, funnel.num_rows, path)
    return {
        "file": path.name,
        "late_file": late_path_for(path).name,
        "requests": late.num_rows,
        "rows": funnel.num_rows,
    }


def with_redeliveries(events: pa.Table, fraction: float, rng: np.random.Generator) -> tuple[pa.Table, int]:
    """``events`` with ``fraction`` of them emitted again, unchanged, some lines later."""
    n = events.num_rows
    count = round(fraction * n)
    if count == 0:
        return events, 0
    picked = np.sort(rng.choice(n, size=count, replace=False))
    lag = 1.0 + rng.lognormal(np.log(_REDELIVERY_LAG_LINES), 1.5, size=count)
    keys = np.concatenate([np.arange(n, dtype=np.float64), np.minimum(picked + lag, n) + 0.5])
    index = np.concatenate([np.arange(n), picked])
    return events.take(index[np.argsort(keys, kind="stable")]), count


def _write_events(
    request: Request, events: pa.Table, rng: np.random.Generator, on_bytes: Callable[[int], None] | None
) -> Counter[str]:
    fmt = format_of(request.output)
    request.output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        write_table(events, str(request.output), EVENT)
        return Counter()
    count = round(request.bad_fraction / (1.0 - request.bad_fraction) * events.num_rows)
    bad = corrupt.bad_lines(events, count, rng)
    positions = np.sort(rng.integers(0, events.num_rows + 1, size=len(bad)))
    lines = jsonl.encode_lines(events)
    jsonl.write_jsonl(request.output, lines, [line for _, line in bad], positions, on_bytes)
    return Counter(kind for kind, _ in bad)


def _summary(request: Request, generated: GeneratedEvents, duplicates: int, bad: Counter[str]) -> dict[str, Any]:
    counts = events_summary(generated)
    counts["duplicates"] = duplicates
    counts["bad_lines"] = dict(sorted(bad.items()))
    counts["bad_lines_total"] = sum(bad.values())
    counts["records_written"] = counts["events"] + duplicates + counts["bad_lines_total"]
    return {
        "generator": "pipelines.generator",
        "seed": request.config.seed,
        "parameters": request.config.to_json()
        | {"bad_fraction": request.bad_fraction, "duplicate_fraction": request.duplicate_fraction},
        "layouts": {"event": EVENT.version, "candidates": CANDIDATES.version, "candidate_set": CANDIDATE_SET.version},
        "outputs": {
            "events": request.output.name,
            "format": format_of(request.output),
            "candidates": None if request.candidates is None else request.candidates.name,
        },
        "counts": counts,
    }
