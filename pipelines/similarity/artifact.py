"""The index folder: the FAISS index, the id map, the vectors and a manifest.

::

    INDEX_DIR/manifest.json     model_version, dim, metric, factory, count, built_at, search params, ...
    INDEX_DIR/ids.parquet       position -> user_id (ID_MAP layout; positions are sorted by user_id)
    INDEX_DIR/vectors.npy       (count, dim) float16: each position's vector (the resolver's queries)
    INDEX_DIR/index.faiss       one index ("merged"), or
    INDEX_DIR/index.faiss       the quantizer and list offsets, and
    INDEX_DIR/lists.ivfdata     the inverted lists, memory-mapped ("ondisk": IVF shards merged on disk), or
    INDEX_DIR/shard-NNNNN.faiss one per shard ("sharded", e.g. HNSW), searched as one IndexShards

The id map layout belongs to this stage (like the generator's ground truth), not to
``schemas/``: only the resolver reads it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.errors import ConfigError, LayoutError
from pipelines.io.parquet import read_table
from pipelines.schemas.layouts import ID_MAP
from pipelines.similarity.faiss_ops import Metric

__all__ = ["ID_MAP", "IndexManifest", "Layout", "read_manifest", "write_id_map", "write_manifest"]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
IDS_NAME = "ids.parquet"
ID_MAP_ROWS = 1 << 20  # rows per row group of the id map as it is written
VECTORS_NAME = "vectors.npy"
INDEX_NAME = "index.faiss"
Layout = Literal["merged", "ondisk", "sharded"]


@dataclass(frozen=True)
class IndexManifest:
    """What an index folder holds and how it was built (``manifest.json``)."""

    model_version: str
    dim: int
    metric: Metric
    factory: str
    count: int
    built_at: str
    layout: Layout = "merged"
    files: list[str] = field(default_factory=lambda: [INDEX_NAME])
    shards: int = 1
    search_params: str = ""
    tuned_recall_at_10: float | None = None
    train_size: int = 0
    seed: int = 0
    gpu_used: bool = False
    build_seconds: float = 0.0
    source: str = ""
    format_version: int = FORMAT_VERSION

    @staticmethod
    def now() -> str:
        return datetime.now(UTC).isoformat(timespec="seconds")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def write_manifest(folder: str | Path, manifest: IndexManifest) -> Path:
    path = Path(folder) / MANIFEST_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(manifest.to_json())
    tmp.replace(path)
    return path


def read_manifest(folder: str | Path) -> IndexManifest:
    """The manifest of an index folder; :class:`ConfigError` naming ``--index`` when absent or foreign."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise ConfigError(
            "--index",
            f"{str(folder)!r} has no {MANIFEST_NAME}",
            "pass the --output folder of `python -m pipelines index`",
        )
    rebuild = "rebuild the index with `python -m pipelines index`"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError("--index", f"{path} is not valid JSON ({exc})", rebuild) from exc
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        found = data.get("format_version") if isinstance(data, dict) else type(data).__name__
        raise ConfigError("--index", f"{path} is index format {found}, this code reads {FORMAT_VERSION}", rebuild)
    try:
        manifest = IndexManifest(**data)
    except TypeError as exc:
        raise ConfigError("--index", f"{path} has fields this code does not know ({exc})", rebuild) from exc
    for name in manifest.files:
        if not _inside(Path(folder), name):
            raise ConfigError(
                "--index", f"{path} names {name!r}, a file outside its folder (refused)", f"{rebuild} into a new folder"
            )
    return manifest


def _inside(folder: Path, name: object) -> bool:
    """Whether ``name`` is a plain file name of ``folder``: no separator, no ``..``, not absolute."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return False
    return (folder / name).resolve().parent == folder.resolve()


def write_id_map(folder: str | Path, user_ids: np.ndarray, *, rows: int = ID_MAP_ROWS) -> Path:
    """``ids.parquet`` in row groups of ``rows``: the writer holds one group's positions and
    encoded pages, not a second copy of the whole map. No dictionary: every id is distinct,
    and a dictionary over millions of them would be the biggest buffer of the index's finish."""
    path = Path(folder) / IDS_NAME
    user_ids = np.asarray(user_ids, dtype=np.int64)
    schema = ID_MAP.with_metadata()
    with pq.ParquetWriter(str(path), schema, compression="zstd", use_dictionary=False) as writer:
        for start in range(0, max(len(user_ids), 1), rows):
            chunk = user_ids[start : start + rows]
            position = np.arange(start, start + len(chunk), dtype=np.int64)
            writer.write_table(pa.table([position, chunk], schema=schema))
    return path


def read_id_map(folder: str | Path) -> np.ndarray:
    """``user_id`` per position, ``(count,) int64`` (sorted ascending)."""
    table = read_table(str(Path(folder) / IDS_NAME), ID_MAP)
    positions = np.asarray(table.column("position").to_numpy(), dtype=np.int64)
    if not np.array_equal(positions, np.arange(len(positions))):
        raise LayoutError(f"{folder}/{IDS_NAME}: positions are not 0..{len(positions) - 1} in order")
    return np.asarray(table.column("user_id").to_numpy(), dtype=np.int64)


def write_vectors(folder: str | Path, vectors: np.ndarray) -> Path:
    path = Path(folder) / VECTORS_NAME
    np.save(path, np.asarray(vectors, dtype=np.float16))
    return path


def read_vectors(folder: str | Path) -> np.ndarray:
    """``(count, dim) float16``, memory-mapped (a 1M x 64 index costs no load time)."""
    return np.load(Path(folder) / VECTORS_NAME, mmap_mode="r")
