"""Synthetic engagement worlds: ``python -m pipelines generate`` (see :mod:`.cli`).

The generator is a pure function of :class:`WorldConfig` (:func:`generate_events`,
:func:`generate_candidates`); :func:`write_world` adds the files: events as JSONL,
JSONL.gz or Parquet, optional candidate sets, and the ground truth folder.

Names are imported on first use, so that ``pipelines.cli.generate`` (loaded for
``--help``) pulls in neither numpy nor pyarrow.
"""

from __future__ import annotations

from pipelines.lazy import lazy_exports

_EXPORTS = {
    "WorldConfig": "pipelines.generator.config",
    "GeneratedEvents": "pipelines.generator.events",
    "generate_events": "pipelines.generator.events",
    "rngs": "pipelines.generator.events",
    "generate_candidates": "pipelines.generator.candidates",
    "Request": "pipelines.generator.output",
    "write_world": "pipelines.generator.output",
    "TRUTH_ITEMS": "pipelines.schemas.layouts",
    "TRUTH_USERS": "pipelines.schemas.layouts",
    "truth_dir_for": "pipelines.generator.truth",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
