"""Jagged sequences: ``values (L, ...)`` with ``offsets (B+1,)``, and their block layout.

User ``b`` owns ``values[offsets[b]:offsets[b+1]]``. Nothing here pads to the batch's
longest sequence: attention works on fixed-size blocks that belong to exactly one
user, so padding is at most ``block_size - 1`` slots per user.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """``lengths: (B,)`` -> ``offsets: (B+1,)`` (int64, starting at 0)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.to(torch.int64), dim=0, out=offsets[1:])
    return offsets


def segment_ids(offsets: torch.Tensor) -> torch.Tensor:
    """``offsets: (B+1,)`` -> ``ids: (L,)``, the sequence each value belongs to."""
    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)


def gather_index(offsets: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences ``rows: (R,)`` (any order, repeats allowed) of a jagged batch as a new one:
    ``index: (L',)`` of their values in ``values`` and their ``offsets: (R+1,)``."""
    lengths = (offsets[1:] - offsets[:-1])[rows]
    new_offsets = lengths_to_offsets(lengths)
    total = int(new_offsets[-1].item())
    index = torch.repeat_interleave(offsets[:-1][rows] - new_offsets[:-1], lengths)
    return index + torch.arange(total, device=offsets.device), new_offsets


def to_padded_dense(
    values: torch.Tensor, offsets: torch.Tensor, max_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``values: (L, *F)`` -> ``padded: (B, T, *F)`` and ``mask: (B, T)`` (True = real value).

    ``T`` is ``max_len`` or the longest sequence. Used by the reference path and the
    padded baseline only.
    """
    lengths = offsets[1:] - offsets[:-1]
    batch = lengths.numel()
    width = int(lengths.max().item()) if max_len is None and batch else int(max_len or 0)
    positions = torch.arange(width, device=values.device)
    mask = positions[None, :] < lengths[:, None]
    padded = values.new_zeros((batch, width, *values.shape[1:]))
    padded[mask] = values
    return padded, mask


def from_dense(padded: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`to_padded_dense`: ``(B, T, *F), (B, T)`` -> ``values (L, *F), offsets (B+1,)``."""
    return padded[mask], lengths_to_offsets(mask.sum(dim=1))


@dataclass(frozen=True)
class BlockLayout:
    """Where each token of a jagged batch sits once cut into per-user blocks.

    Blocks are aligned to the END of each sequence (the most recent event closes the
    last block), so a user's first block holds the remainder and is left-padded.

    Fields: ``slot: (L,)`` index of each token in the flat ``(NB * S)`` block buffer;
    ``source: ((NB + 1) * S,)`` for each slot of a buffer with one leading empty block,
    the token it holds (0 for an empty slot), so both directions are an
    ``index_select`` (row copies; far cheaper on CPU than an indexed write);
    ``valid: (NB, S)`` which slots hold a token; ``block_user: (NB,)`` owner of each
    block; ``has_previous: (NB,)`` whether the block before belongs to the same user;
    ``num_users`` = B.
    """

    block_size: int
    slot: torch.Tensor
    source: torch.Tensor
    valid: torch.Tensor
    block_user: torch.Tensor
    has_previous: torch.Tensor
    num_users: int
    _chunks: dict[int, list[BlockChunk]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_blocks(self) -> int:
        return int(self.block_user.numel())

    @property
    def previous_valid(self) -> torch.Tensor:
        """``(NB, S)``: the slot mask of each block's predecessor, all False across a user boundary."""
        return torch.cat([self.valid[:1], self.valid[:-1]]) & self.has_previous[:, None]

    def chunks(self, max_blocks: int) -> list[BlockChunk]:
        """The blocks cut into runs of at most ``max_blocks`` (cached per size).

        Block attention runs chunk by chunk so that its per-token intermediates stay in
        cache on CPU; unchunked, the cost per token grows once they outgrow the cache.
        """
        if max_blocks not in self._chunks:
            starts = lengths_to_offsets(self.valid.sum(dim=1)).tolist()  # first token of each block, once
            self._chunks[max_blocks] = [
                BlockChunk.build(self, a, min(a + max_blocks, self.num_blocks), starts)
                for a in range(0, self.num_blocks, max_blocks)
            ]
        return self._chunks[max_blocks]

    @classmethod
    def build(cls, offsets: torch.Tensor, block_size: int) -> BlockLayout:
        """Cost O(L + NB); ``offsets: (B+1,)`` must be non-decreasing (not re-checked here)."""
        device = offsets.device
        lengths = offsets[1:] - offsets[:-1]
        blocks_per_user = (lengths + block_size - 1) // block_size
        block_start = lengths_to_offsets(blocks_per_user)
        users = torch.arange(lengths.numel(), device=device)
        block_user = torch.repeat_interleave(users, blocks_per_user)
        first_block = block_start[:-1][block_user]
        block_index = torch.arange(block_user.numel(), device=device)
        has_previous = block_index > first_block
        pad = blocks_per_user * block_size - lengths
        token_user = torch.repeat_interleave(users, lengths)
        local = torch.arange(int(offsets[-1].item()), device=device) - offsets[:-1][token_user]
        slot = block_start[:-1][token_user] * block_size + pad[token_user] + local
        total = int(offsets[-1].item())
        source = torch.full(((block_user.numel() + 1) * block_size,), -1, dtype=torch.int64, device=device)
        source[slot + block_size] = torch.arange(total, device=device)
        valid = source[block_size:].view(-1, block_size) >= 0
        # empty slots repeat token 0: masked everywhere they could matter, so no zero row is needed
        return cls(block_size, slot, source.clamp_min(0), valid, block_user, has_previous, int(lengths.numel()))

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``values: (L, *F)`` with L > 0 -> ``blocks: (NB, S, *F)``.

        Empty slots (``~valid``) hold arbitrary finite values (a copy of token 0):
        callers mask them.
        """
        return values.index_select(0, self.source[self.block_size :]).view(-1, self.block_size, *values.shape[1:])

    def gather(self, blocks: torch.Tensor) -> torch.Tensor:
        """``blocks: (NB, S, *F)`` -> ``values: (L, *F)`` (inverse of :meth:`scatter`)."""
        return blocks.reshape(self.num_blocks * self.block_size, *blocks.shape[2:]).index_select(0, self.slot)

    def previous(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The block before each block, and its slot mask (all False across a user boundary).

        ``blocks: (NB, S, *F)`` -> ``(NB, S, *F), (NB, S)``.
        """
        return torch.roll(blocks, shifts=1, dims=0), self.previous_valid


@dataclass(frozen=True)
class BlockChunk:
    """Blocks ``[first, end)`` of a :class:`BlockLayout` and the token range they need.

    Tokens ``[token_start, token_end)`` cover the chunk's blocks and the block before
    the first (its keys); the chunk's own tokens start at ``own_start``. ``source:
    ((n + 1) * S,)`` indexes that token range (row 0 = the previous block);
    ``slot: (token_end - own_start,)`` places the own tokens in the ``(n * S)`` query slots.
    """

    first: int
    end: int
    token_start: int
    own_start: int
    token_end: int
    source: torch.Tensor
    slot: torch.Tensor

    @classmethod
    def build(cls, layout: BlockLayout, first: int, end: int, starts: list[int]) -> BlockChunk:
        """``starts: (NB + 1)`` the first token of each block (and the token count last)."""
        s = layout.block_size
        own_start, token_end = starts[first], starts[end]
        token_start = starts[max(first - 1, 0)]
        source = (layout.source[first * s : (end + 1) * s] - token_start).clamp_min(0)
        slot = layout.slot[own_start:token_end] - first * s
        return cls(first, end, token_start, own_start, token_end, source, slot)
