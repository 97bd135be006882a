"""Shards as files, merged on disk: the finishing step never holds every code or vector.

Each shard worker writes its part into ``PARTS_DIR`` (:func:`write_part`)::

    NNNNN.lists        IVF: the shard's inverted lists, list by list: codes (n·code_size) then ids (n int64)
    NNNNN.sizes.npy    IVF: (nlist,) uint64 entries per list
    NNNNN.faiss        other index types (Flat, PQ, HNSW): the shard index itself
    NNNNN.vectors.npy  (n, D) float16: the shard's vectors, in position order

:func:`merge_lists` is the faiss ``contrib.ondisk.merge_ondisk`` recipe without its memory
maps on the input side: it sizes one ``OnDiskInvertedLists`` file (``lists.ivfdata``) from
the shards' list sizes and copies each shard's lists into place with ``pwrite``, one list
at a time, so the process holds one list plus the trained quantizer, never the codes
(pages written that way sit in the page cache, not in the process). The index file
(``index.faiss``) then holds the quantizer and the list offsets; faiss maps
``lists.ivfdata`` when the index is read, found beside the index file
(``IO_FLAG_ONDISK_SAME_DIR``), so the folder can move. :func:`concat_vectors` and
:func:`exact_search_files` stream the vectors in chunks for the same reason.

On a runner whose workers sit on several hosts, ``PARTS_DIR`` must be a folder they all see.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.similarity import faiss_ops as ops
from pipelines.similarity.faiss_ops import faiss

__all__ = [
    "IVFDATA_NAME",
    "FileRows",
    "MappedIndex",
    "Part",
    "concat_vectors",
    "exact_search_files",
    "merge_lists",
    "read_index_file",
    "read_rows",
    "remove_part",
    "write_part",
]

IVFDATA_NAME = "lists.ivfdata"
CHUNK_ROWS = 65_536
#: Rows per step of the chunked exact search (tuning's ground truth): its float32 copy is 4 MiB at 64 dims.
EXACT_CHUNK_ROWS = 16_384
_LIBC = ctypes.CDLL(None)
_NPY_HEADER_READ = 4096


@dataclass(frozen=True)
class Part:
    """One shard's files in ``folder`` (see the module docstring)."""

    folder: Path
    shard: int

    def path(self, suffix: str) -> Path:
        return self.folder / f"{self.shard:05d}.{suffix}"

    @property
    def lists(self) -> Path:
        return self.path("lists")

    @property
    def sizes(self) -> Path:
        return self.path("sizes.npy")

    @property
    def index(self) -> Path:
        return self.path("faiss")

    @property
    def vectors(self) -> Path:
        return self.path("vectors.npy")


def write_part(index: Any, vectors: np.ndarray, folder: str | Path, shard: int) -> Part:
    """Write shard ``shard`` (its built ``index`` and its ``vectors (n, D)``) into ``folder``."""
    part = Part(Path(folder), shard)
    part.folder.mkdir(parents=True, exist_ok=True)
    if ops.nlist_of(index) is not None:
        invlists = faiss.extract_index_ivf(index).invlists
        code_size = int(invlists.code_size)
        sizes = np.array([invlists.list_size(i) for i in range(invlists.nlist)], dtype=np.uint64)
        with open(part.lists, "wb") as out:
            for i, n in enumerate(sizes.tolist()):
                if n:
                    out.write(faiss.rev_swig_ptr(invlists.get_codes(i), n * code_size).tobytes())
                    out.write(faiss.rev_swig_ptr(invlists.get_ids(i), n).view(np.int64).tobytes())
        np.save(part.sizes, sizes)
    else:
        faiss.write_index(index, str(part.index))
    np.save(part.vectors, np.asarray(vectors, dtype=np.float16))
    return part


def remove_part(part: Part) -> None:
    """Delete a part's files (those it has)."""
    for path in (part.lists, part.sizes, part.index, part.vectors):
        path.unlink(missing_ok=True)


def merge_lists(trained: Any, parts: list[Part], folder: str | Path) -> Any:
    """The empty ``trained`` IVF index with every part's lists merged into ``folder/lists.ivfdata``
    (an ``OnDiskInvertedLists``), in part order; holds one list at a time."""
    ivf = faiss.extract_index_ivf(trained)
    nlist, code_size = int(ivf.nlist), int(ivf.code_size)
    per_part = [np.load(p.sizes) for p in parts]
    sizes = np.sum(per_part, axis=0, dtype=np.uint64) if per_part else np.zeros(nlist, np.uint64)
    path = Path(folder) / IVFDATA_NAME
    total = int(sizes.sum()) * (code_size + 8)
    with open(path, "wb") as out:
        out.truncate(total)
    invlists = faiss.OnDiskInvertedLists(nlist, code_size, str(path))
    invlists.totsize = total
    invlists.set_all_lists_sizes(faiss.swig_ptr(sizes))
    offsets = np.array([invlists.lists.at(i).offset for i in range(nlist)], dtype=np.int64)
    ids_at = offsets + sizes.astype(np.int64) * code_size
    filled = np.zeros(nlist, np.int64)
    fd = os.open(path, os.O_WRONLY)
    try:
        for part, part_sizes in zip(parts, per_part, strict=True):
            with open(part.lists, "rb") as src:
                for i, n in enumerate(part_sizes.tolist()):
                    if n:
                        os.pwrite(fd, src.read(n * code_size), int(offsets[i] + filled[i] * code_size))
                        os.pwrite(fd, src.read(n * 8), int(ids_at[i] + filled[i] * 8))
                        filled[i] += n
    finally:
        os.close(fd)
    if total:
        invlists.do_mmap()
    ivf.replace_invlists(invlists, True)
    invlists.this.disown()
    ivf.ntotal = int(sizes.sum())
    trained.ntotal = ivf.ntotal  # a pre-transform wrapper keeps its own count
    return trained


