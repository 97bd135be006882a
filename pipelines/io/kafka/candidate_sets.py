"""Candidate sets (CANDIDATE_SET layout) on a topic: JSON messages, key = user_id.

One JSON object per message, so a ranking service in any language can write them::

    {"request_id": "c2e1331152a7d435", "user_id": 42, "surface": "instagram_reels",
     "stage": "early", "stage_time": 1777593984724, "needed_by": 1777593984762,
     "ad_ids": [2000000123, 2000000456]}

Times are integer milliseconds since the epoch; ``surface`` and ``stage`` are the
lower-case names of :data:`pipelines.schemas.enums.SURFACES` and :data:`pipelines.schemas.enums.FUNNEL_STAGES`.
:func:`decode_candidate_sets` turns a batch of payloads back into a CANDIDATE_SET table
and, for every payload it cannot read, a reason (nothing is dropped silently).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.schemas.enums import FUNNEL_STAGE_CODE, FUNNEL_STAGES, SURFACE_CODE, SURFACES
from pipelines.schemas.layouts import CANDIDATE_SET

__all__ = ["DecodedCandidateSets", "candidate_sets_to_wire", "decode_candidate_sets"]

Message = tuple[bytes | None, bytes]
_FIELDS = ("request_id", "user_id", "surface", "stage", "stage_time", "needed_by", "ad_ids")


def candidate_sets_to_wire(table: pa.Table) -> list[Message]:
    """(user id, JSON) per CANDIDATE_SET row."""
    rows = table.select(list(_FIELDS)).to_pydict()
    times = {name: table.column(name).cast(pa.int64()).to_pylist() for name in ("stage_time", "needed_by")}
    out: list[Message] = []
    for i, user in enumerate(rows["user_id"]):
        value = {
            "request_id": rows["request_id"][i],
            "user_id": user,
            "surface": SURFACES[rows["surface"][i]],
            "stage": FUNNEL_STAGES[rows["stage"][i]],
            "stage_time": times["stage_time"][i],
            "needed_by": times["needed_by"][i],
            "ad_ids": rows["ad_ids"][i],
        }
        out.append((str(user).encode(), json.dumps(value, separators=(",", ":")).encode()))
    return out


#: reason code of an unreadable candidate-set message -> when it applies (the `solaris` job counts
#: them per reason and, with ``--dead-letters``, writes them; the reference page is generated from it)
REASONS: dict[str, str] = {
    "bad_json": "the message is not a JSON object",
    "missing_field": "a field of the candidate set is absent or null",
    "bad_enum": "`surface` or `stage` is not one of the known lower-case values",
    "bad_type": "`request_id` is not a string, or an id, a time or an ad id is not a 64-bit integer",
}


@dataclass(frozen=True)
class DecodedCandidateSets:
    """``table`` (CANDIDATE_SET) holds the good payloads, row i from payload ``rows[i]``;
    ``bad`` maps each unreadable payload's position to its reason."""

    table: pa.Table
    rows: np.ndarray
    bad: dict[int, str]


def decode_candidate_sets(payloads: list[bytes]) -> DecodedCandidateSets:
    """CANDIDATE_SET rows of the JSON ``payloads``; a payload that is not a valid candidate set gets a
    reason: ``bad_json``, ``missing_field``, ``bad_enum`` or ``bad_type``."""
    columns: dict[str, list[Any]] = {name: [] for name in _FIELDS}
    rows: list[int] = []
    bad: dict[int, str] = {}
    for position, payload in enumerate(payloads):
        reason, parsed = _parse(payload)
        if reason is not None:
            bad[position] = reason
            continue
        rows.append(position)
        for name in _FIELDS:
            columns[name].append(parsed[name])
    table = pa.table({name: pa.array(columns[name], type=CANDIDATE_SET.schema.field(name).type) for name in _FIELDS})
    return DecodedCandidateSets(table.cast(CANDIDATE_SET.schema), np.asarray(rows, np.int64), bad)


def _parse(payload: bytes) -> tuple[str | None, dict[str, Any]]:
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "bad_json", {}
    if not isinstance(value, dict):
        return "bad_json", {}
    if any(value.get(name) is None for name in _FIELDS):
        return "missing_field", {}
    if value["surface"] not in SURFACE_CODE or value["stage"] not in FUNNEL_STAGE_CODE:
        return "bad_enum", {}
    ints = [value["user_id"], value["stage_time"], value["needed_by"]]
    ads = value["ad_ids"]
    if (
        not isinstance(value["request_id"], str)
        or not all(_is_int(v) for v in ints)
        or not isinstance(ads, list)
        or not all(_is_int(a) for a in ads)
    ):
        return "bad_type", {}
    return None, {
        **value,
        "surface": SURFACE_CODE[value["surface"]],
        "stage": FUNNEL_STAGE_CODE[value["stage"]],
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
