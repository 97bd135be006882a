"""Input discovery and reading: globs, JSONL(.gz) line batches, Parquet row groups.

All paths go through Beam's ``FileSystems`` (local, ``gs://``, ...). A file that
cannot be read to its end (a truncated or non-gzip ``.gz``, a file that is not
Parquet, a Parquet schema the caller's ``check`` refuses) raises
:class:`~pipelines.errors.BadInputError` naming the file and how far reading got;
Python's ``gzip`` reads ``.gz`` files because it, unlike Beam's decompressor,
notices a stream cut short. Globs skip the project's own outputs (see
:func:`is_own_output`) with a logged note.
"""

from __future__ import annotations

import gzip
import logging
import os
import posixpath
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines.errors import BadInputError, ConfigError, InputNotFoundError

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".ndjson", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet",)
#: Files the project writes beside its outputs; never events.
OWN_FILES = ("summary.json", "manifest.json", "metrics.json", "config.json", "world.json")
#: A folder holding one of these is an output of the project (a snapshot, an index, a model, ground truth).
OWN_MARKERS = ("summary.json", "manifest.json", "metrics.json", "world.json")
_READ_ERRORS = (OSError, EOFError, zlib.error, pa.ArrowException, ValueError)
#: Why a Parquet schema cannot be read (None when it can); the features stage passes its rule.
SchemaCheck = Callable[[pa.Schema], "str | None"]


@dataclass(frozen=True)
class Split:
    """One unit of input work: a whole JSONL file or one Parquet row group.

    ``error`` is set for a file found bad before the run (only with ``skip_bad``): the
    read step then records it as a bad file instead of reading it.
    """

    path: str
    row_group: int | None = None
    first_row: int = 0
    error: str | None = None


def is_own_output(path: str, base: str, known: dict[str, bool] | None = None) -> bool:
    """Whether ``path`` (matched by a glob below folder ``base``) is a file this project wrote:
    a summary, manifest or marker (a name in :data:`OWN_FILES`, or starting with ``.`` or ``_``),
    or a file in a folder at or below ``base`` that holds one of :data:`OWN_MARKERS` (a snapshot,
    an index, a model, ground truth). ``known`` caches the folders already looked at."""
    known = {} if known is None else known
    name = posixpath.basename(path)
    if name in OWN_FILES or name.startswith((".", "_")):
        return True
    if "://" not in path:
        path, base = os.path.abspath(path), os.path.abspath(base or ".")
    base = base.rstrip("/") or "/"
    folder = posixpath.dirname(path)
    while folder.startswith(base) and len(folder) >= len(base):
        if folder not in known:
            known[folder] = any(FileSystems.exists(join(folder, m)) for m in OWN_MARKERS)
        if known[folder]:
            return True
        if folder == base:
            break
        folder = posixpath.dirname(folder)
    return False


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
        if any(c in pattern for c in "*?["):
            matched = _without_own_outputs(matched, pattern)
            if not matched:
                raise InputNotFoundError(f"{flag} {pattern!r} matches only outputs of this project")
        paths.extend(matched)
    unknown = [p for p in paths if not p.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES)]
    if unknown:
        raise ConfigError(
            flag,
            f"unsupported file type {unknown[0]!r}",
            f"give files ending in {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}",
        )
    return sorted(set(paths))


def _without_own_outputs(paths: list[str], pattern: str) -> list[str]:
    known: dict[str, bool] = {}
    wild = min(pattern.find(c) for c in "*?[" if c in pattern)
    base = posixpath.dirname(pattern[:wild])
    kept = [p for p in paths if not is_own_output(p, base, known)]
    if len(kept) < len(paths):
        skipped = sorted(set(paths) - set(kept))
        log.info(
            "%r: skipping %d file(s) this project wrote (summaries, markers, snapshot parts), e.g. %s",
            pattern,
            len(skipped),
            skipped[0],
        )
    return kept


def splits_of(paths: Sequence[str], *, check: SchemaCheck | None = None, skip_bad: bool = False) -> list[Split]:
    """Parquet files split by row group (so they read in parallel); JSONL files whole.

    Each file's header is checked first (gzip magic; Parquet footer and ``check`` of its
    schema): a bad one raises :class:`BadInputError`, or with ``skip_bad`` becomes one
    ``Split`` with ``error`` set.
    """
    splits: list[Split] = []
    for path in paths:
        try:
            splits.extend(_splits_of_file(path, check))
        except BadInputError as exc:
            if not skip_bad:
                raise
            log.warning("skipping bad file: %s", exc)
            splits.append(Split(path, error=str(exc)))
    return splits


