"""The sequence components: block attention (local) and pooled summarisation (global).

Both take the history as jagged ``tokens: (L, D)`` plus a shared :class:`BlockLayout`;
neither pads to the batch's longest history. Each module also has a ``reference``
method that computes the same thing on padded tensors with explicit masks (the plain
PyTorch reference the tests compare against).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.model.jagged import BlockChunk, BlockLayout, gather_index


class FeedForward(nn.Module):
    """Pre-norm residual MLP applied token-wise: ``x: (..., D) -> (..., D)``."""

    def __init__(self, d_model: int, multiplier: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_model * multiplier)
        self.down = nn.Linear(d_model * multiplier, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(F.silu(self.up(self.norm(x)))))


class BlockAttention(nn.Module):
    """Local layer: each block attends to itself, optionally to the previous block of
    the same user, and to the user's cached summary tokens; then a feed-forward.

    ``tokens: (L, D)``, ``summary: (B, K, D) | None`` -> ``(L, D)``. Cost is
    O(L * (2S + K) * D): linear in the history length.
    """

    def __init__(
        self, d_model: int, num_heads: int, attend_previous: bool, ffn_multiplier: int, dropout: float
    ) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.attend_previous = attend_previous
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.context_kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(d_model, ffn_multiplier, dropout)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim)

    def _context(self, summary: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if summary is None:
            return None
        k, v = self.context_kv(summary).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)  # (B, K, H, dh) each

    def forward(
        self, tokens: torch.Tensor, layout: BlockLayout, summary: torch.Tensor | None, max_blocks: int | None = None
    ) -> torch.Tensor:
        """Runs over chunks of at most ``max_blocks`` blocks (all at once when None)."""
        if tokens.shape[0] == 0:
            return tokens
        context = self._context(summary)
        context_kv = None if context is None else torch.stack(context, dim=2)  # (B, K, 2, H, dh)
        previous_valid = layout.previous_valid
        outputs = [
            self._chunk(tokens, layout, chunk, context_kv, previous_valid)
            for chunk in layout.chunks(max_blocks or max(layout.num_blocks, 1))
        ]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _chunk(
        self,
        tokens: torch.Tensor,
        layout: BlockLayout,
        chunk: BlockChunk,
        context_kv: torch.Tensor | None,
        previous_valid: torch.Tensor,
    ) -> torch.Tensor:
        """The layer's output ``(token_end - own_start, D)`` for one chunk's own tokens."""
        n, size = chunk.end - chunk.first, layout.block_size
        qkv = self.qkv(self.norm(tokens[chunk.token_start : chunk.token_end]))
        qkv = qkv.view(-1, 3, self.num_heads, self.head_dim)
        # one gather for q, k and v; row 0 is the block before the chunk (or an empty one)
        blocks = qkv.index_select(0, chunk.source).view(n + 1, size, 3, self.num_heads, self.head_dim)
        q, kv = blocks[1:, :, 0], blocks[:, :, 1:]
        valid = layout.valid[chunk.first : chunk.end]
        parts, masks = [kv[1:]], [valid]
        if self.attend_previous:
            parts.insert(0, kv[:-1])
            masks.insert(0, previous_valid[chunk.first : chunk.end])
        if context_kv is not None:
            parts.append(context_kv[layout.block_user[chunk.first : chunk.end]])  # (n, K, 2, H, dh)
            masks.append(valid.new_ones(n, context_kv.shape[1]))
        keys_values = torch.cat(parts, dim=1)  # (n, Sk, 2, H, dh)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys_values[:, :, 0].transpose(1, 2),
            keys_values[:, :, 1].transpose(1, 2),
            attn_mask=torch.cat(masks, dim=1)[:, None, None, :],
        )  # (n, H, S, dh)
        mixed = attended.transpose(1, 2).reshape(n * size, -1).index_select(0, chunk.slot)
        own = tokens[chunk.own_start : chunk.token_end]
        return self.ffn(own + self.dropout(self.out(mixed)))

    def reference(
        self, padded: torch.Tensor, mask: torch.Tensor, summary: torch.Tensor | None, block_size: int
    ) -> torch.Tensor:
        """Padded reference: ``padded: (B, T, D)``, ``mask: (B, T)`` -> ``(B, T, D)``.

        Builds the full ``(B, T, T + K)`` attention mask from the block rule and runs
        dense masked softmax attention. Quadratic; for tests only.
        """
        batch, width, _ = padded.shape
        lengths = mask.sum(dim=1)
        pad = (-lengths) % block_size
        block = (torch.arange(width)[None, :] + pad[:, None]) // block_size  # (B, T)
        same = block[:, :, None] == block[:, None, :]
        if self.attend_previous:
            same = same | (block[:, :, None] - 1 == block[:, None, :])
        allowed = same & mask[:, None, :] & mask[:, :, None]
        allowed = allowed | ~mask[:, :, None]  # padded query rows: anything, result discarded
        q, k, v = (self._heads(t).transpose(1, 2) for t in self.qkv(self.norm(padded)).chunk(3, dim=-1))
        context = self._context(summary)
        if context is not None:
            k = torch.cat([k, context[0].transpose(1, 2)], dim=2)
            v = torch.cat([v, context[1].transpose(1, 2)], dim=2)
            allowed = torch.cat([allowed, mask.new_ones(batch, width, context[0].shape[1])], dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        mixed = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(padded.shape)
        out = self.ffn(padded + self.out(mixed))
        return out * mask[..., None]


def jagged_pool(
    queries: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, layout: BlockLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of Q queries per user over that user's whole history, block by block.

    ``queries: (H, Q, dh)`` shared by every user, or ``(B, H, Q, dh)`` per user;
    ``kb: (NB, H, dh, S)``, ``vb: (NB, H, S, dh)`` in block layout -> ``pooled: (B, H, Q, dh)``
    and ``log_mass: (B, H, Q)``, the log-sum-exp of the scores (how much of the history
    matches a query, which a softmax average alone forgets). Each block contributes its
    max, sum and weighted values; they are merged per user with an online softmax, so
    no ``(B, T)`` tensor is built. A user without history gets zeros.
    """
    q = queries[None] if queries.dim() == 3 else queries[layout.block_user]
    scores = (q @ kb) / math.sqrt(kb.shape[2])  # (NB, H, Q, S)
    scores = scores.masked_fill(~layout.valid[:, None, None, :], float("-inf"))
    block_max = scores.amax(dim=-1)  # (NB, H, Q); finite: every block holds a token
    probs = torch.exp(scores - block_max[..., None])
    # merged in fp32 even under bf16 autocast: a user's sums can span thousands of blocks
    block_sum, block_out = probs.sum(dim=-1).float(), (probs @ vb).float()  # (NB,H,Q), (NB,H,Q,dh)
    block_max = block_max.float()
    shape = (layout.num_users, *block_max.shape[1:])
    owner = layout.block_user[:, None, None].expand_as(block_max)
    user_max = block_max.new_full(shape, float("-inf")).scatter_reduce(0, owner, block_max.detach(), "amax")
    weight = torch.exp(block_max - user_max[layout.block_user])
    total = block_max.new_zeros(shape).index_add(0, layout.block_user, block_sum * weight)
    pooled = block_out.new_zeros((*shape, vb.shape[-1])).index_add(0, layout.block_user, block_out * weight[..., None])
    return pooled / total.clamp_min(1e-30)[..., None], _log_mass(user_max, total)


