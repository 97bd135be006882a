"""Helpers a backend uses to read its part of a ``--store`` URI (no I/O, no backend imports)."""

from __future__ import annotations

from pipelines.durations import parse_duration
from pipelines.errors import ConfigError

__all__ = ["FLAG", "duration", "positive_number"]

#: The flag every store URI comes from: its errors name it.
FLAG = "--store"


def duration(text: str, name: str, uri: str) -> float:
    """``text`` (``90``, ``90s``, ``250ms``, ``15m``, ``2h``, ``7d``) in seconds, positive; else a
    :class:`ConfigError` naming option ``name`` of ``uri``."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(FLAG, f"{name}={text!r} in {uri!r}", "give a duration like 90s, 15m, 2h, 7d") from exc
    if seconds <= 0:
        raise ConfigError(FLAG, f"{name}={text!r} in {uri!r} is not positive", "give a positive duration")
    return seconds


def positive_number(text: str, name: str, uri: str) -> float:
    """``text`` as a positive float; else a :class:`ConfigError` naming option ``name`` of ``uri``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(FLAG, f"{name}={text!r} in {uri!r}", f"give {name} as a positive number")
    return value
