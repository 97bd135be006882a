"""The GEM model's kernel legs, shared by ``bench/model.py`` (CPU) and ``bench/gpu.py`` (CUDA).

Torch and the model modules only (no Beam, no training), so the legs run wherever torch does:
(1) jagged block attention vs padded full attention, (2) the whole model's forward time against
history length (log-log slope), (3) achieved FLOP/s of a batched forward against the matmul peak.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from bench.common import QUICK, best_time, flops_of, matmul_peak
from pipelines.model.attention import BlockAttention
from pipelines.model.config import GemConfig
from pipelines.model.gem import CPU_CHUNK_BLOCKS, GemModel
from pipelines.model.jagged import BlockLayout, lengths_to_offsets, to_padded_dense
from tests.model.factories import random_batch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def skewed_lengths(users: int, mean: int = 1000, cap: int = 16_000, seed: int = 0) -> list[int]:
    """Lognormal history lengths: one user at ``cap``, the rest scaled so the batch averages ``mean``."""
    rng = np.random.default_rng(seed)
    sigma = 1.2
    rest = rng.lognormal(0.0, sigma, users - 1)
    rest = rest * (mean * users - cap) / rest.sum()
    lengths = np.clip(np.round(rest), 1, cap).astype(int).tolist()
    return [cap, *lengths]


def padded_full_attention(layer: BlockAttention, tokens: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The baseline: the same layer's weights as full attention over the padded batch.

    ``tokens: (L, D)`` -> ``(L, D)``; pads to ``(B, T_max, D)`` with a key padding mask.
    """
    padded, mask = to_padded_dense(tokens, offsets)
    batch, width, d_model = padded.shape
    q, k, v = (
        t.view(batch, width, layer.num_heads, layer.head_dim).transpose(1, 2)
        for t in layer.qkv(layer.norm(padded)).chunk(3, dim=-1)
    )
    mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    out = layer.ffn(padded + layer.out(mixed.transpose(1, 2).reshape(batch, width, d_model)))
    return out[mask]


def jagged_block_attention(
    layer: BlockAttention, tokens: torch.Tensor, offsets: torch.Tensor, summary: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The project's path, as the model runs it (cache-sized chunks of blocks on CPU)."""
    max_blocks = CPU_CHUNK_BLOCKS if DEVICE.type == "cpu" else None
    return layer(tokens, BlockLayout.build(offsets, block_size), summary, max_blocks)


def bench_attention(config: GemConfig) -> tuple[float, str]:
    users, cap = (16, 4000) if QUICK else (32, 16_000)
    lengths = skewed_lengths(users, cap=cap)
    offsets = lengths_to_offsets(torch.tensor(lengths)).to(DEVICE)
    torch.manual_seed(0)
    layer = BlockAttention(config.d_model, config.num_heads, True, config.ffn_multiplier, 0.0).to(DEVICE).eval()
    tokens = torch.randn(sum(lengths), config.d_model, device=DEVICE)
    summary = torch.randn(users, config.num_seeds, config.d_model, device=DEVICE)
    with torch.inference_mode():
        jagged_s = best_time(
            lambda: jagged_block_attention(layer, tokens, offsets, summary, config.block_size), 3, DEVICE
        )
        padded_s = best_time(lambda: padded_full_attention(layer, tokens, offsets), 1, DEVICE)
    n = sum(lengths)
    padded_slots = users * max(lengths)
    print(
        f"[1] batch: {users} histories, {n} tokens (mean {n / users:.0f}, max {max(lengths)}); "
        f"padded to {padded_slots} slots ({padded_slots / n:.1f}x)"
    )
    print(
        f"    jagged block attention ({config.block_size}-token blocks + previous + {config.num_seeds} summary "
        f"keys): {jagged_s * 1e3:.1f} ms = {n / jagged_s / 1e3:.0f} k tokens/s"
    )
    print(
        f"    padded full attention (SDPA, padding mask): {padded_s * 1e3:.1f} ms = {n / padded_s / 1e3:.1f} k tokens/s"
    )
    return padded_s / jagged_s, f"{users} histories, mean {n / users:.0f}, max {max(lengths)} tokens"


def _slope(lengths: list[int], seconds: list[float]) -> float:
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def bench_scaling(config: GemConfig) -> tuple[float, float]:
    torch.manual_seed(0)
    model = GemModel(config).to(DEVICE).eval()
    block_lengths = [512 * 2**i for i in range(8)]  # 512 .. 65,536
    full_lengths = [512 * 2**i for i in range(4 if QUICK else 5)]  # 512 .. 4,096 / 8,192
    block_s, full_s = [], []
    layer = next(layer.local for layer in model._sequence_layers() if layer.local is not None)
    with torch.inference_mode():
        for n in block_lengths:
            batch = random_batch([n], seed=n).to(DEVICE)
            block_s.append(best_time(partial(model, batch), 3, DEVICE))
        for n in full_lengths:
            tokens = torch.randn(n, config.d_model, device=DEVICE)
            offsets = torch.tensor([0, n], device=DEVICE)
            full_s.append(best_time(partial(padded_full_attention, layer, tokens, offsets), 2, DEVICE))
    print(
        "[2] one user, whole model forward: "
        + ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in zip(block_lengths, block_s, strict=True))
    )
    print(
        "    one user, padded full attention layer: "
        + ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in zip(full_lengths, full_s, strict=True))
    )
    upper = _slope(block_lengths[3:], block_s[3:])
    print(f"    slope over 4,096..65,536 alone (fixed per-call costs no longer hide the growth): {upper:.3f}")
    return _slope(block_lengths, block_s), _slope(full_lengths, full_s)


def bench_flops(config: GemConfig) -> tuple[float, float, dict[int, float]]:
    """Achieved FLOP/s of batched forwards at the trained width and at a serving width
    (d_model 256), and the fp32 ``torch.mm`` peak measured alongside."""
    lengths = skewed_lengths(16, mean=1000, cap=8000, seed=1)
    batch = random_batch(lengths, seed=2).to(DEVICE)
    peak = matmul_peak(DEVICE)
    achieved = {}
    for width in (config.d_model, 256):
        torch.manual_seed(0)
        model = GemModel(config.replace(d_model=width)).to(DEVICE).eval()
        _, flops = flops_of(partial(model, batch))
        with torch.inference_mode():
            seconds = best_time(partial(model, batch), 3, DEVICE)
        achieved[width] = flops / seconds
        print(
            f"[3] batched forward, d_model {width}: {batch.num_rows} rows, {batch.num_tokens} tokens, "
            f"{flops / 1e9:.1f} GFLOP in {seconds * 1e3:.0f} ms = {flops / seconds / 1e9:.1f} GFLOP/s "
            f"({batch.num_tokens / seconds / 1e3:.0f} k tokens/s) = {flops / seconds / peak:.0%} of peak"
        )
    print(f"    fp32 matmul peak (torch.mm 2048^2, {torch.get_num_threads()} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    return achieved[256], peak, achieved
