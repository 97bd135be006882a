"""The GEM-style model: jagged block attention, sequence summarisation, MoE interactions.

Inference in three calls (what the precompute stage's ModelHandler does)::

    from pipelines.model import HistoryIndex, ad_catalog, build_candidate_batch, load_model

    model = load_model(MODEL_DIR, device="auto")          # GemModel, eval mode
    index = HistoryIndex(histories)                       # a `history`-layout Arrow table
    batch = build_candidate_batch(index, candidates, max_len=model.config.max_len,
                                  catalog=ad_catalog(index))
    reps = model.represent(batch)                         # Representations of numpy arrays

Names are imported lazily so that ``python -m pipelines --help`` does not load torch.
"""

from __future__ import annotations

from pipelines.lazy import lazy_exports

_EXPORTS = {
    "GemConfig": "pipelines.model.config",
    "GemModel": "pipelines.model.gem",
    "GemOutput": "pipelines.model.gem",
    "Representations": "pipelines.model.gem",
    "GemBatch": "pipelines.model.inputs",
    "ExampleSet": "pipelines.model.inputs",
    "HistoryIndex": "pipelines.model.inputs",
    "ad_catalog": "pipelines.model.inputs",
    "build_candidate_batch": "pipelines.model.inputs",
    "build_example_batch": "pipelines.model.inputs",
    "build_user_batch": "pipelines.model.inputs",
    "CheckpointError": "pipelines.model.checkpoint",
    "load_model": "pipelines.model.checkpoint",
    "save_checkpoint": "pipelines.model.checkpoint",
    "resolve_device": "pipelines.model.checkpoint",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
