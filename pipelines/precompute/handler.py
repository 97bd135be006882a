"""The GEM ModelHandler for Beam's RunInference.

Elements are :class:`GemBatch` objects (one candidate request or a chunk of users).
Beam's ``BatchElements`` groups them by a *token budget* (the sum of history tokens,
see :func:`batching.batch_tokens`) rather than by count, so long and short histories
both batch well. The model is loaded once per worker process (RunInference's shared
handle); inference runs under ``torch.inference_mode`` on CUDA when present, and each
result is copied into small numpy arrays right away, so no result keeps a view of the
whole batch output alive.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from pipelines.model.gem import GemModel
from pipelines.model.inputs import GemBatch
from pipelines.precompute.batching import approx_bytes, batch_tokens, concat_batches
from pipelines.precompute.records import slice_representations

log = logging.getLogger(__name__)

Batching = Literal["tokens", "count"]


def element_tokens(element: Any) -> int:
    """Token cost of an element, keyed (``(key, GemBatch)``) or not."""
    return batch_tokens(element[1] if isinstance(element, tuple) else element)


def capped_tokens(element: Any, budget: int) -> int:
    """:func:`element_tokens`, at most ``budget``: ``BatchElements`` emits an empty batch before an
    element heavier than its target, and an element over the budget is a batch of its own anyway."""
    return min(element_tokens(element), budget)


class GemModelHandler(ModelHandler[GemBatch, PredictionResult, GemModel]):
    """Runs :meth:`GemModel.represent` over concatenated jagged batches."""

    def __init__(
        self,
        model_dir: str,
        *,
        device: str = "auto",
        batching: Batching = "tokens",
        token_budget: int = 32_768,
        batch_size: int = 64,
    ) -> None:
        if token_budget < 1 or batch_size < 1:
            raise ValueError(f"token_budget and batch_size must be >= 1, got {token_budget}, {batch_size}")
        if batching not in ("tokens", "count"):
            raise ValueError(f"batching must be 'tokens' or 'count', got {batching!r}")
        self._model_dir = model_dir
        self._device = device
        self._batching = batching
        self._token_budget = token_budget
        self._batch_size = batch_size

    def load_model(self) -> GemModel:
        from pipelines.model.checkpoint import load_model

        return load_model(self._model_dir, device=self._device)

    def run_inference(
        self, batch: Sequence[GemBatch], model: GemModel, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        merged = concat_batches(batch)
        reps = model.represent(merged)
        request_ms = merged.request_time_ms.numpy()
        bounds = np.cumsum([0] + [b.num_rows for b in batch])
        for start, stop in itertools.pairwise(bounds):
            inference = (slice_representations(reps, int(start), int(stop)), request_ms[start:stop].copy())
            yield PredictionResult(None, inference, model_id=model.model_version)

    def get_num_bytes(self, batch: Sequence[GemBatch]) -> int:
        return sum(approx_bytes(b) for b in batch)

    def get_metrics_namespace(self) -> str:
        return "precompute"

    def batch_elements_kwargs(self) -> Mapping[str, Any]:
        if self._batching == "count":
            return {"min_batch_size": self._batch_size, "max_batch_size": self._batch_size}
        return {
            "min_batch_size": self._token_budget,
            "max_batch_size": self._token_budget,
            "element_size_fn": functools.partial(capped_tokens, budget=self._token_budget),
        }
