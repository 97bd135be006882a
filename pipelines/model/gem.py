"""The GEM-style model: jagged history -> summary -> user representation -> MoE -> heads.

::

    history (L, D) ─ layers: [local block attention] [global pooled summary] ─► summary (B, K, D)
    summary + the history's mean category embedding ─► user representation (B, R), L2-normalised
        (trained also to predict the category of the user's next impression and the category mix
        of its history: ``interest_loss``)
    target ad tokens ─ query the final history tokens ─► target-aware token (B, 1, D)
    target ad ─ hard search of the history (same item / advertiser / category, per event type) ─► match token
    summary + user rep + context + target ad (+ target-aware) tokens ─► MoE (FM/DCN) ─┐
    user rep ⊙ ad vector, wide(counts, is_ad, matches) ──────────────────────────────┴► pair rep (B, R)
    pair rep, surface (FiLM) ─► click and conversion logits (or, with ``esmm``,
        p(conversion) = p(click) * p(conversion | click)); the heads read nothing but the
        pair representation and the surface, so a stored or blended pair representation
        can stand in for a fresh one (``heads``)
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.model.attention import BlockAttention, PooledSummary, TargetAttention
from pipelines.model.config import GemConfig
from pipelines.model.embed import CATEGORY_SALT, NUM_CONTEXT_TOKENS, NUM_TARGET_TOKENS, TokenEmbedder, hash_ids
from pipelines.model.encoding import EncodingCache, UserEncoding, history_digests
from pipelines.model.inputs import NUM_COUNT_FEATURES, SEQUENCE_FIELDS, GemBatch, same_values
from pipelines.model.interaction import MixtureOfExperts
from pipelines.model.jagged import BlockLayout, gather_index, to_padded_dense
from pipelines.model.match import NUM_MATCH_FEATURES, match_features

#: Blocks per block-attention chunk on CPU (4,096 tokens at S=64); GPUs run all blocks at once.
CPU_CHUNK_BLOCKS = 64


def conversion_logit(click_logit: torch.Tensor, after_click_logit: torch.Tensor) -> torch.Tensor:
    """Logit of ``p(click) * p(conversion | click)`` (ESMM, Ma et al. 2018): conversions
    follow clicks, so the rare conversion task shares the click task's evidence.
    ``(B,), (B,) -> (B,)``, computed in log space."""
    log_p = F.logsigmoid(click_logit.float()) + F.logsigmoid(after_click_logit.float())
    # log(1 - p) without cancellation: log(-expm1(x)) near 0, log1p(-exp(x)) far from it
    # (each branch clamped to its own range so the unused one has finite gradients)
    near = torch.log(-torch.expm1(log_p.clamp(-0.6931, -1e-7)))
    far = torch.log1p(-torch.exp(log_p.clamp_max(-0.6931)))
    log_not = torch.where(log_p > -0.6931, near, far)
    return log_p - log_not


def autocast_for(device: torch.device) -> AbstractContextManager[object]:
    """bf16 autocast on CUDA (where it pays); nothing on CPU, where bf16 matmuls are slow
    and inference stays fp32."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return nullcontext()


