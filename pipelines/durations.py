"""Time units in milliseconds and the one duration syntax every flag and URI takes.

Durations are written ``90s``, ``15m``, ``2h``, ``7d`` (also ``500ms``, and a bare
number, read as seconds); :func:`parse_duration` gives seconds.
"""

from __future__ import annotations

import re

__all__ = ["DAY_MS", "HOUR_MS", "MINUTE_MS", "SECOND_MS", "format_duration", "parse_duration"]

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``90s``, ``15m``, ``2h``, ``7d``, ``500ms`` or a bare number of seconds).

    Raises :class:`ValueError` naming the accepted forms.
    """
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration; write e.g. 90s, 15m, 2h or 7d")
    return float(match.group(1)) * _UNITS_S[match.group(2) or "s"]


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in the same syntax (``86400`` → ``1d``)."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _UNITS_S[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{round(seconds * 1000)}ms"
