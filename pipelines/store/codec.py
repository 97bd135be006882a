"""The store's binary record and key layouts (pure numpy, no I/O).

Value (little-endian, one numpy structured dtype per (encoding, dim)):

    offset  field                 type
    0       magic                 u1   RECORD_MAGIC (the value layout's version)
    1       encoding              u1   0 = float16, 1 = int8 (value = code * scale)
    2       dim                   u2
    4       p_click               f4
    8       p_conversion          f4
    12      scale                 f4   1.0 for float16 records
    16      version_id            u8   blake2b-64 of model_version (strings interned per store)
    24      computed_at_ms        i8   epoch ms; the Redis newest-wins script reads it here
    32      history_watermark_ms  i8   NULL_MS when null
    40      embedding             f2[dim] or i1[dim]

so a 64-dim record is 168 bytes as float16 and 104 bytes as int8. Key: the user id
as 8 big-endian bytes for a user-level representation, followed by the ad id (8 more)
for a pair, so a user's records share a prefix.

A user's *context* record (opaque bytes a downstream ranker needs about the user, written
next to the representations) has the key ``user id + b"#"`` (9 bytes) and the value header
of :func:`context_dtype` (magic CONTEXT_MAGIC, ``version_id`` at 16, ``computed_at_ms`` at
24 as above, so newest-wins and expiry work unchanged), then the payload.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from functools import cache, cached_property
from typing import Literal, cast

import numpy as np

Encoding = Literal["float16", "int8"]
ENCODINGS: tuple[Encoding, ...] = ("float16", "int8")
Key = tuple[int, int | None]

RECORD_MAGIC = 1
CONTEXT_MAGIC = 2
CONTEXT_KEY_SUFFIX = b"#"
NULL_MS = np.iinfo(np.int64).min
HEADER_BYTES = 40
COMPUTED_AT_OFFSET = 24
_ENCODING_CODE: dict[str, int] = {"float16": 0, "int8": 1}
_CODE_DTYPE = {0: "<f2", 1: "i1"}
_USER = struct.Struct(">q")
_PAIR = struct.Struct(">qq")


@cache
def record_dtype(encoding: Encoding, dim: int) -> np.dtype:
    """The structured dtype of one stored value."""
    return np.dtype(
        [
            ("magic", "u1"),
            ("encoding", "u1"),
            ("dim", "<u2"),
            ("p_click", "<f4"),
            ("p_conversion", "<f4"),
            ("scale", "<f4"),
            ("version_id", "<u8"),
            ("computed_at_ms", "<i8"),
            ("history_watermark_ms", "<i8"),
            ("embedding", _CODE_DTYPE[_ENCODING_CODE[encoding]], (dim,)),
        ]
    )


def record_nbytes(encoding: Encoding, dim: int) -> int:
    """Bytes of one stored value (the key adds 8 for a user, 16 for a pair)."""
    return record_dtype(encoding, dim).itemsize


def version_id(model_version: str) -> int:
    """The 64-bit id under which ``model_version`` is stored in every record."""
    return int.from_bytes(hashlib.blake2b(model_version.encode(), digest_size=8).digest(), "little")


def encode_key(user_id: int, ad_id: int | None) -> bytes:
    """The key of ``(user_id, ad_id)``; ``ad_id`` None is the user-level representation."""
    return _USER.pack(user_id) if ad_id is None else _PAIR.pack(user_id, ad_id)


def encode_keys(user_id: np.ndarray, ad_id: np.ndarray, has_ad: np.ndarray) -> list[bytes]:
    """Vectorised :func:`encode_key`: ``user_id``, ``ad_id`` int64 (N,), ``has_ad`` bool (N,).

    The keys are cut from one big-endian buffer by numpy (``V16``/``V8`` items become bytes in C);
    only user-level keys among pairs are shortened one by one."""
    has_ad = np.asarray(has_ad, dtype=bool)
    if not has_ad.any():
        return cast(list[bytes], np.asarray(user_id, dtype=">i8").view("V8").tolist())
    packed = np.empty((len(user_id), 2), dtype=">i8")
    packed[:, 0] = user_id
    packed[:, 1] = ad_id
    keys = cast(list[bytes], packed.view("V16").ravel().tolist())
    for i in np.flatnonzero(~has_ad).tolist():
        keys[i] = keys[i][:8]
    return keys


def decode_key(key: bytes) -> Key:
    """Inverse of :func:`encode_key`."""
    if len(key) == 8:
        return _USER.unpack(key)[0], None
    user, ad = _PAIR.unpack(key)
    return user, ad


def encode_context_key(user_id: int) -> bytes:
    """The key of ``user_id``'s context record (sorted right after its user-level record)."""
    return _USER.pack(user_id) + CONTEXT_KEY_SUFFIX