def _splits_of_file(path: str, check: SchemaCheck | None) -> list[Split]:
    if not path.endswith(PARQUET_SUFFIXES):
        if path.endswith(".gz"):
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
                if raw.read(2) not in (b"\x1f\x8b", b""):
                    raise BadInputError(f"{path}: not gzip (no gzip header at byte 0); nothing read")
        _check_text_encoding(path)
        return [Split(path)]
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as source:
            meta = pq.ParquetFile(source).metadata
    except _READ_ERRORS as exc:
        raise BadInputError(f"{path}: not a readable Parquet file ({exc}); nothing read") from exc
    problem = check(meta.schema.to_arrow_schema()) if check else None
    if problem:
        raise BadInputError(
            f"{path}: {problem}; nothing read. Fix: write the file with the event layout's columns "
            "(pipelines/schemas/event.schema.json lists them), or leave it out of --input"
        )
    splits, first = [], 0
    for i in range(meta.num_row_groups):
        splits.append(Split(path, i, first))
        first += meta.row_group(i).num_rows
    return splits


def _check_text_encoding(path: str) -> None:
    """Refuse a JSONL file in UTF-16 or UTF-32 as a whole (before any line is read): read as UTF-8,
    each of its lines would only be a ``nul_byte`` dead letter. A UTF-8 byte-order mark is fine
    (:func:`read_line_batches` strips it)."""
    try:
        with _open_lines(path) as f:
            head = f.read(_SNIFF_BYTES)
    except _READ_ERRORS:
        return  # reading reports what is wrong with the file, after the lines before the fault
    encoding = text_encoding_of(head)
    if encoding is not None:
        raise BadInputError(
            f"{path}: the text is {encoding}, but events are UTF-8 JSON lines; nothing read. "
            f"Fix: convert it, e.g. `iconv -f {encoding} -t UTF-8 IN > OUT.jsonl`"
        )


_SNIFF_BYTES = 64
#: Byte-order marks of the encodings refused (longest first: UTF-32LE's starts with UTF-16LE's).
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
UTF8_BOM = b"\xef\xbb\xbf"


def text_encoding_of(head: bytes) -> str | None:
    """``"UTF-16"`` or ``"UTF-32"`` when the first bytes of a text file say so (a byte-order mark,
    or ASCII characters each followed or preceded by NUL bytes); None for UTF-8 (or anything else).
    One stray NUL byte in a UTF-8 line is not enough: every other byte must be NUL."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    for width, name in ((4, "UTF-32"), (2, "UTF-16")):
        n = len(head) - len(head) % width
        units = [head[k : k + width] for k in range(0, n, width)]
        # ASCII in either byte order: one non-NUL byte per code unit, always at the same end
        if len(units) >= 2 and any(all(u.strip(b"\x00") == u[end:][:1] for u in units) for end in (0, -1)):
            return name
    return None


def read_row_group(split: Split) -> pa.Table:
    """One row group of a Parquet file; :class:`BadInputError` when it cannot be read."""
    try:
        with FileSystems.open(split.path, compression_type=CompressionTypes.UNCOMPRESSED) as source:
            return pq.ParquetFile(source).read_row_group(split.row_group or 0)
    except _READ_ERRORS as exc:
        raise BadInputError(
            f"{split.path}: row group {split.row_group} (rows from {split.first_row}) cannot be read ({exc})"
        ) from exc


def _open_lines(path: str) -> IO[bytes] | gzip.GzipFile:
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def read_line_batches(path: str, batch_size: int) -> Iterator[tuple[list[bytes], list[str]]]:
    """(lines, sources) batches of a JSONL(.gz) file; sources are ``path:line`` (1-based).

    Blank lines are skipped (they carry no record); a trailing ``\\r`` is stripped, and so is a
    UTF-8 byte-order mark at the start of the file. A file
    that ends early (truncated gzip) or is not what its name says raises
    :class:`BadInputError` after yielding every line read before the fault.
    """
    lines: list[bytes] = []
    sources: list[str] = []
    number = 0
    try:
        with _open_lines(path) as f:
            for number, raw in enumerate(iter(f.readline, b""), start=1):
                line = raw.rstrip(b"\r\n")
                if number == 1 and line.startswith(UTF8_BOM):  # editors on Windows write one
                    line = line[len(UTF8_BOM) :]
                if not line.strip():
                    continue
                lines.append(line)
                sources.append(f"{path}:{number}")
                if len(lines) >= batch_size:
                    yield lines, sources
                    lines, sources = [], []
    except _READ_ERRORS as exc:
        if lines:  # what was read before the fault is kept (and counted) like any other batch
            yield lines, sources
        raise BadInputError(f"{path}: cannot be read past line {number} ({_why(exc)})") from exc
    if lines:
        yield lines, sources


def _why(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the compressed stream ends early: the file is truncated"
    if isinstance(exc, gzip.BadGzipFile):
        return f"not gzip: {exc}"
    return f"{type(exc).__name__}: {exc}"


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths and URIs alike."""
    return "/".join([root.rstrip("/"), *parts])


def match_files(pattern: str) -> list[str]:
    """Every file matching ``pattern``, sorted (empty when none)."""
    return sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
