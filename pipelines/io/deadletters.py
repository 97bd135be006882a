"""Dead letters: every record a stage cannot use, with a reason code, a detail, the raw payload
and where it came from (DEAD_LETTER layout). Pure Arrow; the Beam writer is in
:mod:`pipelines.io.transforms`."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from pipelines.schemas.layouts import DEAD_LETTER

__all__ = ["Reject", "dead_letter_table"]

#: One rejected record: (reason, detail, payload, source).
Reject = tuple[str, str, bytes, str]


def dead_letter_table(stage: str, rejects: Sequence[Reject]) -> pa.Table:
    """DEAD_LETTER table from (reason, detail, payload, source) tuples."""
    reason, detail, payload, source = (list(c) for c in zip(*rejects, strict=True)) if rejects else ([], [], [], [])
    return pa.Table.from_arrays(
        [
            pa.array([stage] * len(reason), pa.string()),
            pa.array(reason, pa.string()),
            pa.array(detail, pa.string()),
            pa.array(payload, pa.binary()),
            pa.array(source, pa.string()),
        ],
        schema=DEAD_LETTER.schema,
    )
