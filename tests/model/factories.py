"""Small inputs for the model tests: random jagged batches, tiny configs, history rows."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import torch

from pipelines.model.config import GemConfig
from pipelines.model.inputs import NUM_COUNT_FEATURES, GemBatch
from pipelines.schemas.layouts import HISTORY, TRAINING_EXAMPLE

T0 = 1_760_000_000_000
TINY_TABLES = {"item": 512, "advertiser": 64, "category": 32, "user": 128}


def tiny_config(**changes: object) -> GemConfig:
    """A config small enough for many forwards per test (block 8, width 16)."""
    base = dict(
        d_model=16,
        num_heads=2,
        num_layers=2,
        block_size=8,
        num_seeds=2,
        max_len=64,
        hash_sizes=dict(TINY_TABLES),
        experts=("fm", "dcn", "fm"),
        top_k=2,
        dcn_rank=4,
        representation_dim=8,
    )
    base.update(changes)
    return GemConfig(**base)  # type: ignore[arg-type]


def random_batch(lengths: Sequence[int], seed: int = 0, with_labels: bool = False) -> GemBatch:
    """A batch of ``len(lengths)`` rows with random ids and histories of those lengths."""
    g = torch.Generator().manual_seed(seed)
    batch, total = len(lengths), int(sum(lengths))
    offsets = torch.zeros(batch + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0)

    def ints(n: int, high: int, low: int = 0) -> torch.Tensor:
        return torch.randint(low, high, (n,), generator=g)

    age = torch.rand(total, generator=g) * 1e6
    for b in range(batch):  # non-increasing age within a user (oldest first)
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        age[lo:hi] = torch.sort(age[lo:hi], descending=True).values
    value = torch.where(torch.rand(total, generator=g) < 0.5, torch.rand(total, generator=g) * 50, torch.nan)
    labels = {}
    if with_labels:
        labels = {
            "clicked": (torch.rand(batch, generator=g) < 0.3).float(),
            "converted": (torch.rand(batch, generator=g) < 0.1).float(),
        }
    return GemBatch(
        offsets=offsets,
        item_id=ints(total, 5000),
        advertiser_id=ints(total, 40, -1),
        category=ints(total, 30),
        is_ad=ints(total, 2),
        surface=ints(total, 12),
        event_type=ints(total, 12),
        age_s=age,
        value=value,
        user_id=ints(batch, 1000),
        request_surface=ints(batch, 12, -1),
        device=ints(batch, 3, -1),
        history_length=torch.tensor(list(lengths), dtype=torch.int64),
        request_time_ms=torch.full((batch,), T0, dtype=torch.int64),
        target_item=ints(batch, 5000),
        target_advertiser=ints(batch, 40, -1),
        target_category=ints(batch, 30),
        target_is_ad=ints(batch, 2),
        counts=torch.rand(batch, NUM_COUNT_FEATURES, generator=g) * 5,
        **labels,
    )


def event(i: int, t_ms: int, *, item: int = 1, category: int = 2, event_type: int = 0, is_ad: bool = True) -> dict:
    return {
        "event_id": f"e{i}",
        "item_id": item,
        "is_ad": is_ad,
        "advertiser_id": 7 if is_ad else None,
        "item_category": category,
        "surface": 1,
        "event_type": event_type,
        "event_time": t_ms,
        "value": 1.5,
    }


def histories_table(users: dict[int, list[dict]], evicted: dict[int, int] | None = None) -> pa.Table:
    from tests.model.toyworld import history_row  # io.commit needs Beam; the CUDA test must not

    rows = [history_row(u, events, (evicted or {}).get(u, 0)) for u, events in users.items()]
    return pa.Table.from_pylist(rows, schema=HISTORY.with_metadata())


def examples_table(rows: list[dict]) -> pa.Table:
    """Training examples; each dict needs user_id, item_id, event_time, history_end."""
    full = []
    for i, r in enumerate(rows):
        full.append(
            {
                "event_id": f"x{i}",
                "is_ad": True,
                "advertiser_id": 7,
                "item_category": 2,
                "surface": 1,
                "device": 0,
                "clicked": i % 2 == 0,
                "converted": False,
                "history_length": r["history_end"],
                **r,
            }
        )
    return pa.Table.from_pylist(full, schema=TRAINING_EXAMPLE.with_metadata())
