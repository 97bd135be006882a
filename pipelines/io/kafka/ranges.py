"""Bounded reads of a topic: positions (offset, time, earliest, latest) and partition ranges.

A replay reads ``[start, stop)`` of each partition. ``--from``/``--to`` take an
integer offset (the same in every partition), an ISO-8601 time (with a
timezone, or a date meaning UTC midnight; resolved per partition with
``offsets_for_times``: the first message whose timestamp is at or after it), or
``earliest`` / ``latest``. ``--to`` is exclusive. :func:`resolve_ranges` turns
positions into :class:`PartitionRange` s using any :class:`OffsetLookup` (a
kafka-python consumer in production, a dict in unit tests); :func:`split_ranges`
cuts big ones so that the read parallelises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol

from pipelines.errors import ConfigError

__all__ = ["OffsetLookup", "PartitionRange", "Position", "resolve_ranges", "split_ranges"]

Kind = Literal["offset", "time", "earliest", "latest"]


@dataclass(frozen=True)
class Position:
    """Where a range starts or stops: an offset, a time in ms since the epoch, or an end of the log."""

    kind: Kind
    value: int = 0

    @classmethod
    def parse(cls, text: str, flag: str) -> Position:
        """``"123"`` (offset), ``"2026-05-01T00:00:00Z"`` / ``"2026-05-01"`` (time), ``earliest``, ``latest``."""
        word = text.strip().lower()
        if word in ("earliest", "beginning"):
            return cls("earliest")
        if word in ("latest", "end"):
            return cls("latest")
        if word.isdigit():
            return cls("offset", int(word))
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            moment = None
        if moment is None or (moment.tzinfo is None and "T" in text.upper()):
            raise ConfigError(
                flag,
                f"{text!r} is neither an offset nor an ISO-8601 time with a timezone",
                "pass an integer offset, earliest, latest, or e.g. 2026-05-01T00:00:00Z",
            )
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return cls("time", int(moment.timestamp() * 1000))


@dataclass(frozen=True, order=True)
class PartitionRange:
    """Offsets ``[start, stop)`` of one partition."""

    topic: str
    partition: int
    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise ValueError(f"bad range [{self.start}, {self.stop}) of {self.topic}/{self.partition}")

    @property
    def size(self) -> int:
        return self.stop - self.start


class OffsetLookup(Protocol):
    """What :func:`resolve_ranges` asks the cluster (kafka-python's KafkaConsumer has these shapes)."""

    def partitions(self, topic: str) -> Sequence[int]: ...

    def bounds(self, topic: str, partitions: Sequence[int]) -> Mapping[int, tuple[int, int]]:
        """Per partition: (log start offset, end offset = next offset to be written)."""
        ...

    def offsets_at(self, topic: str, partitions: Sequence[int], time_ms: int) -> Mapping[int, int | None]:
        """Per partition: first offset with timestamp >= time_ms (None: no such message)."""
        ...


def _offsets(
    position: Position, lookup: OffsetLookup, topic: str, bounds: Mapping[int, tuple[int, int]]
) -> dict[int, int]:
    parts = sorted(bounds)
    if position.kind == "earliest":
        return {p: bounds[p][0] for p in parts}
    if position.kind == "latest":
        return {p: bounds[p][1] for p in parts}
    if position.kind == "offset":
        return {p: min(max(position.value, bounds[p][0]), bounds[p][1]) for p in parts}
    found = lookup.offsets_at(topic, parts, position.value)
    return {p: bounds[p][1] if found.get(p) is None else int(found[p]) for p in parts}  # type: ignore[arg-type]


def resolve_ranges(
    lookup: OffsetLookup, topic: str, start: Position, stop: Position, partitions: Sequence[int] | None = None
) -> list[PartitionRange]:
    """One range per partition (empty ones included, so a summary can show them)."""
    known = sorted(lookup.partitions(topic))
    if not known:
        raise ConfigError(
            "--topic",
            f"topic {topic!r} does not exist or has no partitions",
            "check the name (python -m pipelines produce creates topics)",
        )
    chosen = known if partitions is None else sorted(set(partitions))
    missing = sorted(set(chosen) - set(known))
    if missing:
        raise ConfigError("--partitions", f"{topic!r} has no partition(s) {missing}", f"pick from {known}")
    bounds = lookup.bounds(topic, chosen)
    first = _offsets(start, lookup, topic, bounds)
    last = _offsets(stop, lookup, topic, bounds)
    return [PartitionRange(topic, p, first[p], max(first[p], last[p])) for p in chosen]


def split_ranges(ranges: Sequence[PartitionRange], max_messages: int) -> list[PartitionRange]:
    """Ranges cut into pieces of at most ``max_messages`` offsets; empty ranges dropped."""
    if max_messages < 1:
        raise ValueError(f"max_messages must be >= 1, got {max_messages}")
    pieces = []
    for r in ranges:
        for lo in range(r.start, r.stop, max_messages):
            pieces.append(PartitionRange(r.topic, r.partition, lo, min(lo + max_messages, r.stop)))
    return pieces
