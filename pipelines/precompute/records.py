"""Model outputs → REPRESENTATION rows (pure): float16 embeddings, scores, provenance."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from pipelines.model.gem import Representations
from pipelines.schemas.layouts import TIME, representation_schema


def representation_table(
    reps: Representations, *, model_version: str, watermark_ms: int | np.ndarray | None, computed_at_ms: int
) -> pa.Table:
    """A REPRESENTATION table: pair rows (ad_id set) carry the pair embedding, user-level rows
    (ad_id -1 in ``reps``, null here) the L2-normalised user embedding. ``watermark_ms`` is one
    history watermark for every row, or one per row (B,)."""
    is_user = reps.ad_id < 0
    dim = reps.pair_embedding.shape[1]
    embedding = np.where(is_user[:, None], reps.user_embedding, reps.pair_embedding).astype(np.float16)
    n = len(reps.user_id)
    flat = pa.array(embedding.reshape(-1), type=pa.float16())
    return pa.table(
        {
            "user_id": pa.array(reps.user_id, pa.int64()),
            "ad_id": pa.array(reps.ad_id, pa.int64(), mask=is_user),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, dim),
            "embedding_scale": pa.nulls(n, pa.float32()),
            "p_click": pa.array(reps.p_click, pa.float32()),
            "p_conversion": pa.array(reps.p_conversion, pa.float32()),
            "model_version": pa.array([model_version] * n, pa.string()),
            "history_watermark": _times(watermark_ms, n),
            "computed_at": _times(computed_at_ms, n),
        },
        schema=representation_schema(dim),
    )


def _times(ms: int | np.ndarray | None, n: int) -> pa.Array:
    values = np.asarray(ms, np.int64) if isinstance(ms, np.ndarray) else [ms] * n
    return pa.array(values, pa.int64()).cast(TIME)


def latest_per_key(table: pa.Table, request_ms: np.ndarray) -> tuple[pa.Table, int]:
    """One row per (user_id, ad_id): the one from the latest request (ties: the last row).

    Returns the table sorted by (user_id, ad_id) and how many rows were superseded.
    """
    ad = table.column("ad_id").to_numpy(zero_copy_only=False)
    ad = np.where(np.isnan(ad), -1, ad).astype(np.int64) if ad.dtype.kind == "f" else ad.astype(np.int64)
    user = table.column("user_id").to_numpy()
    order = np.lexsort((np.arange(len(user)), request_ms, ad, user))
    u, a = user[order], ad[order]
    last = np.r_[(u[1:] != u[:-1]) | (a[1:] != a[:-1]), True]
    keep = order[last]
    return table.take(pa.array(keep)), int(len(order) - len(keep))


def concat_representations(parts: Sequence[Representations]) -> Representations:
    """``parts`` as one :class:`Representations`, rows in order (each field concatenated once)."""
    if not parts:
        raise ValueError("concat_representations needs at least one part")
    if len(parts) == 1:
        return parts[0]
    return Representations(
        **{name: np.concatenate([getattr(r, name) for r in parts]) for name in Representations.__dataclass_fields__}
    )


def slice_representations(reps: Representations, start: int, stop: int) -> Representations:
    """Rows ``[start, stop)`` as arrays that own their memory (no view of the whole batch)."""
    return Representations(
        **{name: np.array(getattr(reps, name)[start:stop], copy=True) for name in reps.__dataclass_fields__}
    )
