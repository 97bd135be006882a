"""Input discovery and reading: globs, JSONL(.gz) line batches, Parquet row groups.

All paths go through Beam's ``FileSystems`` (local, ``gs://``, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines.errors import ConfigError, InputNotFoundError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".ndjson", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class Split:
    """One unit of input work: a whole JSONL file or one Parquet row group."""

    path: str
    row_group: int | None = None
    first_row: int = 0


def expand_inputs(patterns: Sequence[str], flag: str = "--input") -> list[str]:
    """Every file matched by ``patterns`` (sorted, deduplicated); raises when one matches nothing."""
    paths: list[str] = []
    for pattern in patterns:
        try:
            matched = [m.path for r in FileSystems.match([pattern]) for m in r.metadata_list]
        except Exception as exc:  # Beam raises BeamIOError for a missing path
            raise InputNotFoundError(f"{flag} {pattern!r}: cannot be read ({exc})") from exc
        if not matched:
            raise InputNotFoundError(f"{flag} {pattern!r} matches no file")
        paths.extend(matched)
    unknown = [p for p in paths if not p.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES)]
    if unknown:
        raise ConfigError(
            flag,
            f"unsupported file type {unknown[0]!r}",
            f"give files ending in {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}",
        )
    return sorted(set(paths))


def splits_of(paths: Sequence[str]) -> list[Split]:
    """Parquet files split by row group (so they read in parallel); JSONL files whole."""
    splits: list[Split] = []
    for path in paths:
        if not path.endswith(PARQUET_SUFFIXES):
            splits.append(Split(path))
            continue
        with FileSystems.open(path) as source:
            meta = pq.ParquetFile(source).metadata
        first = 0
        for i in range(meta.num_row_groups):
            splits.append(Split(path, i, first))
            first += meta.row_group(i).num_rows
    return splits


def read_row_group(split: Split) -> pa.Table:
    with FileSystems.open(split.path) as source:
        return pq.ParquetFile(source).read_row_group(split.row_group or 0)


def read_line_batches(path: str, batch_size: int) -> Iterator[tuple[list[bytes], list[str]]]:
    """(lines, sources) batches of a JSONL(.gz) file; sources are ``path:line`` (1-based).

    Blank lines are skipped (they carry no record); a trailing ``\\r`` is stripped.
    """
    lines: list[bytes] = []
    sources: list[str] = []
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as f:
        for number, raw in enumerate(iter(f.readline, b""), start=1):  # CompressedFile is not iterable
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                continue
            lines.append(line)
            sources.append(f"{path}:{number}")
            if len(lines) >= batch_size:
                yield lines, sources
                lines, sources = [], []
    if lines:
        yield lines, sources


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths and URIs alike."""
    return "/".join([root.rstrip("/"), *parts])


def match_files(pattern: str) -> list[str]:
    """Every file matching ``pattern``, sorted (empty when none)."""
    return sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
