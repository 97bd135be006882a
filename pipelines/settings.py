"""The project's tunable defaults, each defined once with its bounds and checked in one place.

A :class:`Bounded` number or a :class:`Duration` carries the flag that sets it, its default
and what it accepts. The configs (``FeaturesConfig``, ``StreamConfig``,
``BuildHistories``) take their defaults from here and validate with :meth:`Bounded.check`;
the CLI's flags (:mod:`pipelines.cli.flags`) take theirs from here too, so a parser default
and a config default cannot drift apart (``tests/cli/test_defaults.py`` holds them together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipelines.durations import parse_duration
from pipelines.errors import ConfigError

__all__ = [
    "CANDIDATE_TTL",
    "CLICK_WINDOW",
    "CONVERSION_WINDOW",
    "ENCODING_CACHE",
    "ENCODING_MAX_AGE",
    "FALLBACK_MAX_AGE",
    "FLUSH_INTERVAL",
    "MAX_AGE",
    "MAX_FUTURE",
    "MAX_HISTORY",
    "NUM_SHARDS",
    "PAIR_MAX_AGE",
    "PORT",
    "Bounded",
    "Duration",
    "Range",
]


@dataclass(frozen=True)
class Range:
    """A number set by ``flag``, accepted in ``[low, high]`` (finite)."""

    flag: str
    low: int
    high: int

    def check(self, value: float) -> float:
        """``value`` if it lies in the bounds; else :class:`ConfigError` naming the flag and the range."""
        finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or not self.low <= value <= self.high:
            raise ConfigError(self.flag, f"got {value!r}", f"pass a number in {self.low}..{self.high}")
        return value


@dataclass(frozen=True)
class Bounded(Range):
    """A :class:`Range` with the project's default for it."""

    default: int


@dataclass(frozen=True)
class Duration:
    """A duration set by ``flag``, written in the project's one syntax (``default``: ``"30m"``)."""

    flag: str
    default: str

    @property
    def seconds(self) -> float:
        return parse_duration(self.default)

    @property
    def ms(self) -> int:
        return int(self.seconds * 1000)

    def check(self, seconds: float) -> float:
        """``seconds`` if positive and finite; else :class:`ConfigError` naming the flag."""
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
            raise ConfigError(self.flag, f"got {seconds!r} seconds", "pass a positive duration: 90s, 15m, 2h, 7d")
        return seconds


#: Events kept per user history; older ones fold into the summary.
MAX_HISTORY = Bounded("--max-history", 1, 1 << 20, default=4096)
#: User shards: output files per kind, state keys, and the unit of parallelism.
NUM_SHARDS = Bounded("--num-shards", 1, 4096, default=16)
#: A TCP port to serve on (``--metrics-port``; no default: served only when given).
PORT = Range("--metrics-port", 1, 65535)

CLICK_WINDOW = Duration("--click-window", "30m")
CONVERSION_WINDOW = Duration("--conversion-window", "7d")
MAX_FUTURE = Duration("--max-future", "1d")
FLUSH_INTERVAL = Duration("--flush-interval", "1s")
CANDIDATE_TTL = Duration("--candidate-ttl", "1d")
PAIR_MAX_AGE = Duration("--pair-max-age", "1h")
#: Users whose user-side encoding a pairs worker keeps for their next candidate set (0: none), and
#: for how long (:class:`pipelines.model.encoding.EncodingCache`).
ENCODING_CACHE = Bounded("--encoding-cache", 0, 1 << 20, default=1024)
ENCODING_MAX_AGE = Duration("--encoding-max-age", "1m")
#: Staleness bounds of a lookup: an exact pair, then same-user and neighbours' representations.
MAX_AGE = Duration("--max-age", "1h")
FALLBACK_MAX_AGE = Duration("--fallback-max-age", "7d")
