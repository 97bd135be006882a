"""Precompute stage: candidates + histories → batched GEM inference in Beam → representations.

Pure logic: ``requests`` (candidate validation, per-request model inputs),
``records`` (model outputs → REPRESENTATION rows), ``batching`` (token budgets).
Beam: ``handler`` (the RunInference ModelHandler), ``transforms``, ``pipeline``.
"""
