"""``summary.json``: a run's counters, summed, and the balance they must keep.

Count dicts travel through a pipeline as plain ``{name: int}``; keys starting
with ``max.`` take the maximum instead of the sum. :class:`Balance` states the
record balance of a stage (records in = out + duplicates + dead letters, for
example) and refuses a summary that breaks it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from apache_beam.io.filesystems import FileSystems

from pipelines.errors import PipelinesError
from pipelines.io.files import join
from pipelines.redact import redact_fields

__all__ = ["SUMMARY", "Balance", "read_summary", "sum_counts", "write_summary"]

SUMMARY = "summary.json"


def sum_counts(dicts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Sum count dicts; keys starting with ``max.`` take the maximum instead."""
    total: Counter[str] = Counter()
    for d in dicts:
        for key, value in d.items():
            total[key] = max(total[key], value) if key.startswith("max.") else total[key] + value
    return dict(total)


def read_summary(directory: str) -> dict:
    """The ``summary.json`` a pipeline wrote into ``directory``."""
    with FileSystems.open(join(directory, SUMMARY)) as f:
        return dict(json.loads(f.read()))


def write_summary(directory: str, summary: Mapping[str, object]) -> None:
    """Write ``summary.json``; every string in it passes :func:`pipelines.redact.redact` (no password)."""
    with FileSystems.create(join(directory, SUMMARY)) as f:
        f.write(json.dumps(redact_fields(summary), indent=2).encode())


@dataclass(frozen=True)
class Balance:
    """``summary[total] == sum(summary[p] for p in parts)``, unless ``summary[unless]`` is non-zero."""

    name: str
    total: str
    parts: Sequence[str]
    unless: str | None = None

    def check(self, summary: Mapping[str, object]) -> None:
        if self.unless and summary.get(self.unless, 0):
            return
        accounted = sum(int(summary.get(p, 0)) for p in self.parts)  # type: ignore[call-overload]
        total = summary.get(self.total, 0)
        if accounted != total:
            raise PipelinesError(f"{self.name} balance broken: {total} in, {accounted} accounted")