def read_index_file(path: str | Path) -> Any:
    """Read an index file; on-disk inverted lists are mapped read-only from the file's own folder
    (faiss prints a line to the C stdout when it does so: kept off this process's stdout, which
    a command's JSON output may be)."""
    with _c_stdout_silenced():
        return faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY)


@contextlib.contextmanager
def _c_stdout_silenced() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                _LIBC.fflush(None)
                os.dup2(saved, 1)
    finally:
        os.close(saved)


class MappedIndex(ops.SearchWrapper):
    """An on-disk index file searched ``batch`` queries at a time, its lists mapped afresh for each
    batch: the list pages a search touches leave the process with the batch, so searching many
    queries (tuning) keeps the process at one batch's share of the lists."""

    def __init__(self, path: str | Path, batch: int = 64) -> None:
        self.path, self.batch, self.params = Path(path), batch, ""
        self.inner = read_index_file(self.path)  # the quantizer and list offsets; for type and sizes
        self.ntotal, self.d = int(self.inner.ntotal), int(self.inner.d)

    def set_search_params(self, params: str) -> None:
        ops.set_search_params(self.inner, params)
        self.params = params

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, found = [], []
        for start in range(0, len(queries), self.batch):
            index = read_index_file(self.path)
            ops.set_search_params(index, self.params)
            s, f = index.search(np.ascontiguousarray(queries[start : start + self.batch]), k)
            scores.append(s)
            found.append(f)
            del index  # unmaps its lists
        if not scores:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        return np.concatenate(scores), np.concatenate(found)


def _npy_layout(path: Path) -> tuple[int, tuple[int, ...], np.dtype]:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        return f.tell(), shape, dtype


def iter_rows(path: str | Path, chunk: int | None = None) -> Iterator[np.ndarray]:
    """The rows of a 2-D ``.npy`` file, ``chunk`` (default :data:`CHUNK_ROWS`) at a time, by plain
    reads (no memory map)."""
    chunk = chunk or CHUNK_ROWS
    offset, shape, dtype = _npy_layout(Path(path))
    rows, dim = shape
    with open(path, "rb") as f:
        f.seek(offset)
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            yield np.frombuffer(f.read(n * dim * dtype.itemsize), dtype=dtype).reshape(n, dim)


def concat_vectors(parts: list[Part], out: str | Path, dim: int) -> Path:
    """Write the parts' vectors one after another as one ``(N, D) float16`` ``.npy``, streamed."""
    shapes = [_npy_layout(p.vectors)[1] for p in parts]
    total = sum(s[0] for s in shapes)
    with open(out, "wb") as f:
        descr = np.lib.format.dtype_to_descr(np.dtype(np.float16))
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": (total, dim)})
        for part in parts:
            for rows in iter_rows(part.vectors):
                f.write(np.ascontiguousarray(rows, dtype=np.float16).tobytes())
    return Path(out)


class FileRows:
    """Rows of a 2-D ``.npy`` file read on demand with ``pread``: ``rows[positions] -> (n, D)``.
    Unlike a memory map, the rows read do not stay in the process (a refine step over many
    tuning queries touches pages all over the file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset, self.shape, self.dtype = _npy_layout(self.path)

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        rows = np.asarray(positions, np.int64).ravel()
        width = int(self.shape[1]) * self.dtype.itemsize
        out = bytearray(len(rows) * width)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i, row in enumerate(rows.tolist()):
                out[i * width : (i + 1) * width] = os.pread(fd, width, self.offset + row * width)
        finally:
            os.close(fd)
        return np.frombuffer(bytes(out), dtype=self.dtype).reshape(len(rows), int(self.shape[1]))


def read_rows(path: str | Path, positions: np.ndarray) -> np.ndarray:
    """``(len(positions), D) float32`` rows of a ``.npy`` file, read with ``pread``."""
    return np.asarray(FileRows(path)[positions], dtype=np.float32)


def exact_search_files(
    path: str | Path, queries: np.ndarray, k: int, metric: ops.Metric
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force ``(scores, positions)`` of the ``k`` nearest rows of a ``.npy`` file to each query,
    one chunk of rows at a time (the exact search :func:`faiss_ops.exact_search` does in memory)."""
    best_s = np.full((len(queries), k), -np.inf if metric == "ip" else np.inf, np.float32)
    best_p = np.full((len(queries), k), -1, np.int64)
    start = 0
    for rows in iter_rows(path, EXACT_CHUNK_ROWS):
        scores, found = ops.exact_search(rows, queries, min(k, len(rows)), metric)  # float32 there
        found = np.where(found >= 0, found + start, -1)
        start += len(rows)
        all_s, all_p = np.concatenate([best_s, scores], axis=1), np.concatenate([best_p, found], axis=1)
        order = np.argsort(-all_s if metric == "ip" else all_s, axis=1, kind="stable")[:, :k]
        best_s, best_p = np.take_along_axis(all_s, order, axis=1), np.take_along_axis(all_p, order, axis=1)
    return best_s, best_p
