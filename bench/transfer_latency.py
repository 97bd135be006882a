"""Serving cost alone: ``transfer``'s latency legs (``transfer-latency``, ``loopfm-serving``) without its
model training and transfer experiments, so that they can be timed on a quiet machine in minutes.

Full size: the demo-sized generated world's histories (20,000 users x 14 days, as ``transfer`` uses),
GEM live at the default config on them; QUICK=1: the planted-signal world. The legs, their
baselines and targets are ``transfer``'s (see bench/transfer.py).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from bench.common import QUICK, WORK
from bench.transfer import full_world, latency, latency_results, print_latency, quick_world


def main() -> None:
    torch.set_num_threads(1)
    root = WORK / ("transfer-quick" if QUICK else "transfer")
    root.mkdir(parents=True, exist_ok=True)
    features, _ = quick_world(root) if QUICK else full_world(root, train=False)
    lat = latency(features, root)
    print_latency(lat)
    latency_results(lat)


if __name__ == "__main__":
    main()
