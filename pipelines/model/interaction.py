"""Cross-feature interaction: a mixture of FM and DCN experts behind a top-k gate.

Input ``tokens: (B, T, D)`` (summary tokens, user representation, context and target
ad tokens); output ``(B, D)``. Each row runs only the ``top_k`` experts its gate
picks (sparse dispatch); the gate weights of those experts are renormalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FMExpert(nn.Module):
    """Factorization-machine expert: all pairwise token dot products plus a linear term.

    ``tokens: (B, T, D)`` -> ``(B, D)``.
    """

    def __init__(self, num_tokens: int, d_model: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_tokens, num_tokens, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.project = nn.Linear(rows.numel() + d_model, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        gram = tokens @ tokens.transpose(1, 2) / tokens.shape[-1] ** 0.5  # (B, T, T)
        pairs = gram[:, self.rows, self.cols]
        return F.silu(self.project(torch.cat([pairs, tokens.mean(dim=1)], dim=1)))


class DCNExpert(nn.Module):
    """Deep & Cross (v2, low-rank) expert over the flattened tokens.

    ``x_{l+1} = x_0 * (U_l V_l x_l + b_l) + x_l``; ``tokens: (B, T, D)`` -> ``(B, D)``.
    """

    def __init__(self, num_tokens: int, d_model: int, layers: int, rank: int) -> None:
        super().__init__()
        width = num_tokens * d_model
        self.down = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))
        self.project = nn.Linear(width, d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x0 = tokens.flatten(1)
        x = x0
        for down, up in zip(self.down, self.up, strict=True):
            x = x0 * up(down(x)) + x
        return F.silu(self.project(x))


class MixtureOfExperts(nn.Module):
    """Top-k gated mixture; ``tokens: (B, T, D)`` -> ``(B, D)``.

    After each forward, :attr:`aux_loss` holds the switch-transformer load-balancing
    loss (``E * sum_e f_e * P_e``; 1.0 when perfectly balanced).
    """

    def __init__(
        self, num_tokens: int, d_model: int, kinds: tuple[str, ...], top_k: int, dcn_layers: int, dcn_rank: int
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(num_tokens * d_model, len(kinds))
        self.experts = nn.ModuleList(
            FMExpert(num_tokens, d_model) if kind == "fm" else DCNExpert(num_tokens, d_model, dcn_layers, dcn_rank)
            for kind in kinds
        )
        self.norm = nn.LayerNorm(d_model)
        self.aux_loss = torch.zeros(())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.gate(tokens.flatten(1))  # (B, E)
        top_logits, top_index = logits.topk(self.top_k, dim=1)
        weights = top_logits.softmax(dim=1)  # (B, k)
        out = tokens.new_zeros(tokens.shape[0], tokens.shape[2], dtype=torch.float32)  # fp32 under autocast
        for e, expert in enumerate(self.experts):
            routed = top_index == e  # (B, k)
            rows = routed.any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            weight = (weights * routed).sum(dim=1)[rows]
            out = out.index_add(0, rows, (expert(tokens[rows]) * weight[:, None]).to(out.dtype))
        fraction = F.one_hot(top_index, len(self.experts)).float().mean(dim=(0, 1))
        self.aux_loss = len(self.experts) * (fraction * logits.softmax(dim=1).mean(dim=0)).sum()
        return self.norm(out)
