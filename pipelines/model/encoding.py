"""The user side of a forward, and a bounded cache of it for candidate sets asked again.

A candidate set's pairs read one history. Everything the model computes from that history
alone (its tokens after the sequence layers, which target attention queries; the summary;
the user representation) is a :class:`UserEncoding`. When the same user is asked again
before the history changes, :class:`EncodingCache` hands back that encoding and only the
per-ad work runs.

The cache is exact, not approximate: an entry's key is the user and a digest of the
history's discrete token inputs (:meth:`pipelines.model.embed.TokenEmbedder.sequence_ids`,
age and gap buckets included), so a new event, or time moving an event into another age
bucket, is a miss, and the new encoding replaces the user's old one. Entries also expire
after ``max_age_s`` and the least recently used go first past ``capacity``, so the cache's
memory is bounded by its capacity, not by the number of users.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipelines.model.jagged import gather_index, lengths_to_offsets

__all__ = ["EncodingCache", "UserEncoding", "history_digests"]


@dataclass
class UserEncoding:
    """Per history (H of them): ``tokens: (L, D)`` after the sequence layers, jagged by
    ``offsets: (H+1,)``; ``summary: (H, K, D)``; ``user: (H, R)`` the user representation."""

    tokens: torch.Tensor
    offsets: torch.Tensor
    summary: torch.Tensor
    user: torch.Tensor

    @property
    def num_histories(self) -> int:
        return int(self.offsets.numel() - 1)

    def select(self, rows: torch.Tensor) -> UserEncoding:
        """The encodings of the histories ``rows: (H',) int64``, in that order."""
        index, offsets = gather_index(self.offsets, rows)
        return UserEncoding(
            self.tokens.index_select(0, index),
            offsets,
            self.summary.index_select(0, rows),
            self.user.index_select(0, rows),
        )

    @staticmethod
    def concat(parts: Sequence[UserEncoding]) -> UserEncoding:
        """The histories of ``parts``, one after another."""
        lengths = torch.cat([p.offsets[1:] - p.offsets[:-1] for p in parts])
        return UserEncoding(
            torch.cat([p.tokens for p in parts]),
            lengths_to_offsets(lengths),
            torch.cat([p.summary for p in parts]),
            torch.cat([p.user for p in parts]),
        )


def history_digests(user_id: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> list[tuple[int, bytes]]:
    """``(user, 16-byte digest of the history's token inputs)`` per history: ``user_id: (H,)``,
    ``ids: (L, F) int64`` (:meth:`~pipelines.model.embed.TokenEmbedder.sequence_ids`), ``offsets: (H+1,)``."""
    users = user_id.cpu().numpy()
    bounds = offsets.cpu().numpy()
    flat = np.ascontiguousarray(ids.cpu().numpy())
    return [
        (int(users[h]), hashlib.blake2b(flat[bounds[h] : bounds[h + 1]].tobytes(), digest_size=16).digest())
        for h in range(len(users))
    ]


class EncodingCache:
    """Each user's latest :class:`UserEncoding` (one history each), by ``(user, digest)``.

    ``capacity`` users at most (the least recently used go first), each for ``max_age_s`` at
    most; a user's entry is replaced when the same user comes with another digest. Counts
    ``hits``, ``misses`` and ``tokens_saved`` (history tokens not encoded again). Not
    thread-safe: its callers hold the model one thread at a time.
    """

    def __init__(self, capacity: int, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        self.capacity, self.max_age_s, self._clock = capacity, max_age_s, clock
        self._entries: OrderedDict[int, tuple[bytes, float, UserEncoding]] = OrderedDict()
        self.hits = self.misses = self.tokens_saved = 0

    def get(self, user: int, digest: bytes) -> UserEncoding | None:
        """The user's encoding if it was stored for this digest less than ``max_age_s`` ago."""
        entry = self._entries.get(user)
        if entry is None or entry[0] != digest or self._clock() - entry[1] > self.max_age_s:
            self.misses += 1
            return None
        self._entries.move_to_end(user)
        self.hits += 1
        self.tokens_saved += int(entry[2].tokens.shape[0])
        return entry[2]

    def put(self, user: int, digest: bytes, encoding: UserEncoding) -> None:
        """Store ``encoding`` (one history) as the user's, replacing any other."""
        if encoding.num_histories != 1:
            raise ValueError(f"an entry holds one history, got {encoding.num_histories}")
        self._entries[user] = (digest, self._clock(), encoding)
        self._entries.move_to_end(user)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def of(cls, capacity: int, max_age_s: float) -> EncodingCache | None:
        """A cache of ``capacity`` users, or None for 0 (``--encoding-cache 0``: every set encodes its history)."""
        return cls(capacity, max_age_s) if capacity else None
