"""A batch of byte payloads (JSONL lines, Kafka message values) in one buffer.

The shape Arrow's JSON reader takes: payloads separated by one newline each, so a
whole batch is parsed without copying it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Payloads"]


@dataclass(frozen=True)
class Payloads:
    """``n`` payloads in ``data``, each followed by one ``b"\\n"``, with only blanks between them.

    ``starts`` and ``lengths`` are ``(n,)`` int64 arrays: payload ``i`` is
    ``data[starts[i] : starts[i] + lengths[i]]``, the byte after it is the
    separator, and any bytes from there to the next payload are spaces (Kafka
    responses keep their values in place, record headers blanked:
    :mod:`pipelines.io.kafka.records`; :meth:`from_list` leaves no gaps). The first
    payload starts at 0 and the last separator ends ``data``. This is the shape
    Arrow's JSON reader takes, so a batch is parsed without copying it again.
    """

    data: bytes
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_list(cls, payloads: Sequence[bytes]) -> Payloads:
        """Payloads from Python bytes objects (JSONL lines, Kafka message values)."""
        lengths = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        starts = np.zeros(len(payloads), dtype=np.int64)
        if len(payloads) > 1:
            np.cumsum(lengths[:-1] + 1, out=starts[1:])
        data = b"\n".join([*payloads, b""])  # one copy, with the last separator
        return cls(data, starts, lengths)

    @classmethod
    def concat(cls, parts: Sequence[Payloads]) -> Payloads:
        """The payloads of ``parts`` one after the other (one copy)."""
        if len(parts) <= 1:
            return parts[0] if parts else cls.from_list([])
        shifts = np.cumsum([0, *(len(p.data) for p in parts[:-1])])
        return cls(
            b"".join(p.data for p in parts),
            np.concatenate([p.starts + s for p, s in zip(parts, shifts, strict=True)]),
            np.concatenate([p.lengths for p in parts]),
        )

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def spans(self) -> np.ndarray:
        """``(n,)``: bytes from each payload's start to the next one's (or to the end of ``data``)."""
        return np.diff(self.starts, append=len(self.data))

    def get(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self.data[start : start + int(self.lengths[i])]

    def take(self, indices: np.ndarray) -> list[bytes]:
        return [self.get(int(i)) for i in indices]

    def select(self, indices: np.ndarray) -> Payloads:
        """The payloads at ``indices`` (increasing), packed into a new buffer."""
        if len(indices) == len(self):
            return self
        raw = np.frombuffer(self.data, dtype=np.uint8)
        keep = np.zeros(len(self), dtype=bool)
        keep[indices] = True
        spans = self.spans
        data = raw[np.repeat(keep, spans)].tobytes()
        starts = np.zeros(len(indices), dtype=np.int64)
        if len(indices) > 1:
            np.cumsum(spans[indices][:-1], out=starts[1:])
        return Payloads(data, starts, self.lengths[indices])

    def slice(self, lo: int, hi: int) -> Payloads:
        """Payloads ``lo:hi`` (``0 <= lo < hi <= n``), copied out of ``data``."""
        if lo == 0 and hi == len(self):
            return self
        begin, end = int(self.starts[lo]), int(self.starts[hi - 1] + self.lengths[hi - 1]) + 1
        return Payloads(self.data[begin:end], self.starts[lo:hi] - begin, self.lengths[lo:hi])
