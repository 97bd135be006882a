"""What a store read returns: columns aligned with the requested keys, with ages and staleness."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from pipelines.schemas.layouts import representation_schema
from pipelines.store.codec import NULL_MS, DecodedRecords, Key

__all__ = ["ContextRead", "ReadResult", "RequestRead"]


@dataclass(frozen=True)
class ReadResult:
    """N requested keys and what the store holds for each, row i answering ``keys[i]``
    (kept as columns: ``user_id``, ``ad_id`` int64 (0 for user-level rows) and ``has_ad``
    bool (N,); :attr:`keys` builds the tuples on demand).

    ``found`` (N,) bool: False for a missing key and for one past the store's
    ``expire_after_s``. ``stale`` (N,) bool: found and older than ``max_age_s`` (a
    stale row still carries its data and age, so a caller may use it under a looser
    bound, but it is never ``fresh``). Missing rows hold NaN floats, ``NULL_MS``
    times, None versions. ``codes`` (N, D) float16 is the embedding as stored (int8
    codes widened exactly, with ``embedding_scale`` (N,) set; NaN for float16 rows);
    :attr:`embedding` (N, D) float32 is the decoded value. ``age_s`` is now minus
    ``computed_at`` by the store's clock.
    """

    user_id: np.ndarray
    ad_id: np.ndarray
    has_ad: np.ndarray
    found: np.ndarray
    codes: np.ndarray
    embedding_scale: np.ndarray
    p_click: np.ndarray
    p_conversion: np.ndarray
    model_version: np.ndarray
    computed_at_ms: np.ndarray
    history_watermark_ms: np.ndarray
    age_s: np.ndarray
    stale: np.ndarray
    max_age_s: float | None

    @classmethod
    def build(
        cls,
        user_id: np.ndarray,
        ad_id: np.ndarray,
        has_ad: np.ndarray,
        decoded: DecodedRecords,
        order: np.ndarray,
        versions: dict[int, str],
        *,
        now_s: float,
        max_age_s: float | None,
        expire_after_s: float | None,
    ) -> ReadResult:
        """Scatter decoded records into rows aligned with the keys; apply expiry and staleness.
        ``order`` (N,): the row of each value read (the keys were read in this order)."""
        n, dim = len(user_id), decoded.dim
        age = now_s - decoded["computed_at_ms"] / 1000.0
        live: slice | np.ndarray = slice(None) if expire_after_s is None else age <= expire_after_s
        at = order[decoded.index[live]]
        found = np.zeros(n, dtype=bool)
        found[at] = True
        codes = np.zeros((n, dim), dtype=np.float16)
        codes[at] = decoded["codes"][live]
        scale = _full(n, np.nan, np.float32, at, np.where(decoded["int8"], decoded["scale"], np.nan)[live])
        ages = _full(n, np.nan, np.float64, at, age[live])
        ids, which = decoded.versions
        names = np.empty(len(ids), dtype=object)
        names[:] = [versions.get(v) for v in ids.tolist()]
        version = np.full(n, None, dtype=object)
        version[at] = names[which[live]]
        return cls(
            user_id=user_id,
            ad_id=ad_id,
            has_ad=has_ad,
            found=found,
            codes=codes,
            embedding_scale=scale,
            p_click=_full(n, np.nan, np.float32, at, decoded["p_click"][live]),
            p_conversion=_full(n, np.nan, np.float32, at, decoded["p_conversion"][live]),
            model_version=version,
            computed_at_ms=_full(n, NULL_MS, np.int64, at, decoded["computed_at_ms"][live]),
            history_watermark_ms=_full(n, NULL_MS, np.int64, at, decoded["history_watermark_ms"][live]),
            age_s=ages,
            stale=found & (ages > max_age_s) if max_age_s is not None else np.zeros(n, dtype=bool),
            max_age_s=max_age_s,
        )

    def __len__(self) -> int:
        return len(self.user_id)

    @cached_property
    def keys(self) -> tuple[Key, ...]:
        """The requested keys, ``(user_id, ad_id)``, ``ad_id`` None for user-level ones."""
        return tuple(
            (u, a if has else None)
            for u, a, has in zip(self.user_id.tolist(), self.ad_id.tolist(), self.has_ad.tolist(), strict=True)
        )

    @property
    def fresh(self) -> np.ndarray:
        """(N,) bool: found and not stale."""
        return self.found & ~self.stale

    def stale_after(self, max_age_s: float) -> np.ndarray:
        """(N,) bool: found and older than ``max_age_s`` (another bound than the store's)."""
        return self.found & (self.age_s > max_age_s)

    @cached_property
    def embedding(self) -> np.ndarray:
        """(N, D) float32 decoded embeddings; NaN rows where not found."""
        values = self.codes.astype(np.float32)
        values *= np.where(np.isnan(self.embedding_scale), 1.0, self.embedding_scale)[:, None]
        values[~self.found] = np.nan
        return values

    def take(self, index: np.ndarray | slice) -> ReadResult:
        """The rows at ``index`` (an int array or a slice), as a ReadResult."""
        return ReadResult(
            user_id=self.user_id[index],
            ad_id=self.ad_id[index],
            has_ad=self.has_ad[index],
            found=self.found[index],
            codes=self.codes[index],
            embedding_scale=self.embedding_scale[index],
            p_click=self.p_click[index],
            p_conversion=self.p_conversion[index],
            model_version=self.model_version[index],
            computed_at_ms=self.computed_at_ms[index],
            history_watermark_ms=self.history_watermark_ms[index],
            age_s=self.age_s[index],
            stale=self.stale[index],
            max_age_s=self.max_age_s,
        )

    def to_arrow(self) -> pa.Table:
        """The found rows in the REPRESENTATION layout, plus ``age_s`` and ``stale`` columns."""
        rows = np.flatnonzero(self.found)
        dim = self.codes.shape[1] or 1  # nothing found: no dim known, any will do for 0 rows
        watermark = self.history_watermark_ms[rows]
        flat = pa.array(self.codes[rows].reshape(-1), type=pa.float16())
        columns = [
            pa.array(self.user_id[rows], pa.int64()),
            pa.array(self.ad_id[rows], pa.int64(), mask=~self.has_ad[rows]),
            pa.FixedSizeListArray.from_arrays(flat, dim),
            pa.array(self.embedding_scale[rows], pa.float32(), mask=np.isnan(self.embedding_scale[rows])),
            pa.array(self.p_click[rows], pa.float32()),
            pa.array(self.p_conversion[rows], pa.float32()),
            pa.array(self.model_version[rows].tolist(), pa.string()),
            pa.array(watermark, pa.int64(), mask=watermark == NULL_MS).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(self.computed_at_ms[rows], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        ]
        table = pa.Table.from_arrays(columns, schema=representation_schema(dim))
        table = table.append_column("age_s", pa.array(self.age_s[rows], pa.float64()))
        return table.append_column("stale", pa.array(self.stale[rows], pa.bool_()))


@dataclass(frozen=True)
class RequestRead:
    """One request's reads from a single round trip (see ``OnlineStore.read_for_request``).

    ``pairs`` (A,): row j is (user_id, ad_ids[j]). ``user`` (1,): (user_id, None).
    ``neighbor_pairs`` (K*A,): row k*A + j is (neighbor_ids[k], ad_ids[j]). ``context``: the
    user's context record when asked for (``with_context``), else None.
    """

    user_id: int
    ad_ids: np.ndarray
    neighbor_ids: np.ndarray
    pairs: ReadResult
    user: ReadResult
    neighbor_pairs: ReadResult
    context: ContextRead | None = None


@dataclass(frozen=True)
class ContextRead:
    """A user's context record: ``payload`` as written (``b""`` when not ``found``: missing or past
    ``expire_after_s``), its ``age_s`` (NaN when missing), ``stale`` (older than ``max_age_s``) and
    ``model_version``."""

    found: bool
    payload: bytes
    age_s: float
    stale: bool
    model_version: str | None

    @classmethod
    def missing(cls) -> ContextRead:
        return cls(False, b"", float("nan"), False, None)


def _full(n: int, fill: float, dtype: type, at: np.ndarray, values: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.full(n, fill, dtype=dtype)
    out[at] = values
    return out