def _log_mass(user_max: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """log of the softmax normaliser (log-sum-exp of the scores); 0 for an empty history."""
    empty = total <= 0
    return torch.where(
        empty, torch.zeros_like(total), torch.where(empty, 0.0, user_max) + torch.log(total.clamp_min(1e-30))
    )


def padded_pool(
    queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`jagged_pool`: ``queries: (H, Q, dh) | (B, H, Q, dh)``,
    ``k, v: (B, H, T, dh)``, ``mask: (B, T)`` -> ``(B, H, Q, dh), (B, H, Q)``."""
    q = queries[None] if queries.dim() == 3 else queries
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])  # (B, H, Q, T)
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    log_mass = torch.logsumexp(scores, dim=-1)
    log_mass = torch.where(torch.isinf(log_mass), torch.zeros_like(log_mass), log_mass)
    return torch.nan_to_num(scores.softmax(dim=-1), nan=0.0) @ v, log_mass  # empty history: zeros


class _Pooling(nn.Module):
    """Shared key/value projection of the pooled-attention modules."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.norm = nn.LayerNorm(d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def _blocks(self, tokens: torch.Tensor, layout: BlockLayout) -> tuple[torch.Tensor, torch.Tensor]:
        kv = layout.scatter(self.kv(self.norm(tokens)).view(-1, 2, self.num_heads, self.head_dim))
        return kv[:, :, 0].permute(0, 2, 3, 1), kv[:, :, 1].transpose(1, 2)  # (NB,H,dh,S), (NB,H,S,dh)

    def _padded(self, padded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, width, _ = padded.shape
        k, v = (
            t.view(batch, width, self.num_heads, self.head_dim).transpose(1, 2)
            for t in self.kv(self.norm(padded)).chunk(2, dim=-1)
        )
        return k, v

    def _merge(self, pooled: torch.Tensor) -> torch.Tensor:
        """``(B, H, Q, dh)`` -> ``(B, Q, D)`` through the output projection."""
        return self.out(pooled.transpose(1, 2).reshape(pooled.shape[0], pooled.shape[2], -1))


class PooledSummary(_Pooling):
    """Global layer: ``K`` learned seed queries cross-attend over the whole history
    (pooled multi-head attention), then a feed-forward on the K summary tokens.

    ``tokens: (L, D)`` -> ``summary: (B, K, D)`` (see :func:`jagged_pool`).
    """

    def __init__(self, d_model: int, num_heads: int, num_seeds: int, ffn_multiplier: int, dropout: float) -> None:
        super().__init__(d_model, num_heads)
        self.seeds = nn.Parameter(torch.randn(num_seeds, d_model) * 0.02)
        self.q = nn.Linear(d_model, d_model)
        self.ffn = FeedForward(d_model, ffn_multiplier, dropout)

    def _queries(self) -> torch.Tensor:
        return self.q(self.seeds).view(-1, self.num_heads, self.head_dim).transpose(0, 1)  # (H, K, dh)

    def forward(self, tokens: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
        pooled, _ = jagged_pool(self._queries(), *self._blocks(tokens, layout), layout)
        return self.ffn(self.seeds[None] + self._merge(pooled))

    def reference(self, padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Padded reference: ``padded: (B, T, D)``, ``mask: (B, T)`` -> ``(B, K, D)``."""
        pooled, _ = padded_pool(self._queries(), *self._padded(padded), mask)
        return self.ffn(self.seeds[None] + self._merge(pooled))


class TargetAttention(nn.Module):
    """Target-aware pooling (DIN-style activation unit): each history token is scored
    against the row's target ad by a small MLP over ``[h, t, h * t]``, per head; a
    softmax over the user's tokens pools projected values.

    ``tokens: (L, D)``, ``target: (B, D)``, ``offsets: (B+1,)`` -> ``(B, 1, D)``: the
    pooled values plus a projection of each head's log attention mass, absolute and
    per history token, so "how much of the history matches the ad" survives the
    softmax. Cost O(L * D * hidden); no padding and no blocks needed. Feeds the pair
    representation only; the user representation stays target-free.
    """

    def __init__(self, d_model: int, num_heads: int, hidden: int = 32) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.norm = nn.LayerNorm(d_model)
        self.score = nn.Sequential(nn.Linear(3 * d_model, hidden), nn.SiLU(), nn.Linear(hidden, num_heads))
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.mass = nn.Linear(2 * num_heads, d_model)

    def _scores(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.score(torch.cat([h, t, h * t], dim=-1))

    def _finish(self, pooled: torch.Tensor, log_mass: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``pooled: (B, H, dh)``, ``log_mass: (B, H)``, ``lengths: (B,)`` -> ``(B, 1, D)``."""
        per_token = log_mass - torch.log(lengths.clamp_min(1).to(log_mass.dtype))[:, None]
        mass = self.mass(torch.cat([log_mass, per_token], dim=1))
        return (self.out(pooled.flatten(1)) + mass)[:, None]

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        lengths = offsets[1:] - offsets[:-1]
        owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)
        h = self.norm(tokens)
        scores = self._scores(h, target[owner]).float()  # (L, H); fp32 sums under bf16 autocast
        values = self.value(h).view(-1, self.num_heads, self.head_dim).float()  # (L, H, dh)
        return self._pool(scores, values, owner, lengths)

    def shared(
        self, tokens: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor, history_of: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`forward` for rows that share histories (a candidate request's ads), with the
        per-token work that does not depend on the target done once per history.

        ``tokens: (L, D)`` of H histories, ``offsets: (H+1,)``, ``target: (B, D)``, ``history_of: (B,)``
        -> ``(B, 1, D)``. The norm, the value projection and the history's share of the first
        score layer (``W [h, t, h*t] = W_h h + W_t t + W_ht (h*t)``) run over the L history tokens;
        only ``W_ht (h*t)`` and the small second layer run per (row, token). Equal to
        :meth:`forward` on the rows' gathered histories up to float rounding (tested).
        """
        index, row_offsets = gather_index(offsets, history_of)
        lengths = row_offsets[1:] - row_offsets[:-1]
        owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)
        first, second = cast(nn.Linear, self.score[0]), self.score[2]
        w_h, w_t, w_ht = first.weight.split(tokens.shape[1], dim=1)  # (hidden, D) each
        h = self.norm(tokens)
        rows = target.index_select(0, owner)  # index_select, not x[index]: several times faster on CPU
        hidden = (h @ w_h.t()).index_select(0, index) + F.linear(target, w_t, first.bias).index_select(0, owner)
        hidden = hidden + (h.index_select(0, index) * rows) @ w_ht.t()
        scores = second(F.silu(hidden)).float()  # (L', H)
        values = self.value(h).view(-1, self.num_heads, self.head_dim).float().index_select(0, index)  # (L', H, dh)
        return self._pool(scores, values, owner, lengths)

    def _pool(
        self, scores: torch.Tensor, values: torch.Tensor, owner: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Softmax of ``scores: (L, H)`` over each row's tokens (``owner: (L,)``) pooling ``values:
        (L, H, dh)`` -> ``(B, 1, D)``."""
        shape = (lengths.numel(), self.num_heads)
        user_max = scores.new_full(shape, float("-inf")).scatter_reduce(
            0, owner[:, None].expand_as(scores), scores.detach(), "amax"
        )
        weight = torch.exp(scores - user_max[owner])
        total = scores.new_zeros(shape).index_add(0, owner, weight)
        pooled = values.new_zeros((*shape, self.head_dim)).index_add(0, owner, weight[..., None] * values)
        pooled = pooled / total.clamp_min(1e-30)[..., None]
        return self._finish(pooled, _log_mass(user_max, total), lengths)

    def reference(self, padded: torch.Tensor, mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Padded reference: ``padded: (B, T, D)``, ``mask: (B, T)``, ``target: (B, D)``."""
        h = self.norm(padded)
        scores = self._scores(h, target[:, None].expand_as(h))  # (B, T, H)
        scores = scores.masked_fill(~mask[..., None], float("-inf"))
        log_mass = torch.logsumexp(scores, dim=1)
        log_mass = torch.where(torch.isinf(log_mass), torch.zeros_like(log_mass), log_mass)
        probs = torch.nan_to_num(scores.softmax(dim=1), nan=0.0)  # (B, T, H)
        values = self.value(h).view(*h.shape[:2], self.num_heads, self.head_dim)
        pooled = torch.einsum("bth,bthd->bhd", probs, values)
        return self._finish(pooled, log_mass, mask.sum(dim=1))
