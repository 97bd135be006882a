"""The model on a CUDA device: the kernel legs of ``bench/model.py`` and precompute-shaped inference.

Run where torch sees a GPU (``python bench/gpu.py``; elsewhere it prints a SKIP line). Needs torch and the
model modules only (no Beam, no training), so it runs on an accelerator host with a bare Python.

1. jagged block attention vs padded full attention (SDPA), tokens/s (target >= 3x, as on CPU);
2. the whole model's forward time for one user, 512 -> 65,536 tokens (printed: on a GPU one user's
   forward is bound by kernel launches, so its log-log slope says nothing about the attention);
3. achieved FLOP/s of a batched forward over the device's fp32 ``torch.mm`` peak;
4. precompute-shaped inference: batches of (user, ad) rows with histories capped at the model's
   ``max_len``, pairs/s on the GPU in fp32 and under bf16 autocast, against the same model on this
   host's CPU (all its cores) in the same run; bf16's largest deviation from fp32 on the pair
   embedding is printed beside it.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from bench.common import best_time, result
from bench.model_kernels import DEVICE, bench_attention, bench_flops, bench_scaling, skewed_lengths
from pipelines.model.config import GemConfig
from pipelines.model.gem import GemModel
from tests.model.factories import random_batch

#: Rows per inference batch and how many batches a timing covers (precompute's token budget
#: forms batches of this order at max_len 256).
ROWS, BATCHES = 512, 8


def _pairs_per_second(model: GemModel, batches: list, device: torch.device, bf16: bool) -> float:
    model = model.to(device).eval()
    moved = [b.to(device) for b in batches]

    def run() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for batch in moved:
                model(batch)

    seconds = best_time(run, 3, device)
    return sum(b.num_rows for b in batches) / seconds


def bench_inference(config: GemConfig) -> tuple[float, float, float, float]:
    """Pairs/s on CUDA fp32, CUDA bf16 and this host's CPU, and bf16's max |deviation| from fp32."""
    lengths = [min(n, config.max_len) for n in skewed_lengths(ROWS, mean=400, cap=20_000, seed=3)]
    batches = [random_batch(lengths, seed=10 + i) for i in range(BATCHES)]
    torch.manual_seed(0)
    model = GemModel(config).eval()
    cpu = torch.device("cpu")
    torch.set_num_threads(os.cpu_count() or 1)
    cpu_rate = _pairs_per_second(model, batches[:2], cpu, bf16=False)
    fp32 = _pairs_per_second(model, batches, DEVICE, bf16=False)
    bf16 = _pairs_per_second(model, batches, DEVICE, bf16=True)
    with torch.inference_mode():
        exact = model(batches[0].to(DEVICE)).pair_embedding.float()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            approx = model(batches[0].to(DEVICE)).pair_embedding.float()
    deviation = float((exact - approx).abs().max() / exact.abs().max())
    tokens = sum(lengths) / ROWS
    print(
        f"[4] inference, {ROWS}-row batches (mean history {tokens:.0f} tokens, cap {config.max_len}): "
        f"CPU ({torch.get_num_threads()} threads) {cpu_rate:,.0f} pairs/s; CUDA fp32 {fp32:,.0f}; "
        f"CUDA bf16 autocast {bf16:,.0f} (max |bf16 - fp32| / max |fp32| on the pair embedding: {deviation:.4f})"
    )
    return cpu_rate, fp32, bf16, deviation


def main() -> None:
    if DEVICE.type != "cuda":
        print("SKIP gpu torch sees no CUDA device here: run bench/gpu.py on a GPU host")
        return
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    config = GemConfig(max_len=256)
    speedup, shape = bench_attention(config)
    bench_scaling(config)
    achieved, peak, _ = bench_flops(config)
    cpu_rate, fp32, bf16, _ = bench_inference(config)
    result("gpu_model_flops_utilization", achieved / peak, 0.40, f"{achieved / 1e12:.2f} / {peak / 1e12:.2f} TFLOP/s")
    result("gpu_inference_vs_cpu", fp32 / cpu_rate, 1, f"CUDA fp32 {fp32:,.0f} vs CPU {cpu_rate:,.0f} pairs/s")
    result("gpu_inference_bf16_vs_fp32", bf16 / fp32, 1, f"bf16 autocast {bf16:,.0f} vs fp32 {fp32:,.0f} pairs/s")
    result("gpu_block_attention", speedup, 3, f"jagged block vs padded full attention on CUDA ({shape})")


if __name__ == "__main__":
    main()
