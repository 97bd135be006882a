"""Named pause points, so a test can stop a process at an exact step (no timing luck).

A test sets ``GEM_PAUSE_AT=<name>[,<name>...]`` and ``GEM_PAUSE_DIR=<dir>`` in a child's
environment; when the child reaches :func:`pause_point` with one of those names, it creates
``<dir>/<name>.reached`` and waits until ``<dir>/<name>.go`` exists. Unset (always, outside
tests), a pause point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["pause_point"]

_BOUND_S = 600.0


def pause_point(name: str) -> None:
    """Stop here while a test holds the pause point ``name`` (see the module docstring)."""
    wanted = os.environ.get("GEM_PAUSE_AT")
    if not wanted or name not in wanted.split(","):
        return
    folder = Path(os.environ["GEM_PAUSE_DIR"])
    (folder / f"{name}.reached").touch()
    deadline = time.monotonic() + _BOUND_S
    while not (folder / f"{name}.go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"pause point {name!r}: no {folder / (name + '.go')} within {_BOUND_S:.0f} s")
        time.sleep(0.01)