CONTEXT_DTYPE = np.dtype(
    [
        ("magic", "u1"),
        ("reserved", "V7"),
        ("payload_bytes", "<u8"),
        ("version_id", "<u8"),
        ("computed_at_ms", "<i8"),
        ("history_watermark_ms", "<i8"),
    ]
)


def encode_contexts(
    payloads: Sequence[bytes], version_ids: np.ndarray, computed_at_ms: np.ndarray, history_watermark_ms: np.ndarray
) -> list[bytes]:
    """Pack N context records: the :data:`CONTEXT_DTYPE` header, then each payload."""
    head = np.zeros(len(payloads), dtype=CONTEXT_DTYPE)
    head["magic"] = CONTEXT_MAGIC
    head["payload_bytes"] = [len(p) for p in payloads]
    head["version_id"] = version_ids
    head["computed_at_ms"] = computed_at_ms
    head["history_watermark_ms"] = history_watermark_ms
    return [h.tobytes() + p for h, p in zip(head, payloads, strict=True)]


def decode_context(value: bytes) -> tuple[np.void, bytes]:
    """``(header, payload)`` of one stored context record."""
    if len(value) < CONTEXT_DTYPE.itemsize or value[0] != CONTEXT_MAGIC:
        raise ValueError(f"not a context record (magic {value[:1]!r}, {len(value)} bytes)")
    head = np.frombuffer(value, dtype=CONTEXT_DTYPE, count=1)[0]
    payload = value[CONTEXT_DTYPE.itemsize :]
    if len(payload) != int(head["payload_bytes"]):
        raise ValueError(f"context record truncated: {len(payload)} of {int(head['payload_bytes'])} payload bytes")
    return head, payload


