"""Features stage: parse and validate events, deduplicate, build histories and training examples.

Pure logic over Arrow/Polars lives in ``parse``, ``validate``, ``histories`` and
``examples``; the Beam wrappers are in ``transforms`` and the pipeline in
``pipeline``.
"""