def shared_histories(batch: GemBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Adjacent rows that read the same history (the ads of one candidate request): ``(first row of
    each distinct history (H,), each row's history (B,))``, or None when no two rows share one.

    Candidates are runs of adjacent rows with the same user, request time and length (a request's
    rows are adjacent in every batch built here; found in O(B), where a sort of all rows cost a
    few percent of a forward); they share only if every history token of every field is equal
    too (checked: a hand-made batch may break the rule).
    """
    key = torch.stack([batch.user_id, batch.request_time_ms, batch.lengths], dim=1)
    starts = torch.ones(batch.num_rows, dtype=torch.bool, device=key.device)
    starts[1:] = (key[1:] != key[:-1]).any(dim=1)
    if bool(starts.all()):
        return None
    history_of = torch.cumsum(starts, 0) - 1
    first = starts.nonzero().squeeze(1)
    same_as, _ = gather_index(batch.offsets, first[history_of])  # each token's twin in its first row
    for name in SEQUENCE_FIELDS:
        values = getattr(batch, name)
        if not same_values(values, values.index_select(0, same_as)):
            return None
    return first, history_of


@dataclass
class GemOutput:
    """Tensors of one forward: ``click_logit, conversion_logit: (B,)``,
    ``user_embedding, pair_embedding: (B, R)``, ``aux_loss`` a scalar."""

    click_logit: torch.Tensor
    conversion_logit: torch.Tensor
    user_embedding: torch.Tensor
    pair_embedding: torch.Tensor
    aux_loss: torch.Tensor


@dataclass
class Representations:
    """What inference hands downstream, as compact numpy arrays owning their memory.

    ``user_id, ad_id: (B,) int64`` (ad -1 = user-level row); ``p_click, p_conversion:
    (B,) float32``; ``user_embedding, pair_embedding: (B, R) float32``;
    ``num_tokens: (B,) int64`` history tokens the model read for each row.
    """

    user_id: np.ndarray
    ad_id: np.ndarray
    p_click: np.ndarray
    p_conversion: np.ndarray
    user_embedding: np.ndarray
    pair_embedding: np.ndarray
    num_tokens: np.ndarray


class SequenceLayer(nn.Module):
    """One layer: optional local block attention, then optional global summarisation."""

    def __init__(self, config: GemConfig, local: bool, global_: bool) -> None:
        super().__init__()
        c = config
        self.local = (
            BlockAttention(c.d_model, c.num_heads, c.attend_previous_block, c.ffn_multiplier, c.dropout)
            if local
            else None
        )
        self.summarize = (
            PooledSummary(c.d_model, c.num_heads, c.num_seeds, c.ffn_multiplier, c.dropout) if global_ else None
        )


class GemModel(nn.Module):
    """GEM-style ranking model over jagged histories. See the module docstring."""

    def __init__(self, config: GemConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = TokenEmbedder(c)
        self.layers = nn.ModuleList(SequenceLayer(c, local, global_) for local, global_ in c.layer_plan())
        r = c.representation_dim
        self.user_head = nn.Sequential(nn.Linear((c.num_seeds + 1) * c.d_model, 2 * r), nn.SiLU(), nn.Linear(2 * r, r))
        self.interest = nn.Linear(r, c.d_model)  # user rep -> query over the category table
        self.user_token = nn.Linear(r, c.d_model)
        self.target_attention = TargetAttention(c.d_model, c.num_heads) if c.target_attention else None
        self.target_query = nn.Linear(NUM_TARGET_TOKENS * c.d_model, c.d_model) if c.target_attention else None
        self.match_token = nn.Linear(NUM_MATCH_FEATURES, c.d_model) if c.target_match else None
        num_tokens = (
            c.num_seeds + 1 + NUM_CONTEXT_TOKENS + NUM_TARGET_TOKENS + int(c.target_attention) + int(c.target_match)
        )
        self.moe = MixtureOfExperts(num_tokens, c.d_model, c.experts, c.top_k, c.dcn_layers, c.dcn_rank)
        self.pair_head = nn.Linear(c.d_model, r)
        self.ad_vector = nn.Linear(NUM_TARGET_TOKENS * c.d_model, r)
        self.pair_match = nn.Linear(r, r, bias=False)  # user rep ⊙ ad vector -> pair rep (carries <user, ad>)
        wide = NUM_COUNT_FEATURES + 1 + (NUM_MATCH_FEATURES if c.target_match else 0)
        self.pair_wide = nn.Linear(wide, r, bias=False)  # wide part: counts, is_ad, matches -> pair rep
        nn.init.zeros_(self.pair_match.weight)
        nn.init.zeros_(self.pair_wide.weight)
        self.film = nn.Embedding(c.num_surfaces + 1, 2 * r)
        nn.init.zeros_(self.film.weight)
        self.task_mlp = nn.Sequential(nn.Linear(r, r), nn.SiLU(), nn.Linear(r, 2))
        self.surface_bias = nn.Embedding(c.num_surfaces + 1, 2)
        nn.init.zeros_(self.surface_bias.weight)
        self.model_version = f"untrained-{c.fingerprint()}"
        self.cpu_chunk_blocks = CPU_CHUNK_BLOCKS
        #: Rows sharing a history run target attention's target-free work once per history
        #: (:meth:`TargetAttention.shared`); False: on each row's copy of the history (the reference).
        self.shared_target_attention = True

    # ---- sequence encoder -----------------------------------------------------------
    def _sequence_layers(self) -> list[SequenceLayer]:
        return [cast(SequenceLayer, layer) for layer in self.layers]

    def encode_sequence(self, tokens: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Jagged path of the sequence layers: ``tokens: (L, D)`` of H histories, ``offsets: (H+1,)``
        -> the final tokens ``(L, D)`` and the summary ``(H, K, D)``."""
        layout = BlockLayout.build(offsets, self.config.block_size)
        # CPU: block attention in cache-sized chunks; GPU: all blocks in one launch
        max_blocks = self.cpu_chunk_blocks if tokens.device.type == "cpu" else None
        summary: torch.Tensor | None = None
        for layer in self._sequence_layers():
            if layer.local is not None:
                tokens = layer.local(tokens, layout, summary, max_blocks)
            if layer.summarize is not None:
                summary = layer.summarize(tokens, layout)
        assert summary is not None  # the last layer is always global
        return tokens, summary

    def encode_histories(self, history: GemBatch, cache: EncodingCache | None = None) -> UserEncoding:
        """The user side of ``history``'s rows (one history each): what :meth:`forward` computes from
        the history alone. With ``cache``, histories it holds are not encoded again, and the rest are
        stored in it (a history's entry is equal to encoding it alone, up to float rounding)."""
        ids = self.embed.sequence_ids(history)
        if cache is None:
            return self._encode(history, ids)
        keys = history_digests(history.user_id, ids, history.offsets)
        found = [cache.get(user, digest) for user, digest in keys]
        missing = [h for h, encoding in enumerate(found) if encoding is None]
        if missing:
            rows = torch.tensor(missing, dtype=torch.int64, device=history.offsets.device)
            token_rows, _ = gather_index(history.offsets, rows)
            fresh = self._encode(history.select(rows), ids.index_select(0, token_rows))
            for j, h in enumerate(missing):
                found[h] = one = fresh.select(rows.new_tensor([j]))
                cache.put(*keys[h], one)
            if len(missing) == len(found):  # nothing reused: the batch's own encoding, not a copy
                return fresh
        return UserEncoding.concat([encoding for encoding in found if encoding is not None])

    def _encode(self, history: GemBatch, ids: torch.Tensor) -> UserEncoding:
        tokens, summary = self.encode_sequence(self.embed.sequence(history, ids), history.offsets)
        return UserEncoding(tokens, history.offsets, summary, self.user_representation(summary, history))

    def user_representation(self, summary: torch.Tensor, history: GemBatch) -> torch.Tensor:
        """``(H, R)`` unit vectors from the summaries ``(H, K, D)`` and the histories' mean category
        embedding alone (no request, activity counts or hashed user id), so a user-level row gets the
        representation training shaped, and neighbours in it share interests, not activity levels."""
        profile = self.category_mix(history) @ self.embed.category.weight  # (H, D)
        return F.normalize(self.user_head(torch.cat([summary.flatten(1), profile], 1)), dim=-1)

    def attend_target(
        self, tokens: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor, history_of: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The target-aware token ``(B, 1, D)`` (None when off): each row's target ``(B, 4, D)`` queries
        the final tokens of its history (``history_of: (B,)``; None: row ``b`` reads history ``b``)."""
        if self.target_attention is None or self.target_query is None:
            return None
        query = self.target_query(target.flatten(1))
        if history_of is None:
            return self.target_attention(tokens, offsets, query)
        if self.shared_target_attention:
            return self.target_attention.shared(tokens, offsets, query, history_of)
        index, offsets = gather_index(offsets, history_of)
        return self.target_attention(tokens[index], offsets, query)

    def encode_sequence_reference(
        self, tokens: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Padded reference of :meth:`encode_sequence` with explicit masks (tests only)."""
        padded, mask = to_padded_dense(tokens, offsets)
        summary: torch.Tensor | None = None
        for layer in self._sequence_layers():
            if layer.local is not None:
                padded = layer.local.reference(padded, mask, summary, self.config.block_size)
            if layer.summarize is not None:
                summary = layer.summarize.reference(padded, mask)
        assert summary is not None
        targeted = None
        if self.target_attention is not None and self.target_query is not None:
            targeted = self.target_attention.reference(padded, mask, self.target_query(target.flatten(1)))
        return summary, targeted

    # ---- full model -------------------------------------------------------------------
    def forward(
        self,
        batch: GemBatch,
        *,
        reference: bool = False,
        share_histories: bool = False,
        cache: EncodingCache | None = None,
    ) -> GemOutput:
        """``share_histories``: encode a history read by several rows once (inference on candidate
        requests, see :func:`shared_histories`); off for training, whose rows rarely share one and
        where looking costs host syncs per step on a GPU. ``cache`` (inference, implies sharing):
        reuse the user side of histories encoded before (:class:`EncodingCache`)."""
        c = self.config
        target = self.embed.target(batch)  # (B, 4, D)
        if reference:
            summary, targeted = self.encode_sequence_reference(self.embed.sequence(batch), batch.offsets, target)
            user = self.user_representation(summary, batch)
        else:
            shared = shared_histories(batch) if share_histories or cache is not None else None
            history_of = None if shared is None else shared[1]
            encoded = self.encode_histories(batch if shared is None else batch.select(shared[0]), cache)
            targeted = self.attend_target(encoded.tokens, encoded.offsets, target, history_of)
            summary, user = encoded.summary, encoded.user  # (H, K, D), (H, R)
            if history_of is not None:
                summary, user = summary.index_select(0, history_of), user.index_select(0, history_of)
        context = self.embed.context(batch)  # (B, 5, D)
        parts = [summary, self.user_token(user)[:, None], context, target]
        dense = torch.cat([batch.counts, batch.target_is_ad[:, None].to(batch.counts.dtype)], dim=1)
        if targeted is not None:
            parts.append(targeted)
        if self.match_token is not None:
            matched = match_features(batch)  # (B, F): hard search of the history for the target
            parts.append(self.match_token(matched)[:, None])
            dense = torch.cat([dense, matched], dim=1)
        tokens = torch.cat(parts, dim=1)
        ad = self.ad_embedding(target)
        pair = self.pair_head(self.moe(tokens)) + self.pair_match(user * ad) + self.pair_wide(dense)  # (B, R)
        click, second = self.heads(pair, batch.request_surface)
        conversion = conversion_logit(click, second) if c.esmm else second
        return GemOutput(click, conversion, user, pair, self.moe.aux_loss)

    def ad_embedding(self, target: torch.Tensor) -> torch.Tensor:
        """The ad's unit vector in the user representation's space: ``(B, 4, D) -> (B, R)``."""
        return F.normalize(self.ad_vector(target.flatten(1)), dim=-1)

    def heads(self, pair: torch.Tensor, surface: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Click logit and second logit (conversion, or conversion given click with ``esmm``),
        each ``(B,)``, from the pair representation ``(B, R)`` and the request surface
        ``(B,)`` (-1 = unknown) alone."""
        s = torch.where(surface < 0, self.config.num_surfaces, surface)
        gamma, beta = self.film(s).chunk(2, dim=-1)
        logits = self.task_mlp(pair * (1 + gamma) + beta) + self.surface_bias(s)
        return logits[:, 0], logits[:, 1]

    def interest_loss(self, user: torch.Tensor, batch: GemBatch) -> torch.Tensor:
        """How well the user representation ``(B, R)`` predicts, under a softmax over the
        category table, the category of the row's target (what the user is shown and
        engages with next) and the category mix of the history it read (cross-entropy
        to the histogram). It makes the user representation encode interests, so users
        near each other in it behave alike. Rows without a category (or history) are skipped."""
        table = self.embed.category.weight  # (C, D)
        log_p = self.interest_log_probs(user)  # (B, C)
        zero = log_p.sum() * 0.0
        known = batch.target_category >= 0
        labels = hash_ids(batch.target_category, CATEGORY_SALT, table.shape[0])
        nxt = F.nll_loss(log_p[known], labels[known]) if bool(known.any()) else zero
        mix = self.category_mix(batch)
        has = mix.sum(-1) > 0
        history = -(mix[has] * log_p[has]).sum(-1).mean() if bool(has.any()) else zero
        return nxt + history

    def interest_log_probs(self, user: torch.Tensor) -> torch.Tensor:
        """``(B, C)`` log-probabilities over the (hashed) category table from user representations ``(B, R)``."""
        table = self.embed.category.weight
        return F.log_softmax((self.interest(user) @ table.t()).float() / table.shape[1] ** 0.5, dim=-1)

    def category_mix(self, batch: GemBatch) -> torch.Tensor:
        """``(B, C)``: each row's share of history events per (hashed) category; zeros where none."""
        buckets = self.embed.category.num_embeddings
        owner = torch.repeat_interleave(torch.arange(batch.num_rows, device=batch.offsets.device), batch.lengths)
        seen = batch.category >= 0
        counts = torch.zeros(batch.num_rows, buckets, device=batch.offsets.device).index_put_(
            (owner[seen], hash_ids(batch.category[seen], CATEGORY_SALT, buckets)),
            torch.ones(int(seen.sum()), device=batch.offsets.device),
            accumulate=True,
        )
        return counts / counts.sum(-1, keepdim=True).clamp_min(1.0)

    @torch.no_grad()
    def init_output_bias(self, click_rate: float, conversion_rate: float) -> None:
        """Start each head at its base rate (logit of the training labels' mean, the
        conversion head at conversions per click), so the first steps are not spent
        moving a bias from 0.5 to a 2% click rate."""
        second = conversion_rate / max(click_rate, 1e-9) if self.config.esmm else conversion_rate
        rates = torch.tensor([click_rate, second]).clamp(1e-5, 1 - 1e-5)
        last = cast(nn.Linear, self.task_mlp[-1])
        last.bias.copy_(torch.log(rates / (1 - rates)))

    @torch.inference_mode()
    def represent(self, batch: GemBatch, cache: EncodingCache | None = None) -> Representations:
        """Inference entry: scores and representations of every row, as numpy (fp32).

        Moves ``batch`` to the model's device (bf16 autocast on CUDA, fp32 on CPU); the
        model should be in eval mode
        (:func:`pipelines.model.checkpoint.load_model` returns it so).
        """
        device = next(self.parameters()).device
        with autocast_for(device):
            out = self(batch.to(device), share_histories=True, cache=cache)
        lengths = batch.lengths

        def np32(t: torch.Tensor) -> np.ndarray:
            return np.array(t.detach().float().cpu().numpy(), dtype=np.float32, copy=True)

        return Representations(
            user_id=batch.user_id.cpu().numpy().copy(),
            ad_id=batch.target_item.cpu().numpy().copy(),
            p_click=np32(torch.sigmoid(out.click_logit)),
            p_conversion=np32(torch.sigmoid(out.conversion_logit)),
            user_embedding=np32(out.user_embedding),
            pair_embedding=np32(out.pair_embedding),
            num_tokens=lengths.cpu().numpy().copy(),
        )