def quantize_int8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: ``values`` (N, D) float -> codes int8 (N, D), scale float32 (N,).

    ``codes * scale`` reconstructs each value within ``scale / 2``; an all-zero row gets scale 1.
    """
    peak = np.abs(values).max(axis=1) if values.shape[1] else np.zeros(len(values))
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.rint(values / scale[:, None]), -127, 127).astype(np.int8)
    return codes, scale


def encode_records(
    *,
    encoding: Encoding,
    values: np.ndarray,
    codes: np.ndarray | None,
    scale: np.ndarray | None,
    p_click: np.ndarray,
    p_conversion: np.ndarray,
    version_ids: np.ndarray,
    computed_at_ms: np.ndarray,
    history_watermark_ms: np.ndarray,
) -> list[bytes]:
    """Pack N records into N byte strings of :func:`record_nbytes` each.

    ``values`` (N, D) float32 are the real embedding values. For ``int8``, ``codes``
    (N, D) int8 and ``scale`` (N,) are stored as given when not None (already-quantised
    input stays exact), otherwise ``values`` are quantised per row.
    """
    n, dim = values.shape
    rec = np.zeros(n, dtype=record_dtype(encoding, dim))
    rec["magic"] = RECORD_MAGIC
    rec["encoding"] = _ENCODING_CODE[encoding]
    rec["dim"] = dim
    if encoding == "float16":
        rec["embedding"] = values.astype(np.float16)
        rec["scale"] = 1.0
    else:
        if codes is None or scale is None:
            codes, scale = quantize_int8(values)
        rec["embedding"] = codes
        rec["scale"] = scale
    rec["p_click"] = p_click
    rec["p_conversion"] = p_conversion
    rec["version_id"] = version_ids
    rec["computed_at_ms"] = computed_at_ms
    rec["history_watermark_ms"] = history_watermark_ms
    buf = rec.tobytes()
    size = rec.dtype.itemsize
    return [buf[i * size : (i + 1) * size] for i in range(n)]


def computed_at_of(value: bytes) -> int:
    """The ``computed_at_ms`` of one encoded record (no full decode)."""
    return int.from_bytes(value[COMPUTED_AT_OFFSET : COMPUTED_AT_OFFSET + 8], "little", signed=True)


class DecodedRecords:
    """Present records of one read, decoded.

    ``values``: the stored value of each requested key, empty (``b""``) where absent (no
    record is empty). ``index`` (M,) are the positions of the present values in the request;
    fields are (M,) arrays in that order (``codes`` (M, D) float16, int8 codes widened
    exactly). A read whose records share one layout (the usual case) is decoded by one
    ``frombuffer`` over the joined values; mixed layouts are decoded group by group.
    """

    def __init__(self, values: Sequence[bytes]) -> None:
        lengths = np.fromiter(map(len, values), dtype=np.intp, count=len(values))
        blob = b"".join(values)
        present = lengths > 0
        self.index = np.flatnonzero(present)
        uniform = _decode_uniform(lengths[present], blob)
        if uniform is not None:
            self.dim, self._fields = uniform
            return
        members = [value for value in values if value]
        groups: dict[bytes, list[int]] = {}
        for i, value in enumerate(members):
            groups.setdefault(value[:4], []).append(i)
        dims = {int.from_bytes(head[2:4], "little") for head in groups}
        if len(dims) > 1:
            raise ValueError(f"one read returned embeddings of several dims {sorted(dims)}")
        self.dim = dims.pop() if dims else 0
        self.index = self.index[np.asarray([i for rows in groups.values() for i in rows], dtype=np.int64)]
        parts = [_decode(head, [members[i] for i in rows]) for head, rows in groups.items()]
        self._fields = {name: _concat([p[name] for p in parts], name, self.dim) for name in _FIELDS}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._fields[name]

    @cached_property
    def versions(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, which)``: the distinct version ids and, per record, the index of its own in ``ids``."""
        found = self._fields["version_id"]
        if len(found) and (found == found[0]).all():  # the usual read: one model version
            return found[:1].copy(), np.zeros(len(found), dtype=np.intp)
        ids, which = np.unique(found, return_inverse=True)
        return ids, which.reshape(-1)


def _layout(head: bytes) -> np.dtype:
    """The record dtype named by a value's first 4 bytes (magic, encoding, dim)."""
    if head[0] != RECORD_MAGIC or head[1] not in _CODE_DTYPE:
        raise ValueError(f"unknown record layout (magic {head[0]}, encoding {head[1]})")
    return record_dtype("float16" if head[1] == 0 else "int8", int.from_bytes(head[2:4], "little"))


def _decode(head: bytes, members: list[bytes]) -> dict[str, np.ndarray]:
    return _fields_of(np.frombuffer(b"".join(members), dtype=_layout(head)), head[1] == 1)


def _fields_of(rec: np.ndarray, int8: bool) -> dict[str, np.ndarray]:
    out = {name: rec[name] for name in _FIELDS if name not in ("codes", "int8")}
    out["codes"] = rec["embedding"].astype(np.float16, copy=False)  # float16: a view, int8: widened
    out["int8"] = np.full(len(rec), int8)
    return out


def _decode_uniform(sizes: np.ndarray, blob: bytes) -> tuple[int, dict[str, np.ndarray]] | None:
    """``(dim, fields)`` when every value (``sizes`` bytes each, joined in ``blob``) has the first one's
    layout (length and header), else None."""
    if not len(sizes):
        return None
    head = blob[:4]
    dtype = _layout(head)
    if (sizes != dtype.itemsize).any():
        return None
    rec = np.frombuffer(blob, dtype=dtype)
    if not ((rec["magic"] == head[0]) & (rec["encoding"] == head[1]) & (rec["dim"] == rec["dim"][0])).all():
        return None
    return int(rec["dim"][0]), _fields_of(rec, head[1] == 1)


_FIELDS = (
    "p_click",
    "p_conversion",
    "scale",
    "version_id",
    "computed_at_ms",
    "history_watermark_ms",
    "codes",
    "int8",
)


def _concat(parts: list[np.ndarray], name: str, dim: int) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    if name == "codes":
        return np.zeros((0, dim), dtype=np.float16)
    return np.zeros(0, dtype={"int8": np.bool_, "version_id": np.uint64}.get(name, np.float64))
