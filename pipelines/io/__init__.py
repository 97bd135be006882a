"""Shared input/output: Parquet with layout metadata, file discovery, Kafka."""
