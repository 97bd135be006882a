"""The GEM model's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.schemas.enums import DEVICES, EVENT_TYPES, SURFACES
from pipelines.schemas.layouts import DEFAULT_EMBEDDING_DIM

#: Bumped whenever the module structure changes in a way old checkpoints cannot load into.
ARCHITECTURE_VERSION = 2

EXPERT_KINDS = ("fm", "dcn")


def _hash_tables() -> dict[str, int]:
    return {"item": 1 << 16, "advertiser": 1 << 13, "category": 1 << 10, "user": 1 << 12}


@dataclass(frozen=True)
class GemConfig:
    """Hyper-parameters of :class:`pipelines.model.gem.GemModel`.

    Sizes: ``d_model`` is the token width, split into ``num_heads`` heads; block
    attention cuts each history into ``block_size``-token blocks (aligned to the most
    recent event); ``num_seeds`` learned queries summarise the history into that many
    tokens; ``max_len`` is the longest history prefix the model reads (the most
    recent events win). ``component_skip`` alternates local layers (block attention
    that reuses the cached summary) with global layers (a fresh summarisation);
    turned off, every layer does both. ``bypass_block_attention`` drops the local
    component altogether. ``target_attention`` lets the target ad query the final
    history tokens (it feeds the pair representation, never the user one);
    ``target_match`` adds counts of the history events that share the target's item,
    advertiser or category (a SIM-style hard search, see ``match.py``). ``esmm``
    predicts conversion as p(click) * p(conversion | click) (ESMM, the default) instead
    of directly: conversions follow clicks, and a conversion head of its own learns from
    a few hundred converting users (a handful of whom can hold most of the training
    conversions), so it overfits them; through the click it shares the evidence of many
    times more positives. Its effect on conversion AUC, with and without it, is recorded in
    docs/benchmarks/results.md (model).
    """

    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 4
    block_size: int = 64
    attend_previous_block: bool = True
    num_seeds: int = 4
    ffn_multiplier: int = 2
    max_len: int = 256
    component_skip: bool = True
    bypass_block_attention: bool = False
    target_attention: bool = True
    target_match: bool = True
    esmm: bool = True
    hash_sizes: dict[str, int] = field(default_factory=_hash_tables)
    time_buckets: int = 32
    value_buckets: int = 16
    count_buckets: int = 24
    experts: tuple[str, ...] = ("fm", "fm", "dcn", "dcn")
    top_k: int = 2
    dcn_layers: int = 2
    dcn_rank: int = 16
    representation_dim: int = DEFAULT_EMBEDDING_DIM
    dropout: float = 0.0

    def __post_init__(self) -> None:
        positive = (
            "d_model",
            "num_heads",
            "num_layers",
            "block_size",
            "num_seeds",
            "ffn_multiplier",
            "max_len",
            "time_buckets",
            "value_buckets",
            "count_buckets",
            "top_k",
            "dcn_layers",
            "dcn_rank",
            "representation_dim",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GemConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"GemConfig.d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not self.experts or any(kind not in EXPERT_KINDS for kind in self.experts):
            raise ValueError(f"GemConfig.experts must be a non-empty tuple of {EXPERT_KINDS}, got {self.experts!r}")
        if self.top_k > len(self.experts):
            raise ValueError(f"GemConfig.top_k ({self.top_k}) exceeds the number of experts ({len(self.experts)})")
        missing = {"item", "advertiser", "category", "user"} - set(self.hash_sizes)
        if missing or any(int(v) < 2 for v in self.hash_sizes.values()):
            raise ValueError(
                f"GemConfig.hash_sizes needs item, advertiser, category and user "
                f"tables of at least 2 rows, got {self.hash_sizes!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GemConfig.dropout must be in [0, 1), got {self.dropout}")
        object.__setattr__(self, "experts", tuple(self.experts))

    # ---- derived ---------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_surfaces(self) -> int:
        return len(SURFACES)

    @property
    def num_event_types(self) -> int:
        return len(EVENT_TYPES)

    @property
    def num_devices(self) -> int:
        return len(DEVICES)

    def layer_plan(self) -> list[tuple[bool, bool]]:
        """(does local block attention, does global summarisation) for each layer.

        With ``component_skip`` layers alternate local, global, local, ... and the
        last layer is always global so the output summary sees every refinement.
        """
        plan = []
        for index in range(self.num_layers):
            last = index == self.num_layers - 1
            if self.component_skip:
                local, global_ = index % 2 == 0 and not last, index % 2 == 1 or last
            else:
                local, global_ = True, True
            plan.append((local and not self.bypass_block_attention, global_))
        return plan

    # ---- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values only (what a ``weights_only`` checkpoint may hold)."""
        out = dataclasses.asdict(self)
        out["experts"] = list(self.experts)
        out["hash_sizes"] = {k: int(v) for k, v in sorted(self.hash_sizes.items())}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GemConfig:
        """The inverse of :meth:`to_dict`; unknown keys are an error, not ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown GemConfig fields {unknown}")
        kwargs = dict(data)
        if "experts" in kwargs:
            kwargs["experts"] = tuple(kwargs["experts"])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> GemConfig:
        return dataclasses.replace(self, **changes)

    def fingerprint(self) -> str:
        """A short digest of every field: equal configs, equal fingerprints."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]
