"""Inspect any Parquet output: layout, counts, distributions, one user's timeline."""
