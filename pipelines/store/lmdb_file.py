"""Check an LMDB ``data.mdb`` before it is memory-mapped: a truncated or foreign file must be an
error naming it, never a SIGBUS when a page past the end of the file is touched.

The file starts with two meta pages (LMDB 0.9 layout, 64-bit): a 16-byte page header, then
``mm_magic`` (0xBEEFC0DE), ``mm_version``, ``mm_address``, ``mm_mapsize``, two ``MDB_db``
records (the first one's ``md_pad`` holds the page size), ``mm_last_pg`` and ``mm_txnid``.
The meta with the larger ``txnid`` is the one LMDB uses; every page up to its
``last_pg`` must be in the file.
"""

from __future__ import annotations

import os
import struct

from pipelines.errors import PipelinesError

__all__ = ["StoreCorruptError", "check_data_file"]

MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16
_META = struct.Struct("<IIQQ")  # magic, version, address, mapsize
_PSIZE_AT = _PAGE_HEADER + 24  # md_pad of the free-pages DB
_LAST_AT = _PAGE_HEADER + 120  # mm_last_pg, mm_txnid
_MIN_PAGE, _MAX_PAGE = 512, 1 << 16


class StoreCorruptError(PipelinesError):
    """A store's files are damaged (truncated, overwritten, not a store)."""


def _meta(head: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txnid) of the meta page at ``offset``, or None when it is not one."""
    if len(head) < offset + _LAST_AT + 16:
        return None
    magic, _, _, _ = _META.unpack_from(head, offset + _PAGE_HEADER)
    if magic != MAGIC:
        return None
    (psize,) = struct.unpack_from("<I", head, offset + _PSIZE_AT)
    last_pg, txnid = struct.unpack_from("<QQ", head, offset + _LAST_AT)
    return psize, last_pg, txnid


def check_data_file(directory: str) -> None:
    """Raise :class:`StoreCorruptError` naming ``<directory>/data.mdb`` when it is shorter than its
    newest meta page says, or not an LMDB file. A missing or empty file (a new store) passes."""
    path = os.path.join(directory, "data.mdb")
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return
    if size == 0:
        return
    fix = f"restore {path} from a copy, or move the folder aside and run precompute again to rebuild the store"
    with open(path, "rb") as f:
        head = f.read(2 * _MAX_PAGE)
    first = _meta(head, 0)
    if first is None or not _MIN_PAGE <= first[0] <= _MAX_PAGE or first[0] & (first[0] - 1):
        raise StoreCorruptError(f"{path} is not an LMDB data file (no valid meta page at byte 0). Fix: {fix}")
    psize = first[0]
    second = _meta(head, psize)
    metas = [m for m in (first, second) if m is not None and m[0] == psize]
    _, last_pg, txnid = max(metas, key=lambda m: m[2])
    needed = (last_pg + 1) * psize
    if size < needed:
        raise StoreCorruptError(
            f"{path} is truncated: {size:,} bytes, but its last commit (txn {txnid}) uses pages up to "
            f"{last_pg} ({needed:,} bytes). Fix: {fix}"
        )
