"""Jagged helpers and the block layout: round trips, alignment, and no block mixes users."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.model.jagged import BlockLayout, from_dense, lengths_to_offsets, segment_ids, to_padded_dense

lengths_strategy = st.lists(st.integers(0, 40), min_size=1, max_size=8)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(lengths=lengths_strategy, block=st.sampled_from([1, 4, 8]))
def test_blocks_never_mix_users_and_cover_every_token_once(lengths: list[int], block: int) -> None:
    offsets = lengths_to_offsets(torch.tensor(lengths))
    layout = BlockLayout.build(offsets, block)
    owner = segment_ids(offsets)
    assert layout.slot.unique().numel() == layout.slot.numel() == sum(lengths)
    assert int(layout.valid.sum()) == sum(lengths)
    assert torch.equal(layout.block_user[layout.slot // block], owner)  # a block holds one user only
    for b, n in enumerate(lengths):
        assert int((layout.block_user == b).sum()) == -(-n // block)
    # blocks are aligned to the most recent event: each user's last block is full
    last_slots = layout.slot[offsets[1:][torch.tensor(lengths) > 0] - 1]
    assert torch.all(last_slots % block == block - 1)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(lengths=lengths_strategy)
def test_scatter_gather_and_padded_round_trips(lengths: list[int]) -> None:
    offsets = lengths_to_offsets(torch.tensor(lengths))
    values = torch.randn(sum(lengths), 3)
    layout = BlockLayout.build(offsets, 4)
    assert torch.equal(layout.gather(layout.scatter(values)), values)
    padded, mask = to_padded_dense(values, offsets)
    back, back_offsets = from_dense(padded, mask)
    assert torch.equal(back, values) and torch.equal(back_offsets, offsets)


def test_previous_block_is_empty_across_a_user_boundary() -> None:
    offsets = lengths_to_offsets(torch.tensor([5, 3]))  # blocks of 4: user 0 -> 2 blocks, user 1 -> 1
    layout = BlockLayout.build(offsets, 4)
    blocks = layout.scatter(torch.arange(8.0)[:, None] + 1)
    prev, prev_valid = layout.previous(blocks)
    assert layout.has_previous.tolist() == [False, True, False]
    assert not prev_valid[0].any() and not prev_valid[2].any()  # user 1 never sees user 0
    assert prev_valid[1].sum() == 1 and prev[1][prev_valid[1]].item() == 1.0  # user 0's first event


@settings(max_examples=40, derandomize=True, deadline=None)
@given(lengths=lengths_strategy, max_blocks=st.integers(1, 5))
def test_chunks_cover_every_block_and_token_once(lengths: list[int], max_blocks: int) -> None:
    offsets = lengths_to_offsets(torch.tensor(lengths))
    layout = BlockLayout.build(offsets, 4)
    chunks = layout.chunks(max_blocks)
    assert [c.first for c in chunks] == list(range(0, layout.num_blocks, max_blocks))
    assert sum(c.token_end - c.own_start for c in chunks) == sum(lengths)
    values = torch.arange(sum(lengths), dtype=torch.float32)
    for c in chunks:
        own = values[c.own_start : c.token_end]
        queries = values[c.token_start : c.token_end].index_select(0, c.source)[layout.block_size :]
        assert torch.equal(queries.index_select(0, c.slot), own)  # slot and source invert each other
        valid = layout.valid[c.first : c.end].reshape(-1)
        assert torch.equal(queries[valid], own)
